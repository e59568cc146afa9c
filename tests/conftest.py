"""Fixtures for lorabench's own tests; plain helpers live in ``tests/helpers.py``."""

from __future__ import annotations

import compileall
import functools
import gc
import os
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _pytest import pytester as _pytester

import lorabench
from lorabench.load import builtin
from tests.engine_sessions import compare_session, replay_session, serve_session  # noqa: F401 - one run each
from tests.helpers import write_tiny_config

_INSTALLED = tuple({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})


def _location(module: object) -> str:
    """Where a module was loaded from: its file, or a namespace package's first folder. Read
    from its namespace, not with getattr: a lazy module (transformers') imports what an
    attribute it lacks names, and some of those imports fail."""
    namespace = getattr(module, "__dict__", {})
    return str(namespace.get("__file__") or next(iter(namespace.get("__path__") or ()), ""))


def _installed(name: str) -> bool:
    """A module of an installed package, by its own location or its top package's (a module
    made at run time, such as ``torch.ops``, has none)."""
    return any(_location(sys.modules.get(n)).startswith(_INSTALLED) for n in (name, name.partition(".")[0]))


class _KeepInstalledModules(_pytester.SysModulesSnapshot):
    """pytester drops what its in-process runs imported, so that each run imports the test
    files it wrote afresh. Installed packages must stay: torch and vLLM register operators,
    dynamo backends and config types in process-wide registries when imported, and a second
    import fails there ("duplicate name: dynamo_minifier_backend", "Tried to register an
    operator (vllm::all_reduce) multiple times"). Whichever test imported them first inside a
    run, every later engine build in this process failed so, depending on the order."""

    def __init__(self, preserve: Callable[[str], bool] | None = None) -> None:
        super().__init__(preserve=lambda name: _installed(name) or (preserve is not None and preserve(name)))


_pytester.SysModulesSnapshot = _KeepInstalledModules

# Where the built-in model and adapters are cached for this user, read before pytester
# points HOME at its temporary folder.
USER_CACHE = builtin.cache_dir()
# A full garbage collection slower than this freezes the heap again (pytest_runtest_teardown).
SLOW_FULL_COLLECTION_S = 0.01
_FULL_COLLECTIONS = {"started": 0.0, "slow": False}


# `pytest` alone, the quick loop, runs on this many pytest-xdist workers (the README's tests).
QUICK_LOOP_WORKERS = 2


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns -n into workers
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`pytest` alone, with no path or -m of its own, is the quick loop: on 2 workers, which
    on a 2-core host take about half the serial time (61 s against 118 s on the slow Xeon).
    Work stealing hands each worker half of the tests in file order and moves tests only to
    balance the end, so a module's tests mostly share one worker and what they import
    (matplotlib, the stand-in server): 59 s, against 63 s dealt test by test (``--dist load``)
    and 66 s file by file.
    Not in the config's addopts, since it would reach what must run in one process:
    `pytest -m engine` (one real engine at a time, builds shared through the session) and
    `pytest bench` (benchmark cases refuse xdist). A -n given, a path, or a -m
    of one's own runs as asked: `pytest -n 0` is the quick loop serially."""
    if hasattr(config, "workerinput") or getattr(config.option, "numprocesses", 0) is not None:
        return  # a worker; -n given; or no xdist installed (no such option)
    if config.args_source is not pytest.Config.ArgsSource.TESTPATHS or config.option.markexpr != "not engine":
        return
    if not (config.option.collectonly or config.option.usepdb):
        config.option.numprocesses = QUICK_LOOP_WORKERS
        config.option.dist = "worksteal"


def pytest_configure(config: pytest.Config) -> None:
    """Where the environment says not to write bytecode (PYTHONDONTWRITEBYTECODE, as these
    machines set it), compile lorabench's modules once before any test runs, as pip does for
    an installed package, and let every process a test starts (a `pytest` or `lorabench`
    process, a fleet worker, an A/B turn) keep its bytecode: otherwise each compiled the
    package's sources again and rewrote pytest's plugins (pytest-benchmark, xdist, anyio)
    for their asserts, 1.7 s against 1.2 s for a stand-in session on the AMD EPYC host.
    What they write stays in this checkout and its virtual environment."""
    if sys.dont_write_bytecode and not hasattr(config, "workerinput"):
        compileall.compile_dir(Path(lorabench.__file__).parent, quiet=1)
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> object:
    """Keep pytest's rewritten test modules in ``tests/__pycache__`` even where the environment
    says not to write bytecode: each worker rewrote all 65 again at every run (2.5 s of each
    worker's collection on the slow Xeon, 0.7 s from the cache). The first run writes them."""
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = saved


