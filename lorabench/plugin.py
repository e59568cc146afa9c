"""The pytest plugin: options, marks, parametrization, the engine fixture and the summary.

Two fixtures, after pytest-httpserver: ``engine`` is the expensive, session-scoped
resource (one ``vllm.LLM`` per build of an engine configuration, shut down before the
next is built), and ``lorabench`` is the cheap per-test handle that runs one case.

The plugin is installed for every pytest run in the environment, so it stays inert
(no config read, no vLLM import) unless a collected test asks for ``engine``.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from lorabench import compare
from lorabench.case import SCENARIOS, BenchCase
from lorabench.config import BenchConfig, ConfigError, ConfigFile, read_config_file, resolve_config
from lorabench.device import DEVICE_TYPES, Platform, detect_platform
from lorabench.engine import Engine, EngineBuildError
from lorabench.memory import MIB, DeviceNotReleased, tree_rss_bytes
from lorabench.results import ResultWriter, format_summary, provenance

ENGINE_FIXTURE = "engine"


@dataclass
class BenchState:
    """Everything the plugin keeps for one pytest session (in ``config.stash``)."""

    config_path: Path
    output: str | None
    builds: int | None  # --bench-builds: overrides the config's matrix.builds
    file: ConfigFile | None = None
    config: BenchConfig | None = None
    problems: list[str] = field(default_factory=list)
    platform: Platform | None = None
    skip_reason: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    writer: ResultWriter | None = None
    built: list[tuple[str, float]] = field(default_factory=list)
    rss_after_teardown: list[tuple[str, float]] = field(default_factory=list)
    previous_sigterm: Any = None
    comparison: list[str] = field(default_factory=list)
    # Set when an engine's device memory did not come back after shutdown: later builds
    # would run on a partly held device, so they fail with this reason instead.
    unreleased: str | None = None

    def read_file(self) -> ConfigFile | None:
        if self.file is None and not self.problems:
            try:
                self.file = read_config_file(self.config_path)
            except ConfigError as exc:
                self.problems.extend(exc.problems)
        return self.file


STATE = pytest.StashKey[BenchState]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lorabench", "multi-LoRA benchmarks on vLLM")
    group.addoption(
        "--bench-config",
        metavar="PATH",
        help="benchmark configuration (JSON); default: the bench_config ini value, config/common.json",
    )
    parser.addini("bench_config", "benchmark configuration file, relative to the rootdir", default="config/common.json")
    group.addoption(
        "--bench-output",
        metavar="PATH",
        help="append results to this CSV instead of a new file per run under the config's results_dir",
    )
    parser.addini("bench_output", "fixed results CSV, relative to the rootdir (default: a new file per run)", default="")
    group.addoption(
        "--bench-builds",
        metavar="N",
        type=int,
        help="build each engine configuration N times (default: the config's matrix.builds); "
        "`lorabench compare` needs 2 or more a side to test a change",
    )
    parser.addini("bench_builds", "engine builds per configuration, overriding the config's matrix.builds", default="")
    group.addoption(
        "--bench-compare",
        metavar="BASE",
        help="at the end, compare this run's results with BASE (a result CSV), as `lorabench compare` does",
    )
    parser.addini("bench_compare", "result CSV to compare each run with, relative to the rootdir", default="")
    group.addoption(
        "--bench-compare-fail",
        action="store_true",
        default=None,
        help="fail the session when --bench-compare finds a regression",
    )
    parser.addini("bench_compare_fail", "fail the session when the comparison finds a regression", type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    for device in DEVICE_TYPES:
        config.addinivalue_line("markers", f"{device}: needs vLLM's {device} platform; skipped elsewhere")
    config.addinivalue_line(
        "markers", f"scenario(name): a lorabench benchmark; name is one of {', '.join(SCENARIOS)}"
    )
    cli_config = config.getoption("bench_config")
    config_path = Path(cli_config) if cli_config else config.rootpath / config.getini("bench_config")
    cli_output = config.getoption("bench_output")
    ini_output = config.getini("bench_output")
    output = cli_output or (str(config.rootpath / ini_output) if ini_output else None)
    builds = config.getoption("bench_builds")
    source = f"--bench-builds {builds}"
    ini_builds = config.getini("bench_builds")
    if builds is None and ini_builds:
        source = f"{config.inipath}: ini option bench_builds = {ini_builds}"
        try:
            builds = int(ini_builds)
        except ValueError:
            raise pytest.UsageError(f"lorabench: {source}: expected a whole number such as 2") from None
    if builds is not None and builds < 1:
        raise pytest.UsageError(f"lorabench: {source}: an engine configuration is built at least once; use 1 or more")
    config.stash[STATE] = BenchState(config_path=config_path.resolve(), output=output, builds=builds)


def _scenario(definition: pytest.Function, problems: list[str]) -> str | None:
    marker = definition.get_closest_marker("scenario")
    name = marker.args[0] if marker and marker.args else None
    if name not in SCENARIOS:
        problems.append(
            f"{definition.nodeid}: uses the '{ENGINE_FIXTURE}' fixture, so it needs "
            f"@pytest.mark.scenario(NAME) with NAME one of {', '.join(SCENARIOS)} (got {name!r})"
        )
        return None
    return name


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
    online = scenario == "online"
    builds = state.builds or file.matrix.builds
    # Build-major order: a configuration's builds are spread over the run, not back to back.
    specs = [
        dataclasses.replace(s, online=online, build=b)
        for b in range(builds)
        for s in file.engine_specs(with_lora_off=scenario == "no_lora")
    ]
    if online:
        cases = file.online_cases()
        if not cases:
            marks = [*marks, pytest.mark.skip(reason=f"{state.config_path} has no 'online' suites")]
        metafunc.parametrize("online_case", cases or [None], ids=[c.id for c in cases] or ["no-suites"])
    metafunc.parametrize(
        ENGINE_FIXTURE, [pytest.param(s, id=s.id, marks=marks) for s in specs], indirect=True, scope="session"
    )
    if "workload" in metafunc.fixturenames:
        metafunc.parametrize("workload", file.matrix.workloads)
    if "batch_size" in metafunc.fixturenames:
        metafunc.parametrize("batch_size", file.matrix.batch_sizes, ids=[f"bs{b}" for b in file.matrix.batch_sizes])


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
    state.platform = detect_platform()
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
    needs_lora = any(i.get_closest_marker("scenario").args[0] != "no_lora" for i in runnable)
    try:
        state.config = resolve_config(state.config_path, state.file, needs_lora=needs_lora, output=state.output)
    except ConfigError as exc:
        raise _usage_error(exc.problems) from None


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


@pytest.hookimpl(tryfirst=True)  # before the terminal reporter prints its summary
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    state = config.stash[STATE]
    ini_base = config.getini("bench_compare")
    base = config.getoption("bench_compare") or (str(config.rootpath / ini_base) if ini_base else None)
    if not base or state.writer is None or state.writer.path is None:
        return
    fail = config.getoption("bench_compare_fail")
    fail = config.getini("bench_compare_fail") if fail is None else fail
    try:
        result = compare.compare(compare.load_run(compare.split_paths(base)), compare.load_run(state.writer.path))
    except compare.CompareError as exc:
        state.comparison = [f"cannot compare with {base}: {exc}"]
        if fail:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    state.comparison = compare.render_text(result).splitlines()
    if fail and result.regressions:
        state.comparison.append(f"{len(result.regressions)} regressions: the session fails (--bench-compare-fail)")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
    return state


@pytest.fixture(scope="session")
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """A running vLLM engine: one build of one engine configuration, shared by all its cases."""
    state = _state_for_run(request.config)
    spec = getattr(request, "param", None)
    if spec is None:
        raise RuntimeError(f"lorabench: '{ENGINE_FIXTURE}' is parametrized by the plugin; mark the test with @pytest.mark.scenario")
    if state.unreleased:
        pytest.fail(f"engine configuration {spec.id} not built: {state.unreleased}", pytrace=False)
    eng = Engine(state.config, spec, state.platform.device_type, log_path=state.writer.log_dir / f"{spec.id}.log")
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


@pytest.fixture
def lorabench(request: pytest.FixtureRequest, benchmark: Any) -> BenchCase:
    """Runs one case on the engine it is given and records it; see ``BenchCase.run``."""
    state = _state_for_run(request.config)
    marker = request.node.get_closest_marker("scenario")
    return BenchCase(
        config=state.config,
        benchmark=benchmark,
        writer=state.writer,
        provenance=state.provenance,
        scenario=marker.args[0],
        test_id=request.node.nodeid,
    )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    lines = []
    if state.skip_reason:
        lines.append(f"benchmark cases skipped: {state.skip_reason}")
    if state.built:
        builds = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in state.built)
        lines.append(f"engine builds: {len(state.built)} ({builds})")
    if state.rss_after_teardown:
        rss = ", ".join(f"{mib:.0f}" for _, mib in state.rss_after_teardown)
        lines.append(f"process tree RSS after each engine shut down (MiB): {rss}")
    if state.unreleased:
        lines.append(state.unreleased)
    if state.writer is not None and state.writer.log_dir.is_dir():
        lines.append(f"engine logs: {state.writer.log_dir}")
    if state.writer is not None and state.writer.rows:
        lines += [format_summary(state.writer.rows), f"results: {state.writer.path}", f"samples: {state.writer.samples_path}"]
    for title, section in (("lorabench", lines), ("lorabench compare", state.comparison)):
        if section:
            terminalreporter.write_sep("=", title)
            for line in section:
                terminalreporter.write_line(line)
