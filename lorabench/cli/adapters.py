"""`lorabench adapters generate`: dummy PEFT adapters (random weights) for a Llama-like base.

Its own module so the command line stays small; the generator (torch, safetensors) is
imported only when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lorabench.cli.types import distinct_list, positive_int, seed

BAD_INPUT = 2


class _BadInput(ValueError):
    """Input ``adapters generate`` cannot use: one line on stderr, exit status 2."""


def _base_config(base: str) -> Path:
    from lorabench.load import builtin

    if base.startswith(builtin.PREFIX):
        try:
            return builtin.ensure_model(base[len(builtin.PREFIX) :]) / "config.json"
        except KeyError:
            raise _BadInput(f"--base {base}: built-in models are {', '.join(builtin.MODELS)}") from None
    path = Path(base).expanduser()
    config = path / "config.json" if path.is_dir() else path
    if not config.is_file():
        raise _BadInput(f"--base {base}: no config.json there; pass a model folder or its config.json")
    return config


def _prompts(name: str | None) -> list[str]:
    """The prompts of ``--prompts``: a JSON list of strings, as the config's ``prompts`` file."""
    if not name:
        return []
    try:
        prompts = json.loads(Path(name).read_text(encoding="utf-8"))
    except OSError as exc:
        raise _BadInput(f"--prompts {name}: {exc.strerror}: give a prompts.json (a JSON list of strings)") from None
    except ValueError as exc:
        raise _BadInput(f"--prompts {name}: not JSON ({exc}): give a JSON list of strings") from None
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise _BadInput(f'--prompts {name}: not a JSON list of strings: write it as ["first prompt", ...]')
    return prompts


def _generate(args: argparse.Namespace) -> int:
    from lorabench.load.adapters import generate_dummy_adapters

    try:
        config = _base_config(args.base)
        adapters = generate_dummy_adapters(
            config,
            Path(args.out),
            count=args.count,
            ranks=args.ranks,
            target_modules=args.target_modules,
            prompts=_prompts(args.prompts),
            seed=args.seed,
            dtype=args.dtype,
        )
    except _BadInput as exc:
        return _refuse(str(exc))
    except (KeyError, ValueError) as exc:
        return _refuse(
            f"cannot generate adapters for {config}: {exc}: give --base a model folder with its config.json, "
            "that config.json, or builtin:tiny-llama"
        )
    except OSError as exc:
        return _refuse(f"--out {args.out}: {exc.strerror}: check the path and its permissions")
    print(f"wrote {len(adapters)} adapters and {Path(args.out) / 'adapters.json'}")
    return 0


def _refuse(why: str) -> int:
    print(f"lorabench adapters generate: {why}", file=sys.stderr)
    return BAD_INPUT


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    gen = actions.add_parser(
        "generate",
        help="write dummy PEFT adapters (random weights) for a Llama-like base, and their adapters.json",
    )
    gen.add_argument("--base", required=True, help="base model folder or its config.json, or builtin:tiny-llama")
    gen.add_argument("--out", required=True, help="folder for the adapters and adapters.json")
    gen.add_argument("--count", type=positive_int, default=8, help="number of adapters")
    ranks = distinct_list(positive_int, "ranks above 0")
    gen.add_argument("--ranks", type=ranks, default=[8, 16], help="ranks to cycle through, e.g. 8,16,32,64")
    gen.add_argument(
        "--target-modules",
        type=distinct_list(str, "module names"),
        default=["q_proj", "k_proj", "v_proj", "o_proj"],
        help="the modules each adapter adapts, e.g. q_proj,v_proj",
    )
    gen.add_argument("--prompts", help="prompts.json whose prompts are given to the adapters in turn")
    gen.add_argument("--seed", type=seed, default=0, help="seed of the random weights")
    gen.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16", help="weights' dtype")
    gen.set_defaults(func=_generate)
