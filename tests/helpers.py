"""Helpers for lorabench's own tests: paths, JSON files, and valid records to vary."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from lorabench.results.records import (
    Sample,
    result_files,  # noqa: F401  (the tests' way to find a run's files)
)
from lorabench.results.schema import ResultRow
from lorabench.scenarios.batch import METRIC_COLUMNS

ROOT = Path(__file__).resolve().parent.parent


def generate_adapters(folder: Path, count: int, ranks: str, seed: int = 0) -> Path:
    """Adapters as an NPU user makes them, with `lorabench adapters generate`; the
    adapters.json a config points at."""
    from lorabench.cli import main as cli

    args = ["adapters", "generate", "--base", "builtin:tiny-llama", "--out", str(folder), "--count", str(count)]
    assert cli.main([*args, "--ranks", ranks, "--target-modules", "q_proj,v_proj", "--seed", str(seed)]) == 0
    return folder / "adapters.json"


def write_tiny_config(folder: Path, **overrides: object) -> Path:
    """A small, valid config in ``folder`` (built-in model, generated adapters, 3 prompts), with
    ``overrides`` applied: a dict merges into its block, anything else replaces the key."""
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
    write_json(folder / "prompts.json", ["Say hello.", "Count to three.", "Name a colour."])
    return write_json(folder / "common.json", data)


def load_script(name: str) -> Any:
    """``scripts/NAME.py`` as a module: the scripts are no package, and their tests call their
    functions. Registered once under its name (a script's dataclasses look their module up there,
    and a script may import another)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


def make_row(**values: Any) -> ResultRow:
    """A complete multi-LoRA batch row; ``values`` override any column."""
    fields: dict[str, Any] = {
        "timestamp": "2026-11-22T06:00:00Z",
        "run_id": "run-1",
        "git_commit": "abc",
        "git_dirty": False,
        "hostname": "h",
        "device_type": "cpu",
        "device_name": "cpu",
        "vllm_version": "0.32.0",
        "vllm_ascend_version": "",
        "torch_version": "2.13.0",
        "torch_npu_version": "",
        "toolkit_version": "",
        "driver_version": "",
        "firmware_version": "",
        "model": "builtin:tiny-llama",
        "scenario": "multilora",
        "workload": "distinct",
        "batch_size": 2,
        "input_len": 16,
        "output_len": 4,
        "num_adapters": 2,
        "enable_lora": True,
        "max_loras": 2,
        "max_lora_rank": 16,
        "max_cpu_loras": 4,
        "rounds": 1,
        "measured_s": 0.5,
        **{column: 1.5 for column in METRIC_COLUMNS},
        "baseline_e2e_ms": 1.0,
        "lora_overhead": 1.5,
        "timed_adapter_loads": 0,
        "warmup_rounds": 0,
        "engine_id": "loras2-rank16-cpu4-build0",
        "build": 0,
        "adapter_load_ms": 1.0,
        "engine_build_s": 5.0,
        "kv_cache_tokens": 1024,
        "compilation_mode": "NONE",
        "cudagraph_mode": "NONE",
        "peak_memory_mb": 700.0,
        "memory_source": "rss",
        "test_id": "t",
    }
    fields.update(values)
    return ResultRow(**fields)


def make_sample(**values: Any) -> Sample:
    fields: dict[str, Any] = {
        "round": 0,
        "request": 0,
        "adapter": "a",
        "adapter_rank": 8,
        "prompt_tokens": 16,
        "output_tokens": 4,
        "queue_ms": 0.1,
        "ttft_ms": 3.0,
        "decode_ms": 1.0,
        "request_e2e_ms": 6.0,
        "prefill_ms": 2.9,
        "batch_e2e_ms": 7.0,
    }
    fields.update(values)
    return Sample(**fields)


def on_the_stand_in(pytester: Any) -> None:
    """pytester's sessions build the stand-in engine (a conftest of its folder's hook), on a
    virtual clock: for tests of what the plugin collects and refuses, which need no vLLM."""
    pytester.makeconftest(
        "from lorabench.targets.standin import StandIn\n\n\n"
        "def pytest_lorabench_backend(config):\n    return StandIn(virtual_clock=True)\n"
    )


def mooncake_like(path: Path, requests: int, seed: int, block: int = 32, system_blocks: int = 2) -> Path:
    """Three users, each request with one of two long system prompts (``system_blocks``
    blocks of ``block`` tokens) and a question of its own (ids of its own, 1 to 40 tokens
    past the system prompt), one every 100 ms."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(requests):
        system = int(rng.integers(2))
        rows.append(
            {
                "timestamp": 100 * k,
                "input_length": system_blocks * block + int(rng.integers(1, min(block, 40) + 1)),
                "output_length": 4,
                "hash_ids": [10 * b + system for b in range(1, system_blocks + 1)] + [1000 + k, 2000 + k],
                "user": f"u{k % 3}",
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def default_config(folder: Path) -> Path:
    """The repository's default config, its results in ``folder``."""
    data = json.loads((ROOT / "config" / "common.json").read_text())
    shutil.copyfile(ROOT / "config" / "prompts.json", folder / "prompts.json")
    return write_json(folder / "common.json", {**data, "results_dir": str(folder / "results")})
