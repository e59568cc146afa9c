"""Replay a trace against vLLM's async engine, each request sent at its arrival time.

Requests are sent on schedule whether or not earlier ones have finished (an open
loop, as real traffic arrives); each carries a synthetic prompt of exactly its input
length and generates exactly its output length (``ignore_eos``). Times are taken on
this process's monotonic clock as tokens arrive, so they include everything a client
of the engine would see; latencies run from each request's scheduled arrival, so a send
that came late counts in them, as a user's wait would (``docs/metrics.md``). How late each
request was sent against its schedule is measured too: a replay is only as good as its
send lag, so each send does the same small work however long the trace: its prompt is
made just before it is sent, not all prompts up front (a long real trace's prompts would
not fit in memory), and only the requests in flight keep a task. What delayed sends was
the loop being blocked (scripts/bench_replay.py): the collector's full passes over the
whole heap, and a new task's first step queued behind every stream's tokens;
``_frozen_heap`` and ``serve`` say what is done about each.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from lorabench.load.adapters import Adapter
from lorabench.load.traces import prefixes
from lorabench.load.traces.synthetic import TraceRequest
from lorabench.load.workload import synthetic_prompt
from lorabench.measure.replay_tasks import InFlight, Stop, until_stopped
from lorabench.targets import clock

if TYPE_CHECKING:
    from lorabench.targets.engine import Engine
    from lorabench.targets.timeline import Recorder


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
    # Its stream ended unfinished on its own (an HTTP error status, a broken stream): the
    # engine failed it; an unfinished request that was not failed was aborted at the drain.
    failed: bool = False
    # Of its prompt, found in the prefix cache (vLLM's num_cached_tokens; over HTTP the usage's
    # prompt_tokens_details, which `vllm serve --enable-prompt-tokens-details` sends); None untold.
    cached_tokens: int | None = None
    # What the trace's hash ids predict it finds cached (``prefixes.predict``); None without ids.
    predicted_cached: int | None = None

    @property
    def send_lag_ms(self) -> float:
        return (self.sent_s - self.scheduled_s) * 1000.0

    @property
    def ttft_ms(self) -> float:
        """Scheduled arrival -> first token: a late send's lag counts, as the user's wait."""
        return (self.token_times[0] - self.scheduled_s) * 1000.0 if self.token_times else float("nan")

    @property
    def ttft_from_send_ms(self) -> float:
        """Send -> first token: what the engine took, the client's lag left out."""
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
        """Scheduled arrival -> last token, of a finished request."""
        return (self.token_times[-1] - self.scheduled_s) * 1000.0 if self.finished else float("nan")


# A request is given this many times its whole SLO budget (TTFT plus a TPOT per output token)
# to finish before the replay aborts it (``drain_s``; docs/capacity.md#the-drain).
DRAIN_MARGIN = 2.0


def drain_s(requests: Sequence[TraceRequest], floor_s: float, slo_ttft_ms: float, slo_tpot_ms: float) -> float:
    """How long after the last arrival a replay waits before aborting what still runs: each
    request gets ``max(floor_s, DRAIN_MARGIN × (slo_ttft + output_len × slo_tpot))`` from its
    own arrival, so a long output is never cut short by a bound it could not meet unloaded."""
    if not requests:
        return floor_s
    need = (DRAIN_MARGIN * (slo_ttft_ms + r.output_len * slo_tpot_ms) / 1000.0 for r in requests)
    ends = (r.arrival_s + max(floor_s, s) for r, s in zip(requests, need))
    return max(ends) - max(r.arrival_s for r in requests)


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
    stop: Stop | None = None,
) -> list[ReplayedRequest]:
    """Send ``requests`` to ``engine`` on schedule, each with the adapter its trace names.

    ``progress(sent, finished, elapsed_s)`` is called after each send, outside the timings,
    and with ``elapsed_s=None`` once everything is sent. ``timeline`` records the engine's
    steps from the first send until the last request is done, on the replay's clock.

    After the last arrival, requests still running get ``drain_timeout_s`` to finish
    (``drain_s`` says how long a replay judged against SLOs should give them); the rest
    are aborted and reported unfinished. A stream the engine ends unfinished (HTTP targets)
    is reported failed. ``stop`` may end the replay sooner (``replay_tasks.Stop``): then what
    runs is aborted as at the drain's end, and only the requests sent are returned.
    """
    records = _records(engine, requests)
    # With prefix caching on, each replay's requests are salted apart from everything cached
    # before (an earlier replay of the same trace on this build would warm this one's cache).
    salt = engine.cold_salt()
    # Asked before the clock starts: the answer walks every frozen object (18 ms for 200,000).
    freeze = not gc.get_freeze_count() and gc.isenabled()
    # A virtual clock's timers fire exactly when due (lorabench.targets.standin.virtual_clock): no early wake.
    early_wake_s = 0.0 if getattr(asyncio.get_running_loop(), "virtual", False) else EARLY_WAKE_S
    start = clock.now()
    sender = _Sender(engine, adapters, seed, start, early_wake_s, requests, salt)
    if timeline is not None:
        timeline.start(start)
    in_flight = InFlight()
    try:
        with _frozen_heap(freeze):
            work = _send(records, sender, in_flight, progress, drain_timeout_s)
            await until_stopped(work, stop, records, start, in_flight)
        if timeline is not None:
            await timeline.flush()
    finally:
        if timeline is not None:
            timeline.stop()
    if stop is not None and stop.at_s is not None:
        return [r for r in records if r.sent_s == r.sent_s]  # the unsent's sent_s is still NaN
    return records


