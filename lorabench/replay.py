"""Replay a trace against vLLM's async engine, each request sent at its arrival time.

Requests are sent on schedule whether or not earlier ones have finished (an open
loop, as real traffic arrives); each carries a synthetic prompt of exactly its input
length and generates exactly its output length (``ignore_eos``). Times are taken on
this process's monotonic clock as tokens arrive, so they include everything a client
of the engine would see. How late each request was sent against its schedule is
measured too: a replay is only as good as its send lag, so each send does the same small
work however long the trace: its prompt is made just before it is sent, not all prompts up
front (a long real trace's prompts would not fit in memory), and only the requests in
flight keep a task. What delayed sends was the loop being blocked (scripts/bench_replay.py):
the collector's full passes over the whole heap, and a new task's first step queued behind
every stream's tokens; ``_frozen_heap`` and ``serve`` say what is done about each.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from lorabench import clock
from lorabench.adapters import Adapter
from lorabench.records import AdapterRecord, Sample
from lorabench.stats import percentile, summary
from lorabench.trace import TraceRequest
from lorabench.workload import synthetic_prompt

if TYPE_CHECKING:
    from lorabench.engine import Engine
    from lorabench.timeline import Recorder


@dataclass
class ReplayedRequest:
    index: int
    adapter: str
    input_len: int
    output_len: int
    scheduled_s: float  # arrival time in the trace
    sent_s: float = float("nan")  # when it was sent, since the replay started
    token_times: list[float] = field(default_factory=list)
    finished: bool = False
    queue_ms: float = float("nan")  # from the engine's own timestamps, where it reports them

    @property
    def send_lag_ms(self) -> float:
        return (self.sent_s - self.scheduled_s) * 1000.0

    @property
    def ttft_ms(self) -> float:
        return (self.token_times[0] - self.sent_s) * 1000.0 if self.token_times else float("nan")

    @property
    def tpot_ms(self) -> float:
        """Time per output token after the first."""
        if len(self.token_times) < 2:
            return float("nan")
        return (self.token_times[-1] - self.token_times[0]) * 1000.0 / (len(self.token_times) - 1)

    @property
    def itl_ms(self) -> list[float]:
        """Gaps between consecutive tokens (tokens that arrive together have a gap of 0)."""
        return (np.diff(self.token_times) * 1000.0).tolist()

    @property
    def e2e_ms(self) -> float:
        return (self.token_times[-1] - self.sent_s) * 1000.0 if self.finished else float("nan")


# How long before a send's time the replay stops sleeping and starts yielding to the loop.
EARLY_WAKE_S = 0.001


async def replay(
    engine: Engine,
    requests: Sequence[TraceRequest],
    adapters: Mapping[str, Adapter],
    *,
    seed: int = 0,
    drain_timeout_s: float = 60.0,
    progress: Callable[[int, int, float | None], None] | None = None,
    timeline: Recorder | None = None,
) -> list[ReplayedRequest]:
    """Send ``requests`` to ``engine`` on schedule, each with the adapter its trace names.

    ``progress(sent, finished, elapsed_s)`` is called after each send, outside the timings,
    and with ``elapsed_s=None`` once everything is sent. ``timeline`` records the engine's
    steps from the first send until the last request is done, on the replay's clock.

    After the last arrival, requests still running get ``drain_timeout_s`` to finish;
    the rest are aborted and reported unfinished.
    """
    vocab_size = engine.vocab_size
    records = [ReplayedRequest(i, r.adapter, r.input_len, r.output_len, r.arrival_s) for i, r in enumerate(requests)]
    finished = 0
    # Asked before the clock starts: the answer walks every frozen object (18 ms for 200,000).
    freeze = not gc.get_freeze_count() and gc.isenabled()
    # A virtual clock's timers fire exactly when due (lorabench.testing.virtual_clock): no early wake.
    early_wake_s = 0.0 if getattr(asyncio.get_running_loop(), "virtual", False) else EARLY_WAKE_S
    start = clock.now()

    async def serve(record: ReplayedRequest) -> None:
        """Started just before the request is due: its prompt is made, then it waits its
        time in its own task, so the send is the first thing it does once due, not a new
        task's first step queued behind every other stream's tokens."""
        nonlocal finished
        prompt = synthetic_prompt(record.index, record.input_len, vocab_size, seed)
        params = engine.sampling_params(record.output_len, stream=True)
        due = start + record.scheduled_s
        while early_wake_s and clock.now() < due:
            await asyncio.sleep(0)
        record.sent_s = clock.now() - start
        async for out in engine.stream(prompt, params, adapters[record.adapter]):
            now = clock.now() - start
            record.token_times.extend([now] * len(out.outputs[0].token_ids))
            if out.finished:
                record.finished = True
                finished += 1
                metrics = getattr(out, "metrics", None)
                if metrics is not None and getattr(metrics, "scheduled_ts", 0):
                    record.queue_ms = (metrics.scheduled_ts - metrics.queued_ts) * 1000.0

    if timeline is not None:
        timeline.start(start)
    in_flight = _InFlight()
    try:
        with _frozen_heap(freeze):
            for sent, record in enumerate(records, 1):
                # The event loop's timers wake up to a millisecond late: sleep to just before the
                # send, and hand the request to its task, which yields to the loop until it is due.
                wait = start + record.scheduled_s - early_wake_s - clock.now()
                if wait > 0:
                    await asyncio.sleep(wait)
                in_flight.add(asyncio.create_task(serve(record)))
                if progress is not None:
                    progress(sent, finished, clock.now() - start)
            if progress is not None and records:
                progress(len(records), finished, None)
            await in_flight.drain(drain_timeout_s)
    finally:
        if timeline is not None:
            timeline.stop()
    return records


class _InFlight:
    """The requests' tasks still running, and the errors they raised: a finished request's
    task is let go, so a long trace does not hold every task, coroutine and context to its end."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()
        self.errors: list[BaseException] = []

    def add(self, task: asyncio.Task) -> None:
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(task.exception())

    async def drain(self, timeout_s: float) -> None:
        """Wait for the requests still running; abort those past the timeout (so they are
        reported unfinished rather than holding the engine), and raise the first real error."""
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()  # vLLM aborts a request whose stream is cancelled
            await asyncio.gather(*pending, return_exceptions=True)
        if self.errors:
            raise self.errors[0]


