"""The built-in default: a tiny Llama and dummy adapters, made on first use, no downloads.

Everything is written to a cache folder outside the repository (``$LORABENCH_CACHE_DIR``,
else ``$XDG_CACHE_HOME/lorabench``, else ``~/.cache/lorabench``). Each item is built in a
temporary folder and renamed into place, so concurrent first runs never see half a model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from lorabench.load.adapters import GENERATOR_VERSION, Adapter, generate_dummy_adapters, read_adapters_file

PREFIX = "builtin:"
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
# Llama's vocabulary size: vLLM's latency benchmark draws prompt ids below 10,000, and
# the logits cost per token should look like a real model's.
VOCAB_SIZE = 32000
TOKENIZER_VERSION = "bytelevel-fill-v1"
WEIGHTS_VERSION = "randn-0.02-v1"

# The shape; weights are drawn by write_weights.
MODELS = {
    "tiny-llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "vocab_size": VOCAB_SIZE,
    }
}


def cache_dir() -> Path:
    if "LORABENCH_CACHE_DIR" in os.environ:
        return Path(os.environ["LORABENCH_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "lorabench"


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def materialize(target: Path, build: Callable[[Path], None]) -> Path:
    """``target``, made once by ``build`` (into a temporary folder, then renamed): a cache entry
    is whole or absent, and processes that make it at once agree on one."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp)
    try:
        tmp.rename(target)
    except OSError:  # another process finished first; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_tokenizer(out: Path) -> None:
    """A byte-level tokenizer with no merges: one token per UTF-8 byte, built without training,
    so it is the same on every machine. Filler tokens pad it to ``VOCAB_SIZE``: text never
    encodes to them, but any id the model samples decodes."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in sorted(ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    for i in range(VOCAB_SIZE - len(vocab)):
        vocab[f"<fill{i}>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": 2048,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def write_weights(out: Path, config: dict, seed: int = 0) -> None:
    """Random Llama weights, drawn as Hugging Face initializes them (normal, std 0.02;
    norms 1). vLLM's dummy loader draws every weight from +-1e-3 instead, which leaves
    a model this small answering the same whatever it is asked, with or without an
    adapter: no check of outputs could see anything there."""
    import torch
    from safetensors.torch import save_file

    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        for module, shape in (
            ("q_proj", (hidden, hidden)),
            ("k_proj", (kv, hidden)),
            ("v_proj", (kv, hidden)),
            ("o_proj", (hidden, hidden)),
        ):
            shapes[f"{layer}.self_attn.{module}.weight"] = shape
        for module, shape in (
            ("gate_proj", (inter, hidden)),
            ("up_proj", (inter, hidden)),
            ("down_proj", (hidden, inter)),
        ):
            shapes[f"{layer}.mlp.{module}.weight"] = shape
    generator = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(shape, generator=generator) * 0.02 for name, shape in shapes.items()}
    for name in ["model.norm.weight"] + [
        f"model.layers.{i}.{norm}.weight"
        for i in range(config["num_hidden_layers"])
        for norm in ("input_layernorm", "post_attention_layernorm")
    ]:
        tensors[name] = torch.ones(hidden)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))


def ensure_model(name: str) -> Path:
    """The folder of built-in model ``name`` (config.json, tokenizer, random weights), made if missing."""
    config = MODELS[name]

    def build(tmp: Path) -> None:
        write_tokenizer(tmp)
        write_weights(tmp, config)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    key = _digest(config, TOKENIZER_VERSION, WEIGHTS_VERSION)
    return materialize(cache_dir() / "models" / f"{name}-{key}", build)


def ensure_dummy_adapters(
    model: Path,
    prompts: Sequence[str],
    *,
    count: int,
    ranks: Sequence[int],
    target_modules: Sequence[str],
    seed: int,
) -> list[Adapter]:
    """Dummy adapters for ``model``, generated once into the cache.

    Plain values, not the config's adapter spec: the config package resolves through this
    module, so importing its spec here would tie the two into a circle. The cache key is the
    spec's fields as before, so adapters generated by earlier versions are found again.
    """
    base_config = (model / "config.json").read_text()
    spec = {"count": count, "ranks": list(ranks), "target_modules": list(target_modules), "seed": seed}
    key = _digest(base_config, spec, list(prompts), GENERATOR_VERSION)

    def build(tmp: Path) -> None:
        generate_dummy_adapters(
            model / "config.json",
            tmp,
            count=count,
            ranks=ranks,
            target_modules=target_modules,
            prompts=prompts,
            seed=seed,
        )

    folder = materialize(cache_dir() / "adapters" / f"{model.name}-{key}", build)
    return read_adapters_file(folder / "adapters.json")
