"""The plugin's two fixtures, after pytest-httpserver: ``engine`` is the expensive,
session-scoped resource (one vLLM engine per build of an engine configuration, shared by
every scenario's tests and shut down before the next is built), and ``lorabench`` is the
cheap per-test handle that runs one case.

The plugin module imports both, so that pytest finds them where it finds the hooks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lorabench.host.memory import MIB, DeviceNotReleased, tree_rss_bytes
from lorabench.measure.wallclock import BUILDS
from lorabench.pytest_plugin import build_stops
from lorabench.pytest_plugin.bench_items import ENGINE_FIXTURE, scenario_of
from lorabench.pytest_plugin.session import STATE, BenchState
from lorabench.pytest_plugin.terminal import say
from lorabench.results.files import ResultWriter
from lorabench.results.provenance import provenance
from lorabench.scenarios.case import BenchCase
from lorabench.targets.engine import Engine
from lorabench.targets.failures import EngineBuildError


def state_for_run(config: pytest.Config) -> BenchState:
    """The session's state with its run begun: provenance taken, the result writer made."""
    state = config.stash[STATE]
    if state.config is None:
        raise RuntimeError("lorabench: no resolved configuration; was the test collected with its engine parameter?")
    if state.writer is None:
        model = state.file.model if state.config.is_builtin_model else state.config.model.name
        state.provenance = {**provenance(config.rootpath, state.platform, model), **state.fleet_columns}
        state.writer = ResultWriter(
            state.config.results_dir, state.config.output, state.provenance["git_commit"], state.provenance["git_dirty"]
        )
        state.writer.keep_config(state.config.path, state.provenance["run_id"])
    return state


@pytest.fixture(scope="session")
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """A running vLLM engine: one build of one engine configuration, shared by all its cases."""
    state = state_for_run(request.config)
    spec = getattr(request, "param", None)
    if spec is None:
        raise RuntimeError(
            f"lorabench: '{ENGINE_FIXTURE}' is parametrized by the plugin; mark the test with @pytest.mark.scenario"
        )
    if state.unreleased:
        pytest.fail(f"engine configuration {spec.id} not built: {state.unreleased}", pytrace=False)
    log_path = state.writer.log_dir / f"{spec.id}.log"
    eng: Engine = state.backend.engine(state.config, spec, state.platform.device_type, log_path)
    failure = None
    try:
        with state.clock.timing(BUILDS):
            eng.__enter__()
    except Exception as exc:  # noqa: BLE001 - fail this configuration's cases, keep the session
        reason = str(exc) if isinstance(exc, EngineBuildError) else f"{type(exc).__name__}: {exc}"
        failure = f"engine configuration {spec.id} failed to build: {reason}"
    if failure and spec.engine_variant:
        # A variant build only its canary needs (lorabench.config.variants): whether LoRA or the
        # feature alone fails to build here, no LoRA answer was wrong; said, not a finding.
        state.failed_builds.append(spec.id)
        pytest.skip(f"{failure}: the variant build's check is not judged")
    if failure:
        state.failed_builds.append(spec.id)
        pytest.fail(failure, pytrace=False)
    state.built.append((spec.id, eng.build_s))
    try:
        yield eng
    finally:
        try:
            with state.clock.timing(BUILDS):
                eng.close()
        except DeviceNotReleased as exc:
            state.unreleased = f"the device memory of {spec.id} was not released: {exc}"
        state.rss_after_teardown.append((spec.id, tree_rss_bytes() / MIB))
        if eng.memory.note:
            state.memory_notes.append(f"{spec.id}: {eng.memory.note}")
        if state.progress is not None:
            say(request.config, state.progress.build_done())


@pytest.fixture
def lorabench(request: pytest.FixtureRequest, benchmark: Any) -> BenchCase:
    """Runs one case on the engine it is given and records it; see ``BenchCase.run``."""
    state = state_for_run(request.config)
    scenario = scenario_of(request.node)
    sequential = scenario is not None and scenario.sequential_builds and not state.fleet_columns
    return BenchCase(
        config=state.config,
        benchmark=benchmark,
        writer=state.writer,
        provenance=state.provenance,
        scenario=scenario,
        test_id=request.node.nodeid,
        digests=state.digests,
        progress=lambda line: say(request.config, line),
        clock=state.clock,
        builds_design=build_stops.design(state.file.matrix, state.builds or state.file.matrix.builds)
        if sequential
        else None,
    )
