"""The pytest plugin: hooks (marks, parametrization, the summary) and the two fixtures.

Two fixtures, after pytest-httpserver: ``engine`` is the expensive, session-scoped
resource (one vLLM engine per build of an engine configuration, shared by every
scenario's tests and shut down before the next is built), and ``lorabench`` is the
cheap per-test handle that runs one case. Options live in ``options``, session state
in ``session``, scenarios in ``scenarios``.

The plugin is installed for every pytest run in the environment, so it stays inert
(no config read, no vLLM import) unless a collected test asks for ``engine``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lorabench import hooks, options
from lorabench.ab import pair_from_env
from lorabench.case import BenchCase
from lorabench.config import ConfigError, ConfigFile, engine_specs, resolve_config
from lorabench.device import DEVICE_TYPES, Platform
from lorabench.engine import Engine, EngineBuildError, VllmBackend
from lorabench.http.checks import problems as target_problems
from lorabench.http.target import URL
from lorabench.memory import MIB, DeviceNotReleased, tree_rss_bytes
from lorabench.progress import RunProgress
from lorabench.recommend import for_session
from lorabench.results import ResultWriter, format_rank_summary, format_summary, provenance
from lorabench.scenarios import SCENARIOS, Scenario
from lorabench.schema_check import SchemaError, check_declared
from lorabench.session import STATE, BenchState
from lorabench.session_end import finish_session

ENGINE_FIXTURE = "engine"
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
    config_path = Path(options.value(config, "bench_config"))
    config.stash[STATE] = BenchState(
        config_path=config_path.resolve(),
        output=options.value(config, "bench_output"),
        builds=options.value(config, "bench_builds"),
        target_option=options.value(config, "bench_target"),
    )
    options.value(config, "bench_compare_alpha")  # a bad value is a usage error now, not after the run
    try:
        pair_from_env()
    except ValueError as exc:
        raise pytest.UsageError(f"lorabench: {exc}") from None


def _scenario(item: pytest.Item, problems: list[str] | None = None) -> Scenario | None:
    marker = item.get_closest_marker("scenario")
    name = marker.args[0] if marker and marker.args else None
    if name not in SCENARIOS:
        if problems is not None:
            problems.append(
                f"{item.nodeid}: uses the '{ENGINE_FIXTURE}' fixture, so it needs "
                f"@pytest.mark.scenario(NAME) with NAME one of {', '.join(SCENARIOS)} (got {name!r})"
            )
        return None
    return SCENARIOS[name]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if ENGINE_FIXTURE not in metafunc.fixturenames:
        return
    state = metafunc.config.stash[STATE]
    scenario = _scenario(metafunc.definition, state.problems)
    file = state.read_file()
    if file is None or scenario is None:
        # Collection ends in a usage error (see pytest_collection_modifyitems).
        metafunc.parametrize(ENGINE_FIXTURE, [], indirect=True, scope="session")
        return
    marks = [getattr(pytest.mark, file.device)] if file.device else []
    # One build per configuration and build index, shared by every scenario's tests:
    # pytest keys session-scoped parameters by value, so equal specs share one engine.
    builds = state.builds or scenario.builds(file) or file.matrix.builds
    # A URL's server runs with LoRA as it was started: no LoRA-disabled engine there.
    with_lora_off = scenario.with_lora_off and state.target.kind != URL
    specs = engine_specs(file, with_lora_off=with_lora_off, builds=builds)
    parametrizations = scenario.parametrize(file)
    skips = [
        pytest.mark.skip(reason=f"{state.config_path}: {p.skip_reason}") for p in parametrizations if p.skip_reason
    ]
    metafunc.parametrize(
        ENGINE_FIXTURE, [pytest.param(s, id=s.id, marks=marks + skips) for s in specs], indirect=True, scope="session"
    )
    for p in parametrizations:
        metafunc.parametrize(p.argname, p.values, ids=p.ids)


def _device_skip(item: pytest.Item, platform: Platform) -> str | None:
    for device in DEVICE_TYPES:
        if item.get_closest_marker(device) and platform.device_type != device:
            note = f"; {platform.note}" if platform.note else ""
            return f"needs vLLM's {device} platform; this host runs {platform.device_type}{note}"
    return None


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = config.stash[STATE]
    bench_items = [i for i in items if ENGINE_FIXTURE in getattr(i, "fixturenames", ())]
    if state.problems:
        raise _usage_error(state.problems)
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
        reason = _device_skip(item, state.platform)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
    runnable = [i for i in bench_items if not _device_skip(i, state.platform)]
    if not runnable:
        if bench_items:
            state.skip_reason = _device_skip(bench_items[0], state.platform)
        return
    _stop_on_sigterm(state)
    scenarios = {_scenario(i) for i in runnable}
    try:
        for scenario in scenarios:
            check_declared(scenario.name, scenario.columns | scenario.maybe_columns)
    except SchemaError as exc:
        raise _usage_error([str(exc)]) from None
    selected = [i.callspec.params[ENGINE_FIXTURE] for i in runnable]
    refused = target_problems(state.config_path, state.file, state.target, selected)
    if refused:
        raise _usage_error(refused)
    try:
        state.config = resolve_config(
            state.config_path,
            state.file,
            needs_lora=any(s.needs_adapters for s in scenarios),
            output=state.output,
            check_vllm_args=state.backend.checks_vllm_args,
        )
    except ConfigError as exc:
        raise _usage_error(exc.problems) from None
    state.progress = _run_progress(runnable, state.file)
    _say(config, state.progress.first_guess())


def _backend(config: pytest.Config, state: BenchState) -> Any:
    """A server target's backend; else what the ``pytest_lorabench_backend`` hook gives (a
    stand-in, say), else in-process vLLM."""
    if state.target.over_http:
        from lorabench.http.backend import HttpBackend  # aiohttp: imported only when a server is the target

        return HttpBackend(state.target, state.file.device)
    return config.hook.pytest_lorabench_backend(config=config) or VllmBackend()


def _run_progress(items: list[pytest.Item], file: ConfigFile) -> RunProgress:
    params = [item.callspec.params for item in items]
    replays = sum(_scenario(i).replay_s(file, **p) for i, p in zip(items, params))
    return RunProgress(builds=len({p[ENGINE_FIXTURE] for p in params}), cases=len(items), trace_s=replays)


def _say(config: pytest.Config, line: str) -> None:
    """A line on the terminal now, whatever pytest captures (progress of a long run)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        # After a test's progress dot the line is not empty, whatever ensure_newline knows.
        if reporter._tw.width_of_current_line:
            reporter._tw.line()
        reporter.write_line(line)


