"""The engine's timeline while an online trace replays, from vLLM's stat-logger interface.

vLLM's front end (``AsyncLLM``'s output handler: this process, the engine's event loop)
calls each stat logger's ``record`` about once per engine step, with the scheduler's stats
(``SchedulerStats``: KV cache usage, running and waiting requests, requests per adapter)
and the step's (``IterationStats``: preemptions, prompt and generated tokens). A logger
passed as ``AsyncLLM.from_engine_args(stat_loggers=[factory])`` is added to vLLM's own (the
log line and Prometheus, on anyway since lorabench sets ``disable_log_stats=False``); it
only reads the stats objects, so this process never touches a device.

vLLM calls the interface unstable. When it is missing or has changed, the engine is built
without the logger, the replay runs with no timeline, and the reason is kept to be said.
An exception inside ``record`` would fail every request in flight (vLLM's output handler
propagates it), so a stats object that no longer reads as expected stops the recording instead.

Only a replay records (``start`` / ``stop`` around it), so batch cases pay one test a step.
Steps less than ``BUCKET_S`` after a record's first step are merged into it, so a fast
engine gives at most 20 records a second. ``LORABENCH_TIMELINE=off`` builds engines
without the logger: what a run alternated with and without recording compares.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

from lorabench.results.records import TIMELINE_FIELDS, TimelineRecord
from lorabench.results.stats import percentile
from lorabench.targets.clock import now

SWITCH = "LORABENCH_TIMELINE"
BUCKET_S = 0.05
OFF = f"recording is off ({SWITCH}=off)"
NO_STEPS = "the engine reported no step after the warm-up"
# Where a record's fields sit in its working list, in TimelineRecord's order: t_s, steps, the
# state (the most over its steps, as ``_state`` reads it), then the counts (summed, ``_counts``).
STATE = slice(TIMELINE_FIELDS.index("kv_usage"), TIMELINE_FIELDS.index("preemptions"))
COUNTS = slice(TIMELINE_FIELDS.index("preemptions"), len(TIMELINE_FIELDS))
IDLE = (0.0, 0, 0, 0, 0)


def recording_on() -> bool:
    """Yes unless LORABENCH_TIMELINE is off (or 0, false, no)."""
    return os.environ.get(SWITCH, "on").strip().lower() not in ("off", "0", "false", "no")


class InterfaceChanged(Exception):
    """vLLM's stat-logger interface is not the one lorabench reads."""


