"""One capacity search (``lorabench.scenarios.capacity``): the trace shape it searches, and
its probes on one engine: the closed-loop estimate the search starts from, each probe's
replay once the engine is idle, its summary and samples, each kept on disk as it
finishes, and the row the search makes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from lorabench.config.online_cases import ImportedCase, OnlineCase
from lorabench.config.target import INPROCESS
from lorabench.load.traces import prefixes, transforms
from lorabench.measure import capacity, probe_stop, replay, replay_summary
from lorabench.measure.closed_loop import closed_loop
from lorabench.results.files import SAMPLES
from lorabench.results.records import ProbeRecord
from lorabench.scenarios.base import Context, Outcome
from lorabench.targets import timeline
from lorabench.targets.failures import EngineDied, is_engine_dead

if TYPE_CHECKING:
    from pathlib import Path

    from lorabench.config.trace_sections import Capacity as CapacityBlock
    from lorabench.load.adapters import Adapter
    from lorabench.load.traces.synthetic import TraceRequest
    from lorabench.targets.engine import Engine


@dataclass(frozen=True)
class CapacityCase:
    """One trace shape to search: its rate is what the search varies."""

    shape: OnlineCase | ImportedCase

    @property
    def id(self) -> str:
        return self.shape.shape_id

    def located(self, config_dir: Path) -> CapacityCase:
        return CapacityCase(self.shape.located(config_dir))

    def available(self) -> float:
        """The requests a probe may replay: an imported trace's from its start on; no end to a synthetic shape's."""
        if not isinstance(self.shape, ImportedCase):
            return math.inf
        return float(len(transforms.from_start(self.shape.data, self.shape.start)))

    def max_rate(self, block: CapacityBlock) -> float | None:
        """The highest rate to probe: the config's, and for an imported trace the rate at
        which a probe would use up the requests it has from its start."""
        if not isinstance(self.shape, ImportedCase):
            return block.max_rate
        return min(self.available() / block.probe_duration_s, block.max_rate or math.inf)


# What the probes file keeps of a probe's summary and of its timeline.
PROBE_METRICS = ("goodput_rps", "ttft_ms_p99", "decode_ms_p99", "ttft_from_send_ms_p99") + tuple(
    f"send_lag_ms_{s}" for s in ("p50", "p99", "max")
)
PROBE_STEPS = ("kv_usage_max", "preemptions", "adapters_waiting_max")
# Blank where the engine or the trace cannot say (replay_summary.hit_rates).
PROBE_HIT_RATES = ("prefix_hit_rate", "prefix_hit_rate_predicted")
# The longest a probe waits for the last one's aborted requests to leave the engine: a step
# takes well under a second; an engine still busy then is recorded (busy_at_start), not waited on.
IDLE_TIMEOUT_S = 10.0


class SearchFailed(RuntimeError):
    """A search that failed midway for another reason than its engine's death."""


