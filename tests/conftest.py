"""Fixtures for lorabench's own tests; plain helpers live in ``tests/helpers.py``."""

from __future__ import annotations

import gc
import importlib
import time
from pathlib import Path

import pytest

# pytester's in-process runs drop the modules they imported, and torch (imported when the
# plugin asks vLLM for the platform's device type, no device touched) cannot be imported
# twice in one process: the second import fails, and the interpreter crashes at exit.
# Imported once here, it stays for every in-process run. vLLM's own modules are imported
# before the first in-process run (``_vllm_outside_runs``), for the same reason.
import torch  # noqa: F401

from lorabench import builtin
from tests.helpers import write_json

gc.freeze()  # torch's objects, out of the full collections while the tests are collected too

# Where the built-in model and adapters are cached for this user, read before pytester
# points HOME at its temporary folder.
USER_CACHE = builtin.cache_dir()
# A full garbage collection slower than this freezes the heap again (pytest_runtest_teardown).
SLOW_FULL_COLLECTION_S = 0.01
_FULL_COLLECTIONS = {"started": 0.0, "slow": False}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Leave what is loaded by now (torch, pandas, the plugin, the tests) out of every
    later garbage collection: each engine's shutdown runs a full one (``Engine.close``), which
    over these objects took 0.14 s a stand-in run here, 2 ms with them frozen. They are
    modules, classes and functions that live as long as the process anyway."""
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
    to them (``lorabench.replay._frozen_heap``). What is frozen is never collected: memory a
    session of tests can spare."""
    if _FULL_COLLECTIONS["slow"]:
        _FULL_COLLECTIONS["slow"] = False
        gc.collect()
        gc.freeze()


@pytest.fixture(autouse=True)
def _user_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep in-process pytester runs on the user's cache: under pytester's HOME they would
    build the model again, importing torch anew after pytester dropped it from sys.modules."""
    monkeypatch.setenv("LORABENCH_CACHE_DIR", str(USER_CACHE))


@pytest.fixture(scope="session")
def _vllm_outside_runs(request: pytest.FixtureRequest) -> None:
    """What an in-process run on the real backend imports from vLLM, imported outside any run
    (once, before the first pytester test): the platform (``detect_platform``) and, where the
    cache has no entry yet, the engine arguments' module (``lorabench.vllm_args``).

    Imported inside a run, vLLM's modules are dropped after it, and importing them again
    registers their torch types a second time, which fails ("... is already registered"):
    platform detection then reports a failure and a config check an install that does not
    import. Which test imported them first depended on the order, and under pytest-xdist on
    which worker ran what."""
    from lorabench.device import detect_platform
    from lorabench.vllm_args import engine_arg_names

    detect_platform()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LORABENCH_CACHE_DIR", str(USER_CACHE))
        try:
            engine_arg_names()
            if any(item.get_closest_marker("engine") for item in request.session.items):
                # A session that builds engines in this process imports the engine's modules
                # (vllm.engine.arg_utils, and with it vllm.distributed's custom ops) anyway: here,
                # before any run, so that no run drops them and the next build registers them twice.
                importlib.import_module("vllm.engine.arg_utils")
        except Exception:  # noqa: BLE001 - no vLLM, or one that does not import: the tests say so
            pass


@pytest.fixture
def pytester(_vllm_outside_runs: None, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester, with vLLM imported outside its runs (``_vllm_outside_runs``), and whose runs
    are sessions of their own even when this one runs under pytest-xdist: a worker's
    environment says it is one (PYTEST_XDIST_WORKER), and the runs it starts inherit that.
    pytest-benchmark then turned itself off, timing each case once and unwarmed, and the
    rounds, samples and requests the tests count came out otherwise."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    return pytester


@pytest.fixture
def tiny_config(tmp_path: Path):
    """Write a small, valid config (built-in model, generated adapters) and return a writer
    that applies overrides: ``tiny_config(matrix={"rounds": 2})``."""

    def make(**overrides: object) -> Path:
        data: dict = {
            "model": "builtin:tiny-llama",
            "adapters": {"generate": {"count": 4, "ranks": [8, 16], "target_modules": ["q_proj", "v_proj"]}},
            "prompts": "prompts.json",
            "results_dir": "results",
            "engine": {
                "max_loras": [1, 2],
                "max_lora_rank": 16,
                "max_cpu_loras": 4,
                "max_model_len": 128,
                "max_num_seqs": 8,
            },
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
            "matrix": {
                "batch_sizes": [2],
                "workloads": ["distinct", "identical"],
                "output_len": 4,
                "warmup_rounds": 0,
                "rounds": 1,
                "builds": 1,
                "seed": 0,
            },
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        write_json(tmp_path / "prompts.json", ["Say hello.", "Count to three.", "Name a colour."])
        return write_json(tmp_path / "common.json", data)

    return make
