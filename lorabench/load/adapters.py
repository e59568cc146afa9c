"""LoRA adapters: the ``adapters.json`` list, and dummy adapters for any Llama-like base.

Dummy adapters have random weights in PEFT layout. Their outputs are meaningless,
but their cost in the engine is that of a real adapter of the same rank and target
modules, which is all a latency benchmark needs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
B_SCALE = 0.1
# Changes whenever the dummy weights would; part of the built-in cache's key.
GENERATOR_VERSION = f"randn-b{B_SCALE}"


@dataclass(frozen=True)
class Adapter:
    name: str
    path: Path
    prompt: str = ""
    rank: int | None = None  # from adapter_config.json, once the configuration is resolved
    # Its greedy output may equal the base model's (a lightly trained adapter, PEFT's zero-initialised
    # B): the output check then records it and does not fail the build (lorabench.measure.correctness).
    same_as_base: bool = False


def read_adapters_file(path: Path) -> list[Adapter]:
    """Read ``adapters.json``: a list of ``{"name", "path", "prompt", "same_as_base"}``; paths
    relative to the file."""
    if not path.is_file():
        raise ValueError(
            f"adapters file {path} not found: fix the path, or generate one with `lorabench adapters generate`"
        )
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a JSON list of adapters, got {type(entries).__name__}")
    adapters, seen = [], set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not {"name", "path"} <= entry.keys():
            raise ValueError(f"{path}: entry [{i}] needs at least 'name' and 'path', got {entry!r}")
        unknown = entry.keys() - {"name", "path", "prompt", "same_as_base"}
        if unknown:
            raise ValueError(
                f"{path}: entry [{i}] has unknown keys {sorted(unknown)}: allowed are name, path, prompt, same_as_base"
            )
        if not all(isinstance(entry.get(k, ""), str) for k in ("name", "path", "prompt")):
            raise ValueError(f"{path}: entry [{i}]: name, path and prompt must be strings, got {entry!r}")
        if not isinstance(entry.get("same_as_base", False), bool):
            raise ValueError(
                f"{path}: entry [{i}] ({entry['name']}): same_as_base is {entry['same_as_base']!r}: give true or false"
            )
        if entry["name"] in seen:
            raise ValueError(f"{path}: entry [{i}] repeats the adapter name {entry['name']!r}: names must be unique")
        seen.add(entry["name"])
        adapter_path = Path(entry["path"]).expanduser()
        if not adapter_path.is_absolute():
            adapter_path = (path.parent / adapter_path).resolve()
        adapters.append(
            Adapter(entry["name"], adapter_path, entry.get("prompt", ""), None, entry.get("same_as_base", False))
        )
    return adapters


def read_rank(adapter_dir: Path) -> int:
    """The rank ``r`` in ``adapter_config.json``, after checking the adapter is complete."""
    config = adapter_dir / "adapter_config.json"
    if not adapter_dir.is_dir():
        raise ValueError(f"adapter directory {adapter_dir} does not exist: fix its 'path'")
    if not config.is_file():
        raise ValueError(f"{adapter_dir} has no adapter_config.json: is it a PEFT LoRA adapter?")
    if not any((adapter_dir / f).is_file() for f in WEIGHT_FILES):
        raise ValueError(f"{adapter_dir} has no weights ({' or '.join(WEIGHT_FILES)})")
    try:
        rank = json.loads(config.read_text())["r"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"{config}: no integer rank 'r' in it") from None
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{config}: rank 'r' must be a positive integer, got {rank!r}")
    return rank


def module_shapes(base_config: dict, target_modules: Sequence[str]) -> dict[str, tuple[str, int, int]]:
    """``module -> (block, in_features, out_features)`` for a Llama-like decoder layer."""
    hidden = base_config["hidden_size"]
    heads = base_config["num_attention_heads"]
    kv_heads = base_config.get("num_key_value_heads", heads)
    head_dim = base_config.get("head_dim") or hidden // heads
    inter = base_config["intermediate_size"]
    known = {
        "q_proj": ("self_attn", hidden, heads * head_dim),
        "k_proj": ("self_attn", hidden, kv_heads * head_dim),
        "v_proj": ("self_attn", hidden, kv_heads * head_dim),
        "o_proj": ("self_attn", heads * head_dim, hidden),
        "gate_proj": ("mlp", hidden, inter),
        "up_proj": ("mlp", hidden, inter),
        "down_proj": ("mlp", inter, hidden),
    }
    unknown = [m for m in target_modules if m not in known]
    if unknown:
        raise ValueError(f"unknown target modules {unknown}: choose from {', '.join(known)}")
    return {m: known[m] for m in target_modules}


def dummy_name(rank: int, index: int) -> str:
    return f"dummy-lora-rank-{rank}-{index}"


def write_dummy_adapter(
    out: Path, base_config: dict, rank: int, target_modules: Sequence[str], seed: int, dtype: str = "bfloat16"
) -> None:
    """Write one PEFT adapter with random weights.

    With A ~ N(0, 1/fan_in) and B ~ N(0, B_SCALE**2 / rank), the update ``B @ A @ x`` of a
    normalized input has entries of about ``B_SCALE``: large enough that every adapter
    changes a model's greedy output (the correctness guard checks that it does), small
    enough to keep activations finite.
    """
    import torch
    from safetensors.torch import save_file

    shapes = module_shapes(base_config, target_modules)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(base_config["num_hidden_layers"]):
        for module, (block, fan_in, fan_out) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) / fan_in**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) / rank**0.5 * B_SCALE
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.to(getattr(torch, dtype)).contiguous() for k, v in tensors.items()},
        str(out / "adapter_model.safetensors"),
    )
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(target_modules),
        "base_model_name_or_path": base_config.get("_name_or_path", ""),
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")


def generate_dummy_adapters(
    base_config_path: Path,
    out_dir: Path,
    *,
    count: int,
    ranks: Sequence[int],
    target_modules: Sequence[str],
    prompts: Sequence[str],
    seed: int = 0,
    dtype: str = "bfloat16",
) -> list[Adapter]:
    """Write ``count`` adapters whose ranks cycle through ``ranks`` (as S-LoRA's S2/S4 settings),
    named ``dummy-lora-rank-R-I``, plus the matching ``adapters.json``."""
    base_config = json.loads(Path(base_config_path).read_text())
    module_shapes(base_config, target_modules)  # fail before writing anything
    out_dir.mkdir(parents=True, exist_ok=True)
    adapters = []
    for k in range(count):
        rank = ranks[k % len(ranks)]
        name = dummy_name(rank, k // len(ranks))
        write_dummy_adapter(out_dir / name, base_config, rank, target_modules, seed=seed * 100_003 + k, dtype=dtype)
        adapters.append(Adapter(name, out_dir / name, prompts[k % len(prompts)] if prompts else ""))
    entries = [{"name": a.name, "path": a.name, "prompt": a.prompt} for a in adapters]
    (out_dir / "adapters.json").write_text(json.dumps(entries, indent=2, ensure_ascii=False) + "\n")
    return adapters
