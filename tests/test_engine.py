"""The engine on the CPU, checked on real engines: placement and build failures."""

import os
import shutil

import psutil
import pytest

from lorabench.config import EngineSpec, read_config_file, resolve_config
from lorabench.load import builtin
from lorabench.targets.engine import Engine
from lorabench.targets.failures import EngineBuildError
from lorabench.targets.vllm_args import engine_arg_names

pytestmark = pytest.mark.engine


def thread_cpus(process: psutil.Process) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(t.id)) for t in process.threads()}


@pytest.mark.vllm_processes  # vLLM's own layout: a spawned worker
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 or more cores to keep apart")
def test_engine_core_and_front_end_stay_off_the_workers_cores(tiny_config):
    """vLLM binds its CPU worker to some cores; lorabench keeps this process and the
    engine core on the others while the engine lives, and gives this process all of its
    cores back at shutdown, so the next build's worker sees them all. Eager: a lora-off
    build otherwise spends 8 s tracing the model for torch.compile, which placement does not need."""
    path = tiny_config()
    config = resolve_config(path, read_config_file(path), needs_lora=False, engine_args=engine_arg_names)
    allowed = set(os.sched_getaffinity(0))
    with Engine(config, EngineSpec(enable_lora=False, enforce_eager=True), "cpu") as engine:
        workers = [p for p in engine._processes if "Worker" in p.name()]
        cores = [p for p in engine._processes if "EngineCore" in p.name()]
        assert workers and cores, [p.name() for p in engine._processes]
        worker_cpus = set().union(*(set(p.cpu_affinity()) for p in workers))
        assert worker_cpus < allowed
        rest = frozenset(allowed - worker_cpus)
        for process in [psutil.Process(), *cores]:
            assert thread_cpus(process) == {rest}, process.name()
    assert thread_cpus(psutil.Process()) == {frozenset(allowed)}


def test_a_corrupt_weight_file_fails_the_build_with_its_cause(tiny_config, tmp_path):
    """vLLM's own exception says only "see root cause above"; the cause is in the engine
    processes' output, which lorabench keeps in the build's log and puts in the failure."""
    model = tmp_path / "corrupt"
    shutil.copytree(builtin.ensure_model("tiny-llama"), model)
    (model / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    path = tiny_config(model=str(model))
    config = resolve_config(path, read_config_file(path), needs_lora=False, engine_args=engine_arg_names)
    log = tmp_path / "logs" / "lora-off-build0.log"
    with pytest.raises(EngineBuildError) as failure:
        Engine(config, EngineSpec(enable_lora=False), "cpu", log_path=log).__enter__()
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith("safetensors._safetensors_rust.SafetensorError: Error while deserializing header"), (
        message
    )
    assert f"(engine log: {log})" in message and log.is_file()
    assert not [p for p in psutil.Process().children(recursive=True) if "EngineCore" in p.name()]
