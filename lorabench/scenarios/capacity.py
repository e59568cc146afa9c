"""``capacity``: for each trace shape of the config's ``capacity`` block, the highest request
rate this engine serves within the SLOs (``lorabench.measure.capacity``). Each probe replays the
shape at one rate for ``probe_duration_s``, as the online scenario replays a trace, once
the engine has no request left of the last. Every probe is kept: on disk as soon as it
finishes (``<run>.replays/probes.csv``, so a search that fails midway loses none), and its
requests in the samples with the probe as their round, so the attainment-against-rate curve
can be drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorabench.config.online_cases import MAYBE_TRACE_COLUMNS, ONLINE_TRACE_COLUMNS, trace_cases
from lorabench.measure import capacity
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario
from lorabench.scenarios.capacity_probes import CapacityCase, Prober

if TYPE_CHECKING:
    from lorabench.config import ConfigFile
    from lorabench.targets.engine import Engine

SEARCH_COLUMNS = frozenset(
    {"slo_ttft_ms", "slo_tpot_ms", "slo_target", "capacity_precision", "capacity_drain_s"}
    | {"estimate_rps", "probes", "search_stop"}
)
# Blank when the search found no passing rate (below its range) or no failing one (above it).
AT_CAPACITY = frozenset(
    {"capacity_rps", "attainment_at_capacity", "attainment_ci_low", "attainment_ci_high", "goodput_rps"}
)
TIMELINE_AT_CAPACITY = frozenset({"kv_usage_max", "preemptions", "adapters_waiting_max"})


def capacity_cases(file: ConfigFile) -> list[CapacityCase]:
    block = file.capacity
    if block is None:
        return []
    # The nominal rate is never replayed: each probe sets its own.
    return [CapacityCase(case) for shape in block.shapes for case in trace_cases(shape, [1.0], block.probe_duration_s)]


class Capacity(Scenario):
    name = "capacity"
    needs = ("engine", "lora", "idle_count")
    columns = (ONLINE_TRACE_COLUMNS - {"trace_rate"}) | SEARCH_COLUMNS
    # capacity_max_rate: blank when neither the config nor an imported trace bounds the rates.
    maybe_columns = (
        AT_CAPACITY
        | TIMELINE_AT_CAPACITY
        | {"capacity_over_rps", "capacity_max_rate", "capacity_ci_low_rps", "capacity_ci_high_rps"}
        | MAYBE_TRACE_COLUMNS
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
        runner = Prober(engine, block, case, adapters, ctx)
        found: list[capacity.Search] = []
        try:
            ctx.time(lambda: found.append(runner.search()))
        except Exception as exc:
            raise runner.failure(exc) from exc
        return runner.outcome(found[0])


SCENARIO = Capacity()
