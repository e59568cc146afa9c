"""lorabench's padded copy of an adapter (the rank_padding canary's reference,
docs/canaries.md): the same function at a higher rank, or refused with the reason."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lorabench.load.adapters import Adapter
from lorabench.load.padded import PADDED_MARK, CannotPad, padded_adapter

MODULE = "base_model.model.model.layers.0.self_attn.q_proj"


def adapter(folder, r=4, alpha=8, **config):
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(r, 6, generator=gen), torch.randn(5, r, generator=gen)
    save_file({f"{MODULE}.lora_A.weight": a, f"{MODULE}.lora_B.weight": b}, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": alpha, **config}))
    return Adapter("a0", folder, rank=r), a, b


def test_the_padded_copy_is_the_same_function_at_the_higher_rank(tmp_path):
    original, a, b = adapter(tmp_path / "a0")
    padded = padded_adapter(original, 16)
    assert (padded.name, padded.rank) == ("a0~r16", 16)
    tensors = load_file(str(padded.path / "adapter_model.safetensors"))
    pa, pb = tensors[f"{MODULE}.lora_A.weight"], tensors[f"{MODULE}.lora_B.weight"]
    assert pa.shape == (16, 6) and pb.shape == (5, 16)
    assert torch.equal(pa[4:], torch.zeros(12, 6)) and torch.equal(pb[:, 4:], torch.zeros(5, 12))
    config = json.loads((padded.path / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["lora_alpha"] / config["r"] == 8 / 4, "the scaling kept"
    assert torch.equal(pb @ pa * (config["lora_alpha"] / config["r"]), b @ a * 2.0), "the same delta, exactly"
    assert json.loads((padded.path / PADDED_MARK).read_text()) == {
        "of": "a0",
        "weights_sha256": hashlib.sha256((original.path / "adapter_model.safetensors").read_bytes()).hexdigest(),
        "rank": 4,
        "padded_to": 16,
    }
    assert padded_adapter(original, 16).path == padded.path, "made once into the cache"


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"use_rslora": True}, "rsLoRA"),
        ({"rank_pattern": {"q_proj": 8}}, "rank_pattern"),
        ({"lora_alpha": 1, "r": 5, "to": 12}, "does not keep its scaling exactly"),  # 1 * 12 / 5 / 12 != 1 / 5
        ({"r": 32, "lora_alpha": 32}, "its rank 32 is above 16"),
    ],
)
def test_an_adapter_that_cannot_be_padded_exactly_is_refused_with_the_reason(tmp_path, config, why):
    r, alpha, to = config.pop("r", 4), config.pop("lora_alpha", 8), config.pop("to", 16)
    original, _, _ = adapter(tmp_path / "a0", r=r, alpha=alpha, **config)
    with pytest.raises(CannotPad, match=why):
        padded_adapter(original, to)


def test_a_tensor_that_is_no_lora_pair_is_refused(tmp_path):
    original, a, b = adapter(tmp_path / "a0")
    save_file({f"{MODULE}.lora_A.weight": a, "lora_magnitude_vector": torch.ones(5)}, str(tmp_path / "a0" / "w"))
    (tmp_path / "a0" / "w").replace(tmp_path / "a0" / "adapter_model.safetensors")
    with pytest.raises(CannotPad, match="lora_magnitude_vector .* is not a LoRA A or B tensor of rank 4"):
        padded_adapter(original, 16)


def test_a_copy_at_the_adapters_own_rank_keeps_its_tensors_and_config(tmp_path):
    original, a, b = adapter(tmp_path / "a0")
    copy = padded_adapter(original, 4)
    tensors = load_file(str(copy.path / "adapter_model.safetensors"))
    assert torch.equal(tensors[f"{MODULE}.lora_A.weight"], a) and torch.equal(tensors[f"{MODULE}.lora_B.weight"], b)
    assert json.loads((copy.path / "adapter_config.json").read_text()) == {"r": 4, "lora_alpha": 8}
    assert copy.name == "a0~r4" and copy.path != padded_adapter(original, 16).path


def test_an_adapter_without_lora_alpha_is_refused(tmp_path):
    original, _, _ = adapter(tmp_path / "a0")
    (tmp_path / "a0" / "adapter_config.json").write_text(json.dumps({"r": 4}))
    with pytest.raises(CannotPad, match="no lora_alpha, which vLLM needs"):
        padded_adapter(original, 16)
