"""Reproduces, with vLLM alone, what lorabench's isolation scenario found on vLLM 0.32:
an adapter reloaded in place (``load_inplace``: the same name, id and path, new weights)
reuses the KV blocks its old weights cached, because vLLM keys a cached block by the
adapter's name and path (``v1/core/kv_cache_utils.py``), not by its weights.

    python scripts/repro_reload_in_place.py [--config config/common.json]

The config gives the model and two adapters (its first two); lorabench only resolves them.
Prints the reloaded adapter's greedy answer to one prompt with nothing cached (a fresh
``cache_salt``) and after its old weights cached the prompt; exits 1 when the second found
cached tokens (or, where the two adapters answer alike, differs).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from lorabench.config import read_config_file, resolve_config
from lorabench.measure.correctness import OUTPUT_LEN
from lorabench.measure.isolation import TAIL


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=Path("config/common.json"), help="default: %(default)s")


def main(args: argparse.Namespace) -> int:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    config = resolve_config(args.config, read_config_file(args.config), needs_lora=True)
    old, new = config.adapters[:2]
    llm = LLM(
        model=str(config.model),
        enable_lora=True,
        max_lora_rank=max(old.rank, new.rank),
        enable_prefix_caching=True,
        max_model_len=256,
        seed=0,
    )
    block = llm.llm_engine.vllm_config.cache_config.block_size
    prompt = list(range(100, 100 + block + TAIL))  # a full block, which the cache shares, and more
    greedy = SamplingParams(temperature=0.0, max_tokens=OUTPUT_LEN, ignore_eos=True)

    def answer(lora: LoRARequest, salt: str | None = None) -> tuple[list[int], int | None]:
        sent = TokensPrompt(prompt_token_ids=prompt, **({"cache_salt": salt} if salt else {}))
        (out,) = llm.generate(sent, greedy, lora_request=lora, use_tqdm=False)
        return list(out.outputs[0].token_ids), out.num_cached_tokens

    with tempfile.TemporaryDirectory() as folder:
        slot = Path(folder) / "adapter"
        shutil.copytree(old.path, slot)
        lora = LoRARequest("reloaded", 1, str(slot))
        answer(lora)  # the old weights compute the prompt's block, and it is cached
        shutil.rmtree(slot)
        shutil.copytree(new.path, slot)
        llm.llm_engine.add_lora(LoRARequest("reloaded", 1, str(slot), load_inplace=True))
        fresh, _ = answer(lora, salt="nothing-cached")
        again, cached = answer(lora)
    print(f"vLLM {vllm.__version__}, KV blocks of {block} tokens")
    print(f"new weights, nothing cached:           {fresh}")
    print(f"new weights, old weights' block cached: {again} ({cached} prompt tokens found cached)")
    if cached or fresh != again:
        print("the reloaded adapter found its old weights' cached KV")
        return 1
    print("the reloaded adapter found nothing its old weights cached")
    return 0


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(cli)
    sys.exit(main(cli.parse_args()))
