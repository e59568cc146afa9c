"""Reproduces, with vLLM alone, what lorabench's isolation scenario found on vLLM 0.32:
an adapter reloaded in place (``load_inplace``: the same name, id and path, new weights)
reuses the KV blocks its old weights cached, because vLLM keys a cached block by the
adapter's name and path (``v1/core/kv_cache_utils.py``), not by its weights.

    python scripts/repro_reload_in_place.py [--config config/common.json]

The config gives the model, two adapters (its first two), vLLM's arguments and its ``env``
(its first LoRA configuration, prefix caching on), applied as the plugin applies them:
lorabench resolves them, vLLM alone runs. A build that fails is one line with vLLM's cause.
Prints the reloaded adapter's greedy answer to one prompt with nothing cached (a fresh
``cache_salt``) and after its old weights cached the prompt; exits 1 when the second found
cached tokens (or, where the two adapters answer alike, differs).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from lorabench.config import ConfigError, engine_specs, read_config_file, resolve_config
from lorabench.load.adapters import Adapter
from lorabench.measure.correctness import OUTPUT_LEN
from lorabench.measure.isolation import TAIL
from lorabench.targets.engine_env import applied, engine_environment

IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=Path("config/common.json"), help="default: %(default)s")


def engine_settings(path: Path) -> tuple[dict[str, Any], dict[str, str], list[Adapter]]:
    """vLLM's arguments and environment for the config's first LoRA configuration, prefix
    caching on, as the plugin would build it (``engine_environment``: the config's ``env``,
    ``VLLM_CPU_KVCACHE_SPACE`` among them), and the adapters; raises ``ConfigError``."""
    file = read_config_file(path)
    config = resolve_config(path, file, needs_lora=True)
    spec = replace(engine_specs(file, with_lora_off=False)[0], enable_prefix_caching=True)
    env = engine_environment(file.env, file.device or "cpu")
    # One process: a build that fails raises its own cause here, not "see root cause above".
    env.setdefault(IN_PROCESS, "0")
    return config.llm_kwargs(spec), env, config.adapters


def main(args: argparse.Namespace) -> int:
    try:
        kwargs, env, adapters = engine_settings(args.config)
    except ConfigError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return 2
    if len(adapters) < 2:
        print(f"{args.config}: adapters: the reproducer needs 2, the config has {len(adapters)}", file=sys.stderr)
        return 2
    old, new = adapters[:2]
    with applied(env):
        import vllm
        from vllm import LLM

        try:
            llm = LLM(**kwargs)
        except Exception as exc:  # noqa: BLE001 - one line with vLLM's cause, not its traceback
            print(
                f"vLLM {vllm.__version__} did not start: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr
            )
            return 2
        return reproduce(llm, old, new, vllm.__version__)


def reproduce(llm: Any, old: Adapter, new: Adapter, version: str) -> int:
    """The reload in place, on a built engine; 1 when the reloaded adapter found its old weights' block."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

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
    print(f"vLLM {version}, KV blocks of {block} tokens")
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
