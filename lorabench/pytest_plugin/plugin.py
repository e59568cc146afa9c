"""The pytest plugin: hooks (marks, parametrization, the summary) and the two fixtures.

The fixtures (``engine``, one vLLM engine per build of an engine configuration, and
``lorabench``, the per-test handle that runs one case) live in ``fixtures`` and are
imported here, where pytest finds them. Which tests are benchmark cases is in
``bench_items``, options in ``options``, session state in ``session``, scenarios in
``scenarios``, what goes to the terminal in ``terminal``.

The plugin is installed for every pytest run in the environment, so it stays inert
(no config read, no vLLM import) unless a collected test asks for ``engine``.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from lorabench.config import BenchConfig, ConfigError, ConfigFile, EngineSpec, engine_specs, resolve_config
from lorabench.config.target import URL
from lorabench.host.device import DEVICE_TYPES
from lorabench.pytest_plugin import build_stops, fleet_worker, hooks, options
from lorabench.pytest_plugin.bench_items import ENGINE_FIXTURE, device_skip, scenario_of
from lorabench.pytest_plugin.build_stops import pytest_runtest_setup  # noqa: F401 - pytest finds hooks here
from lorabench.pytest_plugin.fixtures import engine, lorabench  # noqa: F401 - pytest finds fixtures in the plugin's namespace
from lorabench.pytest_plugin.session import STATE, BenchState
from lorabench.pytest_plugin.session_end import compare_problems, finish_session
from lorabench.pytest_plugin.terminal import say, summary_lines
from lorabench.results.progress import RunProgress
from lorabench.results.provenance import pair_from_env
from lorabench.results.schema_check import SchemaError, check_declared
from lorabench.scenarios import SCENARIOS
from lorabench.targets import vllm_api
from lorabench.targets.engine import VllmBackend
from lorabench.targets.http.checks import problems as target_problems
from lorabench.targets.vllm_args import engine_arg_names

XDIST_KEY = "lorabench_refused"
XDIST_REFUSED = (
    "pytest-xdist (-n) would have every worker build its own engines on the same device at once, "
    "and pytest-benchmark turns itself off under it: run benchmark cases without -n"
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for device in DEVICE_TYPES:
        config.addinivalue_line("markers", f"{device}: needs vLLM's {device} platform; skipped elsewhere")
    config.addinivalue_line("markers", f"scenario(name): a lorabench benchmark; name is one of {', '.join(SCENARIOS)}")
    problems: list[str] = []  # refused when collection ends, before any engine starts
    config_path = Path(options.value(config, "bench_config"))
    worker = fleet_worker.worker_of(config)
    config.stash[STATE] = BenchState(
        config_path=config_path.resolve(),
        output=worker.output if worker else options.value(config, "bench_output"),
        fleet_columns=worker.columns if worker else {},
        builds=options.checked(config, "bench_builds", problems),
        target_option=options.checked(config, "bench_target", problems),
        problems=problems,
    )
    options.checked(config, "bench_compare_alpha", problems)  # a bad value is refused now, not after the run
    options.checked(config, "bench_precision", problems)
    problems += compare_problems(config)
    options.checked(config, "bench_fleet", problems)
    options.checked(config, "bench_fleet_check_pairs", problems)
    problems += options.lone_fleet_options(config)
    try:
        pair_from_env()
    except ValueError as exc:
        problems.append(str(exc))


def _target_skip(scenario: Any, state: BenchState, specs: list) -> str:
    """Why the scenario's cases cannot run on this target, or "": the local vLLM lacks a feature
    the scenario needs (read from its source, ``vllm_api``); a server elsewhere cannot
    read the folders a ``local_only`` scenario writes, and a URL's server runs the config's
    configuration as started, so a scenario that needs prefix caching on or off needs the
    config (and the server) to say so."""
    target = state.target
    if target.kind != URL:  # a server elsewhere runs a vLLM this process cannot read
        lacking = next(filter(None, map(vllm_api.lacking, scenario.needs)), None)
        if lacking:
            return f"the {scenario.name} scenario: {lacking}"
    if scenario.local_only and not target.on_this_machine:
        return (
            f"the {scenario.name} scenario hands the server folders it writes on this machine: "
            f"{target.url} is not on it (run it on the server's machine, or with --bench-target serve)"
        )
    wanted = scenario.prefix_caching
    if target.kind == URL and wanted is not None and any(s.enable_prefix_caching != wanted for s in specs):
        return (
            f"the {scenario.name} scenario needs prefix caching {'on' if wanted else 'off'}: the server at "
            f"{target.url} runs the config's configuration; start it so and set engine.enable_prefix_caching "
            f"{str(wanted).lower()}, or run it with --bench-target serve"
        )
    return ""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if ENGINE_FIXTURE not in metafunc.fixturenames:
        return
    state = metafunc.config.stash[STATE]
    scenario = scenario_of(metafunc.definition, state.problems)
    file = state.read_file()
    if file is None or scenario is None:
        # Collection ends in a usage error (see pytest_collection_modifyitems).
        metafunc.parametrize(ENGINE_FIXTURE, [], indirect=True, scope="session")
        return
    marks = [getattr(pytest.mark, file.device)] if file.device else []
    # One build per configuration and build index, shared by every scenario's tests:
    # pytest keys session-scoped parameters by value, so equal specs share one engine.
    builds = state.builds or scenario.builds(file) or file.matrix.builds
    # Optional builds past the minimum (build_stops); not in a fleet, whose workers see their own rows only.
    in_fleet = options.value(metafunc.config, "bench_fleet") or metafunc.config.getoption("bench_fleet_worker", None)
    if scenario.sequential_builds and not in_fleet:
        builds = build_stops.builds_at_most(options.with_precision(metafunc.config, file).matrix, builds)
    # A URL's server runs with LoRA as it was started: no LoRA-disabled engine there.
    with_lora_off = scenario.with_lora_off and state.target.kind != URL
    variants = scenario.variants_for(file) if state.target.kind != URL else ()
    specs = engine_specs(file, with_lora_off=with_lora_off, builds=builds, variants=variants)
    reason = _target_skip(scenario, state, specs)
    if reason:
        # Skipped before any engine is built; on the config's own configurations, so that a
        # server's single configuration is not joined by one the scenario would have asked for.
        marks.append(pytest.mark.skip(reason=reason))
    elif scenario.prefix_caching is not None and state.target.kind != URL:
        specs = list(dict.fromkeys(replace(s, enable_prefix_caching=scenario.prefix_caching) for s in specs))
    parametrizations = scenario.parametrize(file)
    skips = [
        pytest.mark.skip(reason=f"{state.config_path}: {p.skip_reason}") for p in parametrizations if p.skip_reason
    ]
    metafunc.parametrize(
        ENGINE_FIXTURE, [pytest.param(s, id=s.id, marks=marks + skips) for s in specs], indirect=True, scope="session"
    )
    for p in parametrizations:
        metafunc.parametrize(p.argname, p.values, ids=p.ids)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = config.stash[STATE]
    if state.problems:
        options.refuse(state.problems)
    bench_items = _runs_on_its_build(
        config, [i for i in items if ENGINE_FIXTURE in getattr(i, "fixturenames", ())], items
    )
    marked = [i for i in items if any(i.get_closest_marker(d) for d in DEVICE_TYPES)]
    if not bench_items and not marked:
        return
    if bench_items and hasattr(config, "workerinput"):
        # A worker cannot end the session cleanly: it leaves the cases out and tells the controller.
        config.workeroutput[XDIST_KEY] = XDIST_REFUSED
        config.hook.pytest_deselected(items=bench_items)
        items[:] = [i for i in items if i not in bench_items]
        return
    state.backend = _backend(config, state)
    state.platform = state.backend.platform()
    for item in marked:
        reason = device_skip(item, state.platform)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
    runnable = [i for i in bench_items if not device_skip(i, state.platform)]
    if not runnable:
        if bench_items:
            state.skip_reason = device_skip(bench_items[0], state.platform)
        return
    _stop_on_sigterm(state)
    state.file = options.with_precision(config, state.file)
    state.config = _resolve_run(state, runnable)
    if options.value(config, "bench_fleet") and not state.fleet_columns:
        from lorabench.pytest_plugin import fleet_driver  # a fleet's driver only: it imports what merges and checks

        fleet_driver.start(config, state, runnable)
    for warning in state.config.warnings:
        say(config, f"lorabench: warning: {warning}")
    state.progress = _run_progress(runnable, state.file, at_url=state.target.kind == URL)
    say(config, state.progress.first_guess())


def _runs_on_its_build(config: pytest.Config, bench_items: list[pytest.Item], items: list[pytest.Item]) -> list:
    """The benchmark cases whose scenario runs them on their build (``Scenario.runs_on``); the
    others deselected from ``items``."""
    left = {
        i
        for i in bench_items
        if isinstance(spec := i.callspec.params.get(ENGINE_FIXTURE), EngineSpec)
        and (s := scenario_of(i))
        and not s.runs_on(spec, i.callspec.params)
    }
    if left:
        config.hook.pytest_deselected(items=[i for i in items if i in left])
        items[:] = [i for i in items if i not in left]
    return [i for i in bench_items if i not in left]


def _resolve_run(state: BenchState, runnable: list[pytest.Item]) -> BenchConfig:
    """The configuration resolved for the cases that will run, after their scenarios' columns
    and the target are checked; a usage error says what stops them."""
    scenarios = {scenario_of(i) for i in runnable}
    try:
        for scenario in scenarios:
            check_declared(scenario.name, scenario.columns | scenario.maybe_columns)
    except SchemaError as exc:
        options.refuse([str(exc)])
    selected = [i.callspec.params[ENGINE_FIXTURE] for i in runnable]
    refused = target_problems(state.config_path, state.file, state.target, selected)
    if refused:
        options.refuse(refused)
    try:
        return resolve_config(
            state.config_path,
            state.file,
            needs_lora=any(s.needs_adapters for s in scenarios),
            output=state.output,
            engine_args=engine_arg_names if state.backend.checks_vllm_args else None,
            runs={s.name for s in scenarios},
        )
    except ConfigError as exc:
        options.refuse(exc.problems)


def _backend(config: pytest.Config, state: BenchState) -> Any:
    """A server target's backend; else what the ``pytest_lorabench_backend`` hook gives (a
    stand-in, say), else in-process vLLM."""
    if state.target.over_http:
        from lorabench.targets.http.backend import HttpBackend  # aiohttp: imported only when a server is the target

        return HttpBackend(state.target, state.file.device)
    return config.hook.pytest_lorabench_backend(config=config) or VllmBackend()


def _run_progress(items: list[pytest.Item], file: ConfigFile, at_url: bool) -> RunProgress:
    params = [item.callspec.params for item in items]
    replays = sum(scenario_of(i).replay_s(file, **p) for i, p in zip(items, params))
    builds = len({p[ENGINE_FIXTURE] for p in params})
    return RunProgress(builds=builds, cases=len(items), trace_s=replays, at_url=at_url)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"received signal {signum}")


def _stop_on_sigterm(state: BenchState) -> None:
    """Make SIGTERM stop the session like Ctrl-C: engines shut down, finished rows stay."""
    if threading.current_thread() is threading.main_thread():
        state.previous_sigterm = signal.signal(signal.SIGTERM, _interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None and state.previous_sigterm is not None:
        signal.signal(signal.SIGTERM, state.previous_sigterm)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist's controller: a worker that refused the benchmark cases said why."""
    refused = getattr(node, "workeroutput", {}).get(XDIST_KEY)
    if refused:
        node.config.stash[STATE].skip_reason = refused
        node.config.stash[STATE].refused = True


@pytest.hookimpl(tryfirst=True)  # before the terminal reporter prints its summary
def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash[STATE]
    if state.refused:
        session.exitstatus = options.BAD_INPUT
        return
    if not state.fleet_columns:  # a fleet worker's run is the driver's to report, compare and keep
        finish_session(session)


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's table: the run's files are the last lines
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    report = [state.report_error] if state.report_error else []
    for title, section in (
        ("lorabench", summary_lines(state)),
        ("lorabench compare", state.comparison),
        ("lorabench report", report),
        ("lorabench history", state.history),
    ):
        if section:
            terminalreporter.write_sep("=", title)
            for line in section:
                terminalreporter.write_line(line)
