"""Sequential stopping across builds (``matrix.max_builds`` with a precision target,
docs/metrics.md#sequential-stopping): builds are the replicates that matter, so a batch case
whose builds agree stops being measured on further builds.

A configuration is then collected with ``max_builds`` builds; builds past the minimum
(``matrix.builds``, or ``--bench-builds``) are optional. Before a batch case runs on such a
build, its earlier builds' rows (this run's, in build order) are judged with the same group-
sequential design as rounds within a build (``lorabench.measure.sequential.Design``): looks at
build counts fixed in advance, the error spent equally over them, a t interval on the log of the
per-build values of e2e_ms, ttft_ms and decode_ms. Where a look at or before this build reached
the target, the case is skipped before its setup, so a build none of whose cases runs is never
built. The interval at the stopping look covers with 95 % however the stop was decided.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from lorabench.config import EngineSpec
from lorabench.measure.sequential import HEADLINE, Design
from lorabench.measure.wallclock import MEASURED, WARMUPS
from lorabench.pytest_plugin.bench_items import ENGINE_FIXTURE, scenario_of
from lorabench.pytest_plugin.session import STATE, BenchState
from lorabench.scenarios import SCENARIOS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from lorabench.config.schema import Matrix
    from lorabench.results.schema import ResultRow

PREFIX = "precise after"


def builds_at_most(matrix: Matrix, builds: int) -> int:
    """How many builds of a configuration a sequential scenario's cases are collected on:
    ``max_builds`` where a precision target is set and it is above the minimum ``builds``."""
    if matrix.precision_pct is None or not matrix.max_builds:
        return builds
    return max(builds, matrix.max_builds)


def design(matrix: Matrix, builds: int) -> Design | None:
    """The looks over build counts, the minimum first; None where builds do not stop sequentially."""
    most = builds_at_most(matrix, builds)
    if most <= builds:
        return None
    return Design.of(matrix.precision_pct, builds, most)


def earlier_rows(item: pytest.Item, spec: EngineSpec, rows: Sequence[ResultRow]) -> list[ResultRow]:
    """This case's rows on the builds before ``spec``'s, in build order: the same test on the
    same configuration, its engine parameter's id the only difference."""
    ids = {item.nodeid.replace(spec.id, replace(spec, build=b).id): b for b in range(spec.build)}
    found = {ids[r.test_id]: r for r in rows if r.test_id in ids}
    return [found[b] for b in sorted(found)]


def stop_reason(plan: Design, rows: Sequence[ResultRow]) -> str | None:
    """Why the case needs no more builds: the first look its builds' intervals all fell within
    the target at; None while one has not (or a metric has no value on some build)."""
    values = [{m: _value(row, m) for m in HEADLINE} for row in rows]
    for look in plan.looks:
        if look > len(values):
            return None
        verdict = plan.judge(values[:look])
        if verdict is not None and verdict.reached:
            widths = ", ".join(f"{m} ±{100 * i.half_width:.1f}%" for m, i in verdict.intervals.items())
            return f"{PREFIX} {look} builds: the builds' 95% intervals ({widths}) are within {100 * plan.target:g}%"
    return None


def _value(row: ResultRow, metric: str) -> float:
    value: Any = getattr(row, metric, None)
    return math.nan if value is None else float(value)


@pytest.hookimpl(tryfirst=True)  # before the engine fixture's setup: a skipped case builds nothing
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a batch case on an optional build where its earlier builds are precise enough."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    spec, scenario = params.get(ENGINE_FIXTURE), scenario_of(item) if ENGINE_FIXTURE in params else None
    if scenario is None or not scenario.sequential_builds or not isinstance(spec, EngineSpec):
        return
    state = item.config.stash[STATE]
    if state.file is None or state.writer is None:
        return
    minimum = state.builds or state.file.matrix.builds
    plan = design(state.file.matrix, minimum)
    if plan is None or spec.build < minimum:
        return
    reason = stop_reason(plan, earlier_rows(item, spec, state.writer.rows))
    if reason:
        state.build_stops.append((item.nodeid.replace(spec.id, replace(spec, build=0).id), spec.id))
        pytest.skip(reason)


def in_effect(state: BenchState) -> bool:
    """Whether this session's batch cases could stop across builds (rows of one in it)."""
    if state.file is None or state.writer is None or state.fleet_columns:
        return False
    rows = [r for r in state.writer.rows if SCENARIOS[r.scenario].sequential_builds]
    return bool(rows) and design(state.file.matrix, state.builds or state.file.matrix.builds) is not None


def saved_line(state: BenchState) -> str:
    """What stopping across builds saved: the cases stopped, their runs skipped, the builds
    never built (none of their cases ran, and none failed), and about how long those would have
    taken at this run's mean build and its mean case (its measured and warm-up seconds over its rows)."""
    cases = {case for case, _ in state.build_stops}
    done = {build for build, _ in state.built} | set(state.failed_builds)
    unbuilt = {build for _, build in state.build_stops} - done
    build_s = sum(s for _, s in state.built) / len(state.built) if state.built else 0.0
    rows = len(state.writer.rows) if state.writer is not None else 0
    case_s = (state.clock.spent[MEASURED] + state.clock.spent[WARMUPS]) / rows if rows else 0.0
    about = len(unbuilt) * build_s + len(state.build_stops) * case_s
    if not cases:
        return "sequential builds: no case was precise before matrix.max_builds: every build ran"
    return (
        f"sequential builds: {len(cases)} case(s) precise before matrix.max_builds, {len(state.build_stops)} of "
        f"their runs skipped, {len(unbuilt)} build(s) not needed: about {about:.0f} s saved"
    )
