"""scripts/repro_reload_in_place.py's set-up path: the config's engine settings and ``env`` as
the plugin applies them, and a build that fails as one line. vLLM is a fake here (its import
alone costs seconds); the reproduction itself runs on the real engine in the engine tier."""

from __future__ import annotations

import argparse
import os
import sys
import types
from dataclasses import replace

import pytest

from lorabench.config import engine_specs, read_config_file, resolve_config
from lorabench.targets.engine_env import engine_environment
from tests.helpers import load_script


@pytest.fixture(scope="module")
def repro():
    return load_script("repro_reload_in_place")


def test_the_engine_is_built_as_the_plugin_builds_the_configs_first_lora_configuration(repro, tiny_config):
    path = tiny_config(env={"VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "1"})
    kwargs, env, adapters = repro.engine_settings(path)
    file = read_config_file(path)
    spec = replace(engine_specs(file, with_lora_off=False)[0], enable_prefix_caching=True)
    assert kwargs == resolve_config(path, file, needs_lora=True).llm_kwargs(spec)
    assert kwargs["max_loras"] == 1 and kwargs["enable_prefix_caching"] is True
    assert env == {**engine_environment(file.env, "cpu"), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and len(adapters) == 4


def test_a_build_that_fails_is_one_line_with_vllms_cause(repro, tiny_config, monkeypatch, capsys):
    seen = {}

    def refuse(**kwargs):
        seen["kv"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        raise ValueError("Available memory on node 0 (12.56/14.09 GiB) is less than desired\nsecond line")

    fake = types.ModuleType("vllm")
    fake.__version__, fake.LLM = "0.0.fake", refuse
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert repro.main(argparse.Namespace(config=tiny_config())) == 2
    err = capsys.readouterr().err
    cause = "ValueError: Available memory on node 0 (12.56/14.09 GiB) is less than desired"
    assert err == f"vLLM 0.0.fake did not start: {cause}\n"
    assert seen["kv"] == "1"  # the config's env was applied for the build
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ  # and taken back after it


def test_bad_input_is_one_line_per_problem_before_vllm(repro, tiny_config, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # an import would fail the test
    one = {"adapters": {"generate": {"count": 1}}}
    path = tiny_config(**one)
    assert repro.main(argparse.Namespace(config=path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{path}: field 'matrix.batch_sizes'")  # the config's own check
    path = tiny_config(**one, matrix={"batch_sizes": [1], "workloads": ["identical"]})
    assert repro.main(argparse.Namespace(config=path)) == 2
    assert capsys.readouterr().err == f"{path}: adapters: the reproducer needs 2, the config has 1\n"