def pytest_collection_finish(session: pytest.Session) -> None:
    """Leave what is loaded by now (pandas, the plugin, the tests; torch where a real engine
    will run) out of every later garbage collection: each engine's shutdown runs a full one
    (``Engine.close``), which over these objects took 0.14 s a stand-in run here, 2 ms with
    them frozen. They are modules, classes and functions that live as long as the process
    anyway. torch is imported for that only where a real engine is selected: the quick loop
    never needs it, and it costs 2 s a process."""
    if any(item.get_closest_marker("engine") for item in session.items):
        import torch  # noqa: F401
    gc.freeze()


def _time_full_collections(phase: str, info: dict) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _FULL_COLLECTIONS["started"] = time.perf_counter()
    elif time.perf_counter() - _FULL_COLLECTIONS["started"] > SLOW_FULL_COLLECTION_S:
        _FULL_COLLECTIONS["slow"] = True


gc.callbacks.append(_time_full_collections)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After a test during which a full collection was slow, freeze again what is alive.

    What tests load later grows the heap a full collection walks: vLLM's platform (the first
    test that asks for it), matplotlib (the first report), modules of in-process runs. Left
    alone, the collections took 0.05-0.24 s each again, 7 s over the quick loop; now 1.4 s.
    It also keeps them short while a replay runs: the replay leaves a heap someone else froze
    to them (``lorabench.measure.replay._frozen_heap``). What is frozen is never collected: memory a
    session of tests can spare."""
    if _FULL_COLLECTIONS["slow"]:
        _FULL_COLLECTIONS["slow"] = False
        gc.collect()
        gc.freeze()


# vLLM's CPU platform runs its model worker in a process of its own, spawned by the engine
# core, unless VLLM_ENABLE_V1_MULTIPROCESSING is 0 (vllm/platforms/cpu.py); then the worker
# runs inside the engine core. Each build of the engine tier is then one interpreter that
# imports vLLM fewer: 2098 s against 2596 s for the tier on the AMD EPYC host
# (docs/lab/2026-11-measurements.md). What the tests check of lorabench (rows, verdicts,
# files, failures, the fleet's pinning) does not depend on where the worker runs; the tests
# that check vLLM's own process layout, or run a user's page literally, carry the
# `vllm_processes` marker and get vLLM's default. A value set in the environment is kept
# for the others.
WORKER_IN_ENGINE_CORE = "VLLM_ENABLE_V1_MULTIPROCESSING"
os.environ.setdefault(WORKER_IN_ENGINE_CORE, "0")


@pytest.fixture(autouse=True)
def _vllm_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's default process layout (a spawned worker) for a test marked ``vllm_processes``."""
    if request.node.get_closest_marker("vllm_processes"):
        monkeypatch.delenv(WORKER_IN_ENGINE_CORE, raising=False)


@pytest.fixture(autouse=True)
def _user_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep in-process pytester runs on the user's cache: under pytester's HOME they would
    build the model again, importing torch anew after pytester dropped it from sys.modules."""
    monkeypatch.setenv("LORABENCH_CACHE_DIR", str(USER_CACHE))


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a test starts (pytester's runs, a `pytest` or `lorabench` subprocess) is a session
    of its own even when this one runs under pytest-xdist (`pytest` alone runs on 2 workers):
    a worker's environment says it is one (PYTEST_XDIST_WORKER), and what it starts inherits
    that. pytest-benchmark then turned itself off, timing each case once and unwarmed (the
    rounds, samples and requests the tests count came out otherwise), and warned on stderr
    where a test reads one line of lorabench's."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def tiny_config(tmp_path: Path) -> Callable[..., Path]:
    """Write a small, valid config (built-in model, generated adapters) and return a writer
    that applies overrides: ``tiny_config(matrix={"rounds": 2})``."""
    return functools.partial(write_tiny_config, tmp_path)