@contextmanager
def _frozen_heap(freeze: bool) -> Iterator[None]:
    """Keep the collector's full passes off the heap that was there before the replay: a full
    pass walks every tracked object (a real engine's client holds vLLM's and torch's, besides
    the trace and its records), holding every send due meanwhile for 100 ms and more. Undone
    after, so garbage among them is still collected. ``freeze`` is False when something else
    froze the heap already (unfreezing would undo that too) or turned the collector off: then
    it is left alone."""
    if not freeze:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all values are equal, 1/n when one takes everything."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0 or not np.any(arr):
        return float("nan")
    return float(arr.sum() ** 2 / (arr.size * np.square(arr).sum()))


def _meets_slo(r: ReplayedRequest, slo_ttft_ms: float, slo_tpot_ms: float) -> bool:
    """Finished, with its TTFT and TPOT (when it has one) within the targets."""
    return r.finished and r.ttft_ms <= slo_ttft_ms and (np.isnan(r.tpot_ms) or r.tpot_ms <= slo_tpot_ms)


def adapter_usage(
    records: Sequence[ReplayedRequest], *, slo_ttft_ms: float, slo_tpot_ms: float, warmup_s: float
) -> list[AdapterRecord]:
    """What each adapter got of the replay, over the requests that arrived after ``warmup_s``:
    requests, tokens, latency over its finished requests, and SLO attainment (unfinished
    requests count against it). A starved adapter shows here, whatever the averages say."""
    by_adapter: dict[str, list[ReplayedRequest]] = {}
    for r in records:
        if r.scheduled_s >= warmup_s:
            by_adapter.setdefault(r.adapter, []).append(r)
    usage = []
    for adapter in sorted(by_adapter):
        mine = by_adapter[adapter]
        done = [r for r in mine if r.finished]
        ttfts = [r.ttft_ms for r in done]
        usage.append(
            AdapterRecord(
                adapter=adapter,
                requests=len(mine),
                finished=len(done),
                prompt_tokens=sum(r.input_len for r in mine),
                output_tokens=sum(len(r.token_times) for r in mine),
                ttft_ms=float(np.mean(ttfts)) if ttfts else float("nan"),
                ttft_ms_p50=percentile(ttfts, 50),
                ttft_ms_p99=percentile(ttfts, 99),
                decode_ms_p50=percentile([r.tpot_ms for r in done], 50),
                slo_attainment=sum(_meets_slo(r, slo_ttft_ms, slo_tpot_ms) for r in mine) / len(mine),
            )
        )
    return usage


