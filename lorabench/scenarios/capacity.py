"""``capacity``: for each trace shape of the config's ``capacity`` block, the highest request
rate this engine serves within the SLOs (``lorabench.capacity``). Each probe replays the
shape at one rate for ``probe_duration_s``, as the online scenario replays a trace; every
probe is kept (``<run>.replays/probes.csv``, and its requests in the samples with the probe
as their round), so the attainment-against-rate curve can be drawn."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from lorabench import capacity, replay, timeline
from lorabench.config.expand import MAYBE_TRACE_COLUMNS, ONLINE_TRACE_COLUMNS, ImportedCase, OnlineCase, trace_cases
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario
from lorabench.schema import ProbeRecord
from lorabench.traces import transforms
from lorabench.workload import synthetic_prompt

if TYPE_CHECKING:
    from pathlib import Path

    from lorabench.adapters import Adapter
    from lorabench.config import ConfigFile
    from lorabench.config.schema import Capacity as CapacityBlock
    from lorabench.engine import Engine
    from lorabench.trace import TraceRequest

SEARCH_COLUMNS = frozenset(
    {"slo_ttft_ms", "slo_tpot_ms", "slo_target", "capacity_precision", "capacity_drain_s"}
    | {"estimate_rps", "probes", "search_stop"}
)
# Blank when the search found no passing rate (below its range) or no failing one (above it).
AT_CAPACITY = frozenset(
    {"capacity_rps", "attainment_at_capacity", "attainment_ci_low", "attainment_ci_high", "goodput_rps"}
)
TIMELINE_AT_CAPACITY = frozenset({"kv_usage_max", "preemptions", "adapters_waiting_max"})


@dataclass(frozen=True)
class CapacityCase:
    """One trace shape to search: its rate is what the search varies."""

    shape: OnlineCase | ImportedCase

    @property
    def id(self) -> str:
        return self.shape.shape_id

    def located(self, config_dir: Path) -> CapacityCase:
        return CapacityCase(self.shape.located(config_dir))

    def max_rate(self, block: CapacityBlock) -> float | None:
        """The highest rate to probe: the config's, and for an imported trace the rate at
        which a probe would use up the requests it has from its start."""
        if not isinstance(self.shape, ImportedCase):
            return block.max_rate
        available = len(transforms.window(self.shape.data, self.shape.start, None)[0]) / block.probe_duration_s
        return min(available, block.max_rate or math.inf)


def capacity_cases(file: ConfigFile) -> list[CapacityCase]:
    block = file.capacity
    if block is None:
        return []
    # The nominal rate is never replayed: each probe sets its own.
    return [CapacityCase(case) for shape in block.shapes for case in trace_cases(shape, [1.0], block.probe_duration_s)]


class Capacity(Scenario):
    name = "capacity"
    columns = (ONLINE_TRACE_COLUMNS - {"trace_rate"}) | SEARCH_COLUMNS
    # capacity_max_rate: blank when neither the config nor an imported trace bounds the rates.
    maybe_columns = (
        AT_CAPACITY | TIMELINE_AT_CAPACITY | {"capacity_over_rps", "capacity_max_rate"} | MAYBE_TRACE_COLUMNS
    )

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        cases = capacity_cases(file)
        if not cases:
            return [
                Parametrization(
                    "capacity_case", [None], ["no-capacity"], skip_reason="the config has no 'capacity' block"
                )
            ]
        return [Parametrization("capacity_case", cases, [c.id for c in cases])]

    def builds(self, file: ConfigFile) -> int | None:
        return file.capacity.builds if file.capacity is not None else None

    def replay_s(self, file: ConfigFile, **_: object) -> float:
        """Every probe at its longest (arrivals and drain), within the search's time limit."""
        block = file.capacity
        if block is None:
            return 0.0
        return min(block.max_probes * (block.probe_duration_s + block.drain_s), block.max_time_s)

    def run(self, ctx: Context, engine: Engine, *, capacity_case: CapacityCase) -> Outcome:  # type: ignore[override]
        block = ctx.config.file.capacity
        case = capacity_case.located(ctx.config.path.parent)
        adapters = {a.name: a for a in ctx.config.adapters[: case.shape.num_adapters]}
        engine.load_adapters(list(adapters.values()))
        runner = _Prober(engine, block, case, adapters, ctx)
        found: list[capacity.Search] = []
        ctx.time(lambda: found.append(runner.search()))
        return runner.outcome(found[0])