class Recorder:
    """One engine's timeline: records while a replay runs, on the clock the replay times with.

    ``why_none`` says why there is no timeline (recording off, an interface this vLLM lacks
    or changed); ``rows`` holds the last replay's records.
    """

    # A record's counts are its steps', from its t_s on (an HTTP scrape's end at its t_s).
    counts_until_t = False

    def __init__(self, clock: Callable[[], float] = now) -> None:
        self.clock = clock
        self.why_none: str | None = None
        self.rows: list[TimelineRecord] = []
        self._t0: float | None = None
        self._open: list[Any] | None = None
        self._last_state: tuple[float, int, int, int, int] = IDLE
        # The engine's front end (vLLM's AsyncLLM, or the stand-in): its requests' states.
        self.front_end: Any = None

    def watch(self, front_end: Any) -> None:
        """Read which requests still await their first output from ``front_end`` (``watch``
        is called once the engine is built)."""
        self.front_end = front_end

    def factories(self, logger_class: type | None = None) -> list[Callable[..., Any]]:
        """What an engine is built with: a factory that vLLM (or the stand-in) calls as
        ``factory(vllm_config, engine_index)``, or none when recording is off."""
        if not recording_on():
            self.why_none = OFF
            return []
        cls = logger_class or StepLogger
        return [lambda vllm_config, engine_index=0: cls(self, engine_index)]

    def vllm_kwargs(self, async_llm: type) -> dict[str, Any]:
        """``AsyncLLM.from_engine_args``'s ``stat_loggers`` argument when this vLLM has the
        interface lorabench reads; nothing otherwise, with the reason kept."""
        if not recording_on():
            self.why_none = OFF
            return {}
        try:
            cls = _vllm_logger_class(async_llm)
        except InterfaceChanged as exc:
            self.why_none = str(exc)
            return {}
        return {"stat_loggers": self.factories(cls)}

    @property
    def recording(self) -> bool:
        return self._t0 is not None

    def start(self, t0: float) -> None:
        """Record from now on, times in seconds since ``t0`` (on ``clock``)."""
        self.rows, self._open, self._last_state = [], None, IDLE
        if self.why_none is None:
            self._t0 = t0

    async def flush(self) -> None:
        """Nothing to do: every step was recorded as it happened."""

    def stop(self) -> list[TimelineRecord]:
        """Stop recording; the replay's records."""
        self._close()
        self._t0 = None
        return self.rows

    def step(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        """One engine step: its state and counts, merged into the open record or starting one."""
        now = self.clock() - self._t0
        if scheduler_stats is not None:
            self._last_state = _state(scheduler_stats, self.front_end)
        counts = (*(_counts(iteration_stats) if iteration_stats is not None else (0, 0, 0)), *_prefix(scheduler_stats))
        record = self._open
        if record is not None and now - record[0] < BUCKET_S:
            record[1] += 1
            record[STATE] = [max(a, b) for a, b in zip(record[STATE], self._last_state)]
            record[COUNTS] = [a + b for a, b in zip(record[COUNTS], counts)]
            return
        self._close()
        self._open = [now, 1, *self._last_state, *counts]

    def fail(self, exc: BaseException) -> None:
        """Stop for good: the stats no longer read as lorabench expects."""
        self.why_none = f"vLLM's stats changed ({type(exc).__name__}: {exc}); no timeline recorded"
        self._t0, self._open, self.rows = None, None, []

    def _close(self) -> None:
        if self._open is not None and self._t0 is not None:
            self.rows.append(TimelineRecord(**dict(zip(TIMELINE_FIELDS, self._open))))
        self._open = None


def _state(stats: Any, front_end: Any) -> tuple[float, int, int, int, int]:
    """What a step's ``SchedulerStats`` says, in ``TimelineRecord``'s order of the state fields.
    Waiting requests are the scheduler's and those it deferred for a LoRA slot: vLLM 0.32 counts
    the deferred apart (``num_skipped_waiting_reqs``; its ``/metrics`` adds them). The adapters
    waiting are read from the front end, whose own adapter counts never have one waiting."""
    return (
        float(stats.kv_cache_usage),
        int(stats.num_running_reqs),
        int(stats.num_waiting_reqs) + int(getattr(stats, "num_skipped_waiting_reqs", 0)),
        sum(1 for n in stats.running_lora_adapters.values() if n),
        adapters_awaiting(front_end.output_processor.request_states.values()),
    )


def adapters_awaiting(requests: Any) -> int:
    """Distinct adapters with a request that has had no output yet: waiting to be scheduled (or
    in a prefill that lasts steps), as vLLM's front end holds its requests' states (``RequestState``:
    ``lora_name``, ``is_prefilling`` until the first output)."""
    return len({r.lora_name for r in requests if r.is_prefilling and r.lora_name})


def _counts(stats: Any) -> tuple[int, int, int]:
    """What a step's ``IterationStats`` counts: preemptions, prompt tokens, generated tokens."""
    return int(stats.num_preempted_reqs), int(stats.num_prompt_tokens), int(stats.num_generation_tokens)


def _prefix(stats: Any) -> tuple[int, int]:
    """What a step's ``SchedulerStats.prefix_cache_stats`` counts: prompt tokens queried, found."""
    cache = getattr(stats, "prefix_cache_stats", None)
    return (int(cache.queries), int(cache.hits)) if cache is not None else (0, 0)


class StepLogger:
    """A stat logger that hands engine 0's steps to a ``Recorder`` while it records. vLLM's
    loggers subclass its ``StatLoggerBase`` (``_vllm_logger_class``); the stand-in takes this one."""

    def __init__(self, recorder: Recorder, engine_index: int = 0) -> None:
        self.recorder, self.engine_index = recorder, engine_index

    def record(self, scheduler_stats: Any = None, iteration_stats: Any = None, *args: Any, **kwargs: Any) -> None:
        if not self.recorder.recording or self.engine_index != 0:
            return
        try:
            self.recorder.step(scheduler_stats, iteration_stats)
        except Exception as exc:  # never into vLLM's output handler: it would fail every request
            self.recorder.fail(exc)

    def log_engine_initialized(self) -> None:
        """Nothing to say: vLLM's own loggers report the engine."""

    def log(self) -> None:
        """Nothing to print: the timeline goes to its file."""


def _vllm_logger_class(async_llm: type) -> type:
    """``StepLogger`` as a subclass of this vLLM's ``StatLoggerBase``, or ``InterfaceChanged``."""
    if "stat_loggers" not in inspect.signature(async_llm.from_engine_args).parameters:
        raise InterfaceChanged("this vLLM's AsyncLLM.from_engine_args takes no stat_loggers; no timeline recorded")
    try:
        from vllm.v1.metrics.loggers import StatLoggerBase
    except ImportError as exc:
        raise InterfaceChanged(f"this vLLM has no stat-logger interface ({exc}); no timeline recorded") from exc
    cls = type("TimelineStatLogger", (StepLogger, StatLoggerBase), {})
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise InterfaceChanged(f"this vLLM's StatLoggerBase asks for {missing}, unknown to lorabench; no timeline")
    return cls


def counted_after(rows: Sequence[TimelineRecord], warmup_s: float, counts_until_t: bool) -> list[TimelineRecord]:
    """The records whose counts (preemptions, prefix queries) all come from ``warmup_s`` on. A
    record whose counts run up to its t_s (an HTTP scrape's) counts from the one before it,
    so the scrape that straddles the warm-up's end is left out."""
    starts = [rows[i - 1].t_s if i else 0.0 for i in range(len(rows))] if counts_until_t else [r.t_s for r in rows]
    return [r for r, start in zip(rows, starts) if start >= warmup_s]


def summarize(rows: Sequence[TimelineRecord], warmup_s: float, counts_until_t: bool) -> dict[str, float | int]:
    """The online row's timeline columns, over the records from ``warmup_s`` on (as every
    online statistic leaves the warm-up out), the counts as ``counted_after`` keeps them;
    empty when there are none."""
    kept = [r for r in rows if r.t_s >= warmup_s]
    if not kept:
        return {}
    return {
        "kv_usage_max": max(r.kv_usage for r in kept),
        "waiting_p99": percentile([float(r.waiting) for r in kept], 99),
        "preemptions": sum(r.preemptions for r in counted_after(rows, warmup_s, counts_until_t)),
        "adapters_waiting_max": max(r.adapters_waiting for r in kept),
    }


def prefix_hit_rate(rows: Sequence[TimelineRecord], warmup_s: float, counts_until_t: bool) -> float | None:
    """The engine's own prefix hit rate over what it counted from ``warmup_s`` on: prompt tokens
    found cached over those queried (vLLM's counters); None where it counted no query."""
    kept = counted_after(rows, warmup_s, counts_until_t)
    queries = sum(r.prefix_queries for r in kept)
    return sum(r.prefix_hits for r in kept) / queries if queries else None