def summarize_online(
    records: Sequence[ReplayedRequest], *, slo_ttft_ms: float, slo_tpot_ms: float, warmup_s: float
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Aggregates over the requests that arrived after ``warmup_s``, and a per-adapter breakdown
    (from ``adapter_usage``: its requests, attainment and mean TTFT).

    Requests of the warm-up count nowhere: not in ``num_requests``, ``unfinished`` or the
    send lag either. A request meets the SLO when it finished, its TTFT is within ``slo_ttft_ms`` and its
    TPOT within ``slo_tpot_ms``; unfinished requests count against attainment.
    """
    measured = [r for r in records if r.scheduled_s >= warmup_s]
    done = [r for r in measured if r.finished]
    met = sum(_meets_slo(r, slo_ttft_ms, slo_tpot_ms) for r in done)
    span = (max(r.token_times[-1] for r in done) - min(r.sent_s for r in measured)) if done else float("nan")
    metrics: dict[str, float] = {
        "num_requests": len(measured),
        "unfinished": sum(not r.finished for r in measured),
        "request_throughput": len(done) / span if done else 0.0,
        "output_tokens_per_s": sum(len(r.token_times) for r in done) / span if done else 0.0,
        "slo_ttft_ms": slo_ttft_ms,
        "slo_tpot_ms": slo_tpot_ms,
        "slo_attainment": met / len(measured) if measured else float("nan"),
        "goodput_rps": met / span if done else 0.0,
    }
    metrics.update(summary("ttft_ms", [r.ttft_ms for r in done]))
    metrics.update(summary("decode_ms", [r.tpot_ms for r in done]))
    metrics.update(summary("request_e2e_ms", [r.e2e_ms for r in done]))
    metrics.update(summary("queue_ms", [r.queue_ms for r in done]))
    itl = [gap for r in done for gap in r.itl_ms]
    lags = [r.send_lag_ms for r in measured]
    for name, values in (("itl_ms", itl), ("send_lag_ms", lags)):
        metrics.update({f"{name}_p{p}": percentile(values, p) for p in (50, 99)})
    usage = adapter_usage(measured, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, warmup_s=warmup_s)
    per_adapter = [
        {"adapter": a.adapter, "requests": a.requests, "slo_attainment": a.slo_attainment, "ttft_ms": a.ttft_ms}
        for a in usage
    ]
    metrics["fairness"] = jain_index([a.slo_attainment for a in usage])
    return metrics, per_adapter


def samples(records: Sequence[ReplayedRequest], ranks: Mapping[str, int | None]) -> list[Sample]:
    """Every replayed request, finished or not, as a sample row."""
    return [
        Sample(
            round=0,
            request=r.index,
            adapter=r.adapter,
            adapter_rank=ranks.get(r.adapter),
            prompt_tokens=r.input_len,
            output_tokens=len(r.token_times),
            queue_ms=r.queue_ms,
            ttft_ms=r.ttft_ms,
            decode_ms=r.tpot_ms,
            request_e2e_ms=r.e2e_ms,
            arrival_s=r.scheduled_s,
            send_lag_ms=r.send_lag_ms,
            finished=r.finished,
        )
        for r in records
    ]
