"""``lorabench serve-command``: the ``vllm serve`` that one engine configuration of a config is.

To benchmark a server you start yourself (``--bench-target http://HOST:PORT``), it has to run
as the configuration its rows will name: the same model, LoRA knobs, graph mode, seed and
adapters. This prints the command the ``serve`` target itself runs, with the config's
environment, and the ``pytest`` line that benchmarks it. Built-in models and generated
adapters are made first, as a run would, so the paths it prints exist.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from lorabench.config import ConfigError, engine_specs, read_config_file, resolve_config
from lorabench.targets.engine_env import SPAWN, engine_environment
from lorabench.targets.vllm_args import engine_arg_names

RUNTIME_API = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="config/common.json", help="config file (default: config/common.json)")
    parser.add_argument("--engine", help="the engine configuration (e.g. loras2-rank16-cpu12) when there are several")
    parser.add_argument("--host", default="127.0.0.1", help="address the server listens on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port the server listens on (default: 8000)")


def main(args: argparse.Namespace) -> int:
    path = Path(args.config)
    if not path.is_file():
        return _refuse(f"--config {path}: no such file")
    try:
        config = resolve_config(path, read_config_file(path), needs_lora=True, engine_args=engine_arg_names)
    except ConfigError as exc:
        return _refuse(*exc.problems)
    specs = {s.name: s for s in engine_specs(config.file, with_lora_off=False)}
    if args.engine is None and len(specs) == 1:
        args.engine = next(iter(specs))
    if args.engine not in specs:
        said = f"has no engine configuration {args.engine!r}" if args.engine else "lists several engine configurations"
        return _refuse(f"{path} {said}: give --engine, one of {', '.join(specs)}")
    from lorabench.targets.http.serve import server_command  # aiohttp: only for the command that needs it

    # The serve target's environment (engine_environment: the config's, hashes seeded), as it runs it.
    env = {**engine_environment(config.file.env, "cpu"), RUNTIME_API: "1"}
    if SPAWN not in env and SPAWN not in os.environ:
        # The serve target sets it on an accelerator (a forked worker cannot start torch_npu
        # again); this process asks no device what it is, and spawn is safe on every one.
        env[SPAWN] = "spawn"
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    command = server_command(config, specs[args.engine], args.host, args.port)
    endpoint = f"http://{args.host}:{args.port}"
    print(" ".join([*words, *map(shlex.quote, command)]))
    select = shlex.quote(f"multilora and {args.engine}")
    print(f"# then: pytest bench -k {select} --bench-config {shlex.quote(str(path))} --bench-target {endpoint}")
    return 0


def _refuse(*problems: str) -> int:
    """Bad input: one line a problem on stderr, exit status 2."""
    for why in problems:
        print(f"lorabench serve-command: {why}", file=sys.stderr)
    return 2