async def _send(
    records: Sequence[ReplayedRequest],
    sender: _Sender,
    in_flight: InFlight,
    progress: Callable[[int, int, float | None], None] | None,
    drain_timeout_s: float,
) -> None:
    """Each request sent when due, then the drain."""
    start, early_wake_s = sender.start, sender.early_wake_s
    for sent, record in enumerate(records, 1):
        # The event loop's timers wake up to a millisecond late: sleep to just before the
        # send, and hand the request to its task, which yields to the loop until it is due.
        wait = start + record.scheduled_s - early_wake_s - clock.now()
        if wait > 0:
            await asyncio.sleep(wait)
        in_flight.add(asyncio.create_task(sender.serve(record)))
        if progress is not None:
            progress(sent, sender.finished, clock.now() - start)
    if progress is not None and records:
        progress(len(records), sender.finished, None)
    await in_flight.drain(drain_timeout_s)


def _records(engine: Engine, requests: Sequence[TraceRequest]) -> list[ReplayedRequest]:
    """A record per request, with what its trace's hash ids predict it finds cached where it
    has them and the engine says its block size."""
    records = [ReplayedRequest(i, r.adapter, r.input_len, r.output_len, r.arrival_s) for i, r in enumerate(requests)]
    if requests and requests[0].block_tokens and engine.block_size:
        for record, hits in zip(records, prefixes.predict_requests(requests, engine.block_size)):
            record.predicted_cached = hits
    return records


class _Sender:
    """Sends one replayed request when it is due and stamps its tokens as they arrive."""

    def __init__(
        self,
        engine: Engine,
        adapters: Mapping[str, Adapter],
        seed: int,
        start: float,
        early_wake_s: float,
        requests: Sequence[TraceRequest],
        salt: str | None,
    ) -> None:
        self.engine, self.adapters, self.seed = engine, adapters, seed
        self.start, self.early_wake_s = start, early_wake_s
        self.requests, self.salt = requests, salt
        self.vocab_size = engine.vocab_size
        self.finished = 0

    def prompt(self, record: ReplayedRequest) -> list[int]:
        """Its own synthetic tokens; a trace's hash ids make its leading blocks shared
        (``lorabench.load.traces.prefixes``)."""
        own = synthetic_prompt(record.index, record.input_len, self.vocab_size, self.seed)
        request = self.requests[record.index]
        if not request.hash_ids:
            return own
        return prefixes.prompt(request.hash_ids, request.block_tokens, own, self.vocab_size, self.seed)

    async def serve(self, record: ReplayedRequest) -> None:
        """Started just before the request is due: its prompt is made, then it waits its
        time in its own task, so the send is the first thing it does once due, not a new
        task's first step queued behind every other stream's tokens."""
        engine, start = self.engine, self.start
        prompt = self.prompt(record)
        params = engine.sampling_params(record.output_len, stream=True)
        due = start + record.scheduled_s
        while self.early_wake_s and clock.now() < due:
            await asyncio.sleep(0)
        record.sent_s = clock.now() - start
        async for out in engine.stream(prompt, params, self.adapters[record.adapter], self.salt):
            # Over HTTP, when the tokens' bytes arrived, before the client parsed them.
            received = getattr(out, "received_at", None)
            now = (clock.now() if received is None else received) - start
            record.token_times.extend([now] * len(out.outputs[0].token_ids))
            if out.finished:
                record.finished = True
                record.cached_tokens = getattr(out, "num_cached_tokens", None)
                self.finished += 1
                metrics = getattr(out, "metrics", None)
                if metrics is not None and getattr(metrics, "scheduled_ts", 0):
                    record.queue_ms = (metrics.scheduled_ts - metrics.queued_ts) * 1000.0
        # A stream cancelled at the drain never gets here; one that ended unfinished was failed.
        record.failed = not record.finished


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
