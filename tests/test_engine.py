"""The engine's placement on the CPU, checked on a real engine."""

import os

import psutil
import pytest

from lorabench.config import EngineSpec, read_config_file, resolve_config
from lorabench.engine import Engine


def thread_cpus(process: psutil.Process) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(t.id)) for t in process.threads()}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 or more cores to keep apart")
def test_engine_core_and_front_end_stay_off_the_workers_cores(tiny_config):
    """vLLM binds its CPU worker to some cores; lorabench keeps this process and the
    engine core on the others while the engine lives, and gives this process all of its
    cores back at shutdown, so the next build's worker sees them all."""
    path = tiny_config()
    config = resolve_config(path, read_config_file(path), needs_lora=False)
    allowed = set(os.sched_getaffinity(0))
    with Engine(config, EngineSpec(enable_lora=False), "cpu") as engine:
        workers = [p for p in engine._processes if "Worker" in p.name()]
        cores = [p for p in engine._processes if "EngineCore" in p.name()]
        assert workers and cores, [p.name() for p in engine._processes]
        worker_cpus = set().union(*(set(p.cpu_affinity()) for p in workers))
        assert worker_cpus < allowed
        rest = frozenset(allowed - worker_cpus)
        for process in [psutil.Process(), *cores]:
            assert thread_cpus(process) == {rest}, process.name()
    assert thread_cpus(psutil.Process()) == {frozenset(allowed)}