class _Prober:
    """One search's probes on one engine: each a replay, its summary and its records."""

    def __init__(
        self, engine: Engine, block: CapacityBlock, case: CapacityCase, adapters: dict[str, Adapter], ctx: Context
    ) -> None:
        self.engine, self.block, self.shape, self.adapters, self.ctx = engine, block, case.shape, adapters, ctx
        self.max_rate = case.max_rate(block)
        self.judged = {"slo_ttft_ms": block.slo_ttft_ms, "slo_tpot_ms": block.slo_tpot_ms, "warmup_s": block.warmup_s}
        self.records: list[list[replay.ReplayedRequest]] = []
        self.timelines: list[list[Any]] = []

    def search(self) -> capacity.Search:
        block, started = self.block, time.monotonic()
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
        return capacity.search(self.probe, estimate, limits, started=started)

    def probe(self, rate: float) -> capacity.Probe:
        requests = self.shape.at(rate, self.block.probe_duration_s).requests(list(self.adapters))
        started = time.perf_counter()
        records = self.engine.run(
            replay.replay(
                self.engine,
                requests,
                self.adapters,
                # Prompts of their own per probe: a server target may cache what it has seen.
                seed=self.shape.seed + len(self.records) + 1,
                drain_timeout_s=self.block.drain_s,
                timeline=self.engine.timeline,
            )
        )
        seconds = time.perf_counter() - started
        metrics, _ = replay.summarize_online(records, **self.judged)
        steps = timeline.summarize(self.engine.timeline.rows, self.block.warmup_s)
        self.records.append(records)
        self.timelines.append(list(self.engine.timeline.rows))
        measured = int(metrics["num_requests"])
        found = capacity.Probe(
            rate=rate,
            requests=measured,
            met=round(metrics["slo_attainment"] * measured) if measured else 0,
            unfinished=int(metrics["unfinished"]),
            target=self.block.target,
            extra={
                "goodput_rps": metrics["goodput_rps"],
                "ttft_ms_p99": metrics["ttft_ms_p99"],
                "decode_ms_p99": metrics["decode_ms_p99"],
                "kv_usage_max": steps.get("kv_usage_max"),
                "preemptions": steps.get("preemptions"),
                "adapters_waiting_max": steps.get("adapters_waiting_max"),
                "seconds": seconds,
            },
        )
        if self.ctx.progress:
            verdict = "passes" if found.passed else "over"
            self.ctx.progress(
                f"capacity {self.shape.shape_id}: {rate:.3g} req/s {verdict} "
                f"(SLO met by {found.met}/{measured}, {found.unfinished} unfinished)"
            )
        return found

    def outcome(self, found: capacity.Search) -> Outcome:
        block, at, over = self.block, found.capacity, found.over
        fields: dict[str, Any] = {
            "workload": "trace",
            "num_adapters": self.shape.num_adapters,
            "rounds": len(found.probes),
            "warmup_rounds": 0,
            **self.shape.fields(block.warmup_s),
            "trace_rate": None,
            "slo_ttft_ms": block.slo_ttft_ms,
            "slo_tpot_ms": block.slo_tpot_ms,
            "slo_target": block.target,
            "capacity_precision": block.precision,
            "capacity_drain_s": block.drain_s,
            "capacity_max_rate": self.max_rate,
            "estimate_rps": found.estimate_rps,
            "probes": len(found.probes),
            "search_stop": found.stop,
            "capacity_over_rps": over.rate if over else None,
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
        ranks = {a.name: a.rank for a in self.adapters.values()}
        samples = [
            replace(s, round=i) for i, records in enumerate(self.records) for s in replay.samples(records, ranks)
        ]
        at_index = found.probes.index(at) if at is not None else None
        kept = {"probes": [_probe_record(i, p) for i, p in enumerate(found.probes)]}
        if at_index is not None:
            kept["timeline"] = self.timelines[at_index]
        return Outcome(fields, samples, extra_info={"search_stop": found.stop}, records=kept)


def _probe_record(index: int, p: capacity.Probe) -> ProbeRecord:
    low, high = p.interval
    return ProbeRecord(
        probe=index,
        rate=p.rate,
        requests=p.requests,
        met=p.met,
        unfinished=p.unfinished,
        attainment=p.attainment,
        ci_low=low,
        ci_high=high,
        passed=p.passed,
        **p.extra,
    )


async def closed_loop(
    engine: Engine, requests: Sequence[TraceRequest], adapters: Mapping[str, Adapter], concurrency: int
) -> float:
    """Requests per second with ``concurrency`` in flight, each sent as soon as one finishes:
    what the engine serves with no latency target, the upper bound the search starts under."""
    queue = list(enumerate(requests))[::-1]
    vocab = engine.vocab_size

    async def worker() -> None:
        while queue:
            index, r = queue.pop()
            prompt = synthetic_prompt(index, r.input_len, vocab, seed=0)
            async for _ in engine.stream(
                prompt, engine.sampling_params(r.output_len, stream=True), adapters[r.adapter]
            ):
                pass

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    return len(requests) / (time.perf_counter() - started)


SCENARIO = Capacity()