def _usage_error(problems: list[str]) -> pytest.UsageError:
    return pytest.UsageError("lorabench: the benchmark configuration cannot run:\n  " + "\n  ".join(problems))


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
    if session.config.stash[STATE].refused:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    finish_session(session)


def _state_for_run(config: pytest.Config) -> BenchState:
    state = config.stash[STATE]
    if state.config is None:
        raise RuntimeError("lorabench: no resolved configuration; was the test collected with its engine parameter?")
    if state.writer is None:
        model = state.file.model if state.config.is_builtin_model else state.config.model.name
        state.provenance = provenance(config.rootpath, state.platform, model)
        state.writer = ResultWriter(
            state.config.results_dir, state.config.output, state.provenance["git_commit"], state.provenance["git_dirty"]
        )
        state.writer.keep_config(state.config.path)
    return state


@pytest.fixture(scope="session")
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """A running vLLM engine: one build of one engine configuration, shared by all its cases."""
    state = _state_for_run(request.config)
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
        eng.__enter__()
    except Exception as exc:  # noqa: BLE001 - fail this configuration's cases, keep the session
        reason = str(exc) if isinstance(exc, EngineBuildError) else f"{type(exc).__name__}: {exc}"
        failure = f"engine configuration {spec.id} failed to build: {reason}"
    if failure:
        pytest.fail(failure, pytrace=False)
    state.built.append((spec.id, eng.build_s))
    try:
        yield eng
    finally:
        try:
            eng.close()
        except DeviceNotReleased as exc:
            state.unreleased = f"the device memory of {spec.id} was not released: {exc}"
        state.rss_after_teardown.append((spec.id, tree_rss_bytes() / MIB))
        if eng.memory.note:
            state.memory_notes.append(f"{spec.id}: {eng.memory.note}")
        if state.progress is not None:
            _say(request.config, state.progress.build_done())


@pytest.fixture
def lorabench(request: pytest.FixtureRequest, benchmark: Any) -> BenchCase:
    """Runs one case on the engine it is given and records it; see ``BenchCase.run``."""
    state = _state_for_run(request.config)
    return BenchCase(
        config=state.config,
        benchmark=benchmark,
        writer=state.writer,
        provenance=state.provenance,
        scenario=_scenario(request.node),
        test_id=request.node.nodeid,
        digests=state.digests,
        progress=lambda line: _say(request.config, line),
    )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    lines = []
    if state.skip_reason:
        lines.append(f"benchmark cases {'refused' if state.refused else 'skipped'}: {state.skip_reason}")
    if state.built:
        builds = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in state.built)
        lines.append(f"engine builds: {len(state.built)} ({builds})")
    if state.rss_after_teardown:
        rss = ", ".join(f"{mib:.0f}" for _, mib in state.rss_after_teardown)
        lines.append(f"process tree RSS after each engine shut down (MiB): {rss}")
    if state.unreleased:
        lines.append(state.unreleased)
    lines += [f"peak memory of {note}" for note in state.memory_notes]
    if state.writer is not None and state.writer.log_dir.is_dir():
        lines.append(f"engine logs: {state.writer.log_dir}")
    if state.writer is not None and state.writer.rows:
        lines.append(format_summary(state.writer.rows))
        if state.writer.by_rank:
            lines.append(format_rank_summary(state.writer.by_rank))
        lines += for_session(state.writer.rows)
        lines += [f"results: {state.writer.path}", f"samples: {state.writer.samples_path}"]
    if state.report is not None:
        lines.append(f"report: {state.report}")
    for title, section in (("lorabench", lines), ("lorabench compare", state.comparison)):
        if section:
            terminalreporter.write_sep("=", title)
            for line in section:
                terminalreporter.write_line(line)