class Prober:
    """One search's probes on one engine: each a replay, its summary and its samples. Each
    probe is kept on disk as it finishes (``Context.keep``): a search that fails midway loses
    none that finished."""

    def __init__(
        self, engine: Engine, block: CapacityBlock, case: CapacityCase, adapters: dict[str, Adapter], ctx: Context
    ) -> None:
        self.engine, self.block, self.shape, self.adapters, self.ctx = engine, block, case.shape, adapters, ctx
        self.max_rate = case.max_rate(block)
        self.available = case.available()
        # An imported trace's slice, fixed once the first rate is known: every probe replays it.
        self.slice_n: int | None = None
        self.judged = {"slo_ttft_ms": block.slo_ttft_ms, "slo_tpot_ms": block.slo_tpot_ms, "warmup_s": block.warmup_s}
        self.slos = (block.slo_ttft_ms, block.slo_tpot_ms)
        self.slo_target = {"slo_ttft_ms": block.slo_ttft_ms, "slo_tpot_ms": block.slo_tpot_ms, "target": block.target}
        self.timelines: list[list[Any]] = []
        self.kept: list[ProbeRecord] = []
        # Of each probe stopped early: its arrivals left unsent, and those with its drain's bound.
        self.saved: list[tuple[float, float]] = []
        self.kept_in: Path | None = None
        # The row's fields known before the search, its key among them: each probe kept is keyed by it.
        self.fields: dict[str, Any] = {
            "workload": "trace",
            "num_adapters": self.shape.num_adapters,
            "warmup_rounds": 0,
            **self.shape.fields(block.warmup_s),
            "trace_rate": None,
            "slo_ttft_ms": block.slo_ttft_ms,
            "slo_tpot_ms": block.slo_tpot_ms,
            "slo_target": block.target,
            "capacity_precision": block.precision,
            "capacity_drain_s": block.drain_s,
            "capacity_max_rate": self.max_rate,
        }

    def search(self) -> capacity.Search:
        block, started = self.block, self.engine.loop.time()
        # A probe counts as its arrivals and drain_s: one whose requests need a longer drain
        # (docs/capacity.md#the-drain) may end past max_time_s by as much.
        probe_s = block.probe_duration_s + block.drain_s
        limits = capacity.Limits(
            block.precision, block.min_rate, self.max_rate, block.max_probes, block.max_time_s, probe_s
        )
        # The shape at a rate that gives about twice the requests the estimate sends (or all an imported trace has).
        rate = min(2 * block.estimate_requests / block.probe_duration_s, self.max_rate or math.inf)
        requests = self.shape.at(rate, block.probe_duration_s).requests(list(self.adapters))
        estimate = self.engine.run(
            closed_loop(self.engine, requests[: block.estimate_requests], self.adapters, block.estimate_concurrency)
        )
        if isinstance(self.shape, ImportedCase):
            first = capacity.first_rate(estimate, limits)
            # Enough that one copy at the first rate lasts probe_duration_s: there, a probe is one copy.
            self.slice_n = min(int(self.available), math.ceil(first * block.probe_duration_s - 1e-9))
            limits = replace(limits, length=lambda r, s: self.span(r, s)[0] + block.drain_s)
        return capacity.search(self.probe, estimate, limits, clock=self.engine.loop.time, started=started)

    def span(self, rate: float, stretch: float) -> tuple[float, float]:
        """A probe's arrivals, warm-up included, and its stretch: its measured span ``stretch``
        times the configured one. An imported trace's probe is whole copies of its slice, each
        arriving at ``rate``: as many as last that long, at least one (then it may be longer)."""
        block = self.block
        measured = block.probe_duration_s - block.warmup_s
        wanted = block.warmup_s + measured * stretch
        if self.slice_n is None:
            return wanted, stretch
        one = self.slice_n / rate
        duration = max(1, math.ceil(wanted / one - 1e-9)) * one
        return duration, (duration - block.warmup_s) / measured

    def requests_at(self, rate: float, duration: float) -> list[TraceRequest]:
        """A probe's requests: the shape at ``rate``; an imported trace's slice, time-scaled to
        ``rate``, back to back for ``duration``: the same requests at every rate."""
        if self.slice_n is None:
            return self.shape.at(rate, duration).requests(list(self.adapters))
        one = self.slice_n / rate
        return prefixes.copies(self.shape.at(rate, one).requests(list(self.adapters)), one, round(duration / one))

    def replay_at(self, rate: float, duration: float) -> tuple[list[replay.ReplayedRequest], float, probe_stop.SloLost]:
        """One probe's replay, once the engine is idle and alive, stopped once its SLO is lost
        (``probe_stop``); its records, its seconds, and whether and why it stopped."""
        requests, block = self.requests_at(rate, duration), self.block
        planned = sum(r.arrival_s >= block.warmup_s for r in requests)
        live = self.engine.target == INPROCESS
        stop = probe_stop.SloLost(planned, block.target, self.slos, block.warmup_s, live=live)
        drain = replay.drain_s(requests, block.drain_s, *self.slos)
        started = self.engine.loop.time()
        records = self.engine.run(
            replay.replay(
                self.engine,
                requests,
                self.adapters,
                # Prompts of their own per probe: a server target may cache what it has seen.
                seed=self.shape.seed + len(self.timelines) + 1,
                drain_timeout_s=drain,
                timeline=self.engine.timeline,
                stop=stop,
            )
        )
        seconds = self.engine.loop.time() - started
        if stop.at_s is not None:
            self.saved.append((max(duration - stop.at_s, 0.0), duration + drain - seconds))
        return records, seconds, stop

    def probe(self, rate: float, stretch: float) -> capacity.Probe:
        block, (duration, stretch) = self.block, self.span(rate, stretch)
        idle_wait_s, busy = self.engine.run(self.engine.wait_idle(IDLE_TIMEOUT_S))
        self.engine.check_alive()
        errors_before = len(getattr(self.engine, "failures", ()))
        records, seconds, stop = self.replay_at(rate, duration)
        # A probe the engine died in measured nothing: its requests would read as an overload.
        self.engine.check_alive()
        metrics, _ = replay_summary.summarize_online(records, **self.judged)
        steps = timeline.summarize(self.engine.timeline.rows, block.warmup_s, self.engine.timeline.counts_until_t)
        self.timelines.append(list(self.engine.timeline.rows))
        measured = [r for r in records if r.scheduled_s >= block.warmup_s]
        counts, sent = probe_stop.judged(measured, stop, *self.slos)
        found = capacity.Probe(
            rate=rate,
            **counts,
            target=block.target,
            stretch=stretch,
            failed_requests=sum(r.failed for r in records),
            first_error=self._first_error(errors_before),
            behind=replay_summary.probe_behind(measured, **self.slo_target),
            extra={
                "duration_s": duration,
                "idle_wait_s": idle_wait_s,
                "busy_at_start": busy,
                "seconds": seconds,
                **sent,
                **{k: metrics[k] for k in PROBE_METRICS},
                **{k: steps.get(k) for k in PROBE_STEPS},
                **{k: metrics.get(k) for k in PROBE_HIT_RATES},
            },
        )
        self.keep(found, records)
        return found

    def _first_error(self, before: int) -> str:
        """The first failure the engine counted since ``before`` (HTTP targets keep them)."""
        failures = getattr(self.engine, "failures", [])
        return _first_line(failures[before]) if len(failures) > before else "a stream ended unfinished"

    def keep(self, found: capacity.Probe, records: Sequence[replay.ReplayedRequest]) -> None:
        """The probe on disk now, its requests (their ``round`` the probe's number) before its
        summary, and a line on the terminal."""
        record = found.record(len(self.kept))
        ranks = {a.name: a.rank for a in self.adapters.values()}
        samples = [replace(s, round=record.probe) for s in replay_summary.samples(records, ranks)]
        self.ctx.keep(SAMPLES, samples, self.fields)
        self.kept_in = self.ctx.keep("probes", [record], self.fields)
        self.kept.append(record)
        if self.ctx.progress:
            verdict = "passes" if found.passed else "over" if found.failed else f"undecided, {record.undecided_why}"
            if found.stopped:
                verdict += f", stopped at {record.stopped_at_s:.3g} s ({found.stopped}; {record.sent} sent)"
            self.ctx.progress(
                f"capacity {self.shape.shape_id}: {found.rate:.3g} req/s for {record.duration_s:.3g} s {verdict} "
                f"(SLO met by {found.met}/{found.requests}, {found.unfinished} unfinished, "
                f"{found.failed_requests} failed)"
            )

    def failure(self, exc: Exception) -> Exception:
        """The search's failure in one line, with how many of its probes are kept, and where.
        An engine's death stays one: the case runner fails this case and its build's next on it."""
        n = len(self.kept)
        kept = f"{n} finished probe{'s' * (n != 1)} kept in {self.kept_in}" if n else "no probe had finished"
        if is_engine_dead(exc):
            reason = _first_line(exc) if isinstance(exc, EngineDied) else f"{type(exc).__name__}: {_first_line(exc)}"
            return EngineDied(f"{reason}; capacity search: {kept}")
        return SearchFailed(f"{type(exc).__name__}: {_first_line(exc)}; capacity search: {kept}")

    def outcome(self, found: capacity.Search) -> Outcome:
        at, over = found.capacity, found.over
        edge_low, edge_high = capacity.boundary_interval(found.probes)
        if self.ctx.progress and found.probes and found.probes[-1].void:
            self.ctx.progress(f"capacity {self.shape.shape_id}: search stopped, {found.stop}: no verdict at that rate")
        saved = {"probes_stopped": len(self.saved), "stopped_saved_s": [sum(s) for s in zip(*self.saved)] or [0, 0]}
        if self.ctx.progress and self.saved:
            low, high = saved["stopped_saved_s"]
            self.ctx.progress(
                f"capacity {self.shape.shape_id}: {len(self.saved)} of {len(found.probes)} probes stopped early, "
                f"saving {low:.1f} s of arrivals, {high:.1f} s with their drains at most"
            )
        fields: dict[str, Any] = {
            **self.fields,
            "rounds": len(found.probes),
            "estimate_rps": found.estimate_rps,
            "probes": len(found.probes),
            "search_stop": found.stop,
            "capacity_over_rps": over.rate if over else None,
            "capacity_ci_low_rps": edge_low,
            "capacity_ci_high_rps": edge_high,
        }
        if at is not None:
            low, high = at.interval
            fields.update(
                capacity_rps=at.rate,
                attainment_at_capacity=at.attainment,
                attainment_ci_low=low,
                attainment_ci_high=high,
                goodput_rps=at.extra["goodput_rps"],
                kv_usage_max=at.extra["kv_usage_max"],
                preemptions=at.extra["preemptions"],
                adapters_waiting_max=at.extra["adapters_waiting_max"],
            )
        # The probes and their samples are on disk already (``keep``); the passing probe's
        # timeline goes with the row.
        kept = {"timeline": self.timelines[found.probes.index(at)]} if at is not None else {}
        return Outcome(fields, [], extra_info={"search_stop": found.stop, **saved}, records=kept)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""
