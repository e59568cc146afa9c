"""An adapter padded to a higher rank by lorabench, for the rank_padding canary
(docs/canaries.md): the same function as the adapter it pads, written as an adapter whose rank
is the engine's ``max_lora_rank``, so that vLLM pads nothing when it loads it; and a copy at
the adapter's own rank, which vLLM pads, so that both are loaded fresh, side by side, under
names of their own (an adapter the session evicted and reloaded before is not compared).

PEFT's LoRA adds ``B @ A * scaling`` to a layer, ``A`` of ``r`` rows, ``B`` of ``r`` columns,
``scaling`` = ``lora_alpha / r``. Rows of ``A`` and columns of ``B`` that are zero add nothing,
and ``lora_alpha`` scaled by ``rank / r`` keeps ``scaling``: the padded adapter is the same
function, and vLLM's buffers hold the same numbers for both, since vLLM zero-fills each slot's
``max_lora_rank`` rows before it copies an adapter in. An adapter whose scaling the padding
cannot keep exactly (rsLoRA, rank or alpha patterns, a float that does not divide back) is
refused with the reason: a reference that is only nearly the same function cannot judge
greedy answers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lorabench.load.adapters import Adapter
from lorabench.load.builtin import cache_dir, materialize

# Beside a padded adapter's files: which adapter it pads, from which rank (a reproducer names it).
PADDED_MARK = "lorabench-padded.json"
# Changes whenever a padded adapter's files would; part of its cache key.
PADDING_VERSION = 1
A_NAMES, B_NAMES = ("lora_A", "lora_embedding_A"), ("lora_B", "lora_embedding_B")


class CannotPad(ValueError):
    """The adapter cannot be padded to the same function exactly; the message says why."""


def padded_config(config: dict, rank: int) -> dict:
    """``adapter_config.json`` of the adapter padded to ``rank``: ``r`` and ``lora_alpha`` changed."""
    r, alpha = int(config["r"]), config.get("lora_alpha")
    if alpha is None:
        raise CannotPad("its adapter_config.json gives no lora_alpha, which vLLM needs")
    if rank == r:
        return config
    if config.get("use_rslora"):
        raise CannotPad("it uses rsLoRA (scaling lora_alpha / sqrt(r)), which padding cannot keep exactly")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise CannotPad("it sets rank_pattern or alpha_pattern: its modules' ranks differ")
    new_alpha = alpha * rank / r
    if new_alpha / rank != alpha / r:
        raise CannotPad(f"lora_alpha {alpha} at r {r} padded to {rank} does not keep its scaling exactly")
    return {**config, "r": rank, "lora_alpha": new_alpha}


def padded_adapter(adapter: Adapter, rank: int) -> Adapter:
    """``adapter`` padded to ``rank`` (at its own rank: a plain copy), written once into
    lorabench's cache; its name is the adapter's with ``~r<rank>``. ``CannotPad`` where the
    same function cannot be written."""
    config = json.loads((adapter.path / "adapter_config.json").read_text(encoding="utf-8"))
    weights = adapter.path / "adapter_model.safetensors"
    if not weights.is_file():
        raise CannotPad(f"{adapter.path} has no adapter_model.safetensors to pad")
    r = int(config["r"])
    if rank < r:
        raise CannotPad(f"its rank {r} is above {rank}")
    new_config = padded_config(config, rank)
    content = hashlib.sha256(weights.read_bytes()).hexdigest()
    what = [adapter.name, content, config, rank, PADDING_VERSION]
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode())

    def build(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        _write_padded(weights, tmp / "adapter_model.safetensors", r, rank)
        (tmp / "adapter_config.json").write_text(json.dumps(new_config, indent=2), encoding="utf-8")
        mark = {"of": adapter.name, "weights_sha256": content, "rank": r, "padded_to": rank}
        (tmp / PADDED_MARK).write_text(json.dumps(mark, indent=2), encoding="utf-8")

    folder = materialize(cache_dir() / "adapters" / "padded" / f"{adapter.name}-r{rank}-{key.hexdigest()[:12]}", build)
    return Adapter(f"{adapter.name}~r{rank}", folder, adapter.prompt, rank, adapter.same_as_base)


def _write_padded(source: Path, out: Path, r: int, rank: int) -> None:
    """Every A tensor ``[r, in]`` with zero rows to ``rank``, every B ``[out, r]`` with zero columns."""
    try:
        import torch
        from safetensors.torch import load_file, save_file
    except ImportError as exc:  # an install for HTTP targets only has no torch
        raise CannotPad(f"padding needs torch here: {exc}") from None

    padded = {}
    for name, tensor in load_file(str(source)).items():
        if any(f".{part}" in name for part in A_NAMES) and tensor.shape[0] == r:
            padded[name] = torch.cat([tensor, tensor.new_zeros(rank - r, *tensor.shape[1:])], 0)
        elif any(f".{part}" in name for part in B_NAMES) and tensor.shape[-1] == r:
            padded[name] = torch.cat([tensor, tensor.new_zeros(*tensor.shape[:-1], rank - r)], -1)
        else:
            raise CannotPad(f"{source}: {name} (shape {list(tensor.shape)}) is not a LoRA A or B tensor of rank {r}")
    save_file({k: v.contiguous() for k, v in padded.items()}, str(out))
