"""Cross-check lorabench's no-LoRA e2e against vLLM's own latency benchmark.

Runs on this machine ``vllm.benchmarks.latency`` (``LLM.generate``) and the ``no_lora``
case on the LoRA-off engine (lorabench's async engine, the batch sent at once and
gathered), with the same model, batch size, lengths, warm-up and iteration counts, then
prints both mean latencies and their ratio. Each engine build settles at
its own speed, so each harness runs ``--repeats`` times (separate builds), in the
order vLLM, lorabench, lorabench, vLLM, ... so neither always goes first.

    python scripts/crosscheck_vllm_latency.py [--config config/common.json] [--batch-size 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from lorabench.config import EngineSpec, read_config_file, resolve_config

ROOT = Path(__file__).resolve().parent.parent


VLLM_LATENCY = (
    "import sys; from vllm.benchmarks.latency import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; p = P(); add_cli_args(p); "
    "main(p.parse_args(sys.argv[1:]))"
)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(ROOT / "config" / "common.json"))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2, help="builds per harness")


def vllm_command(args: argparse.Namespace, config_path: Path) -> list[str]:
    """vLLM's latency benchmark with the config's model, lengths and engine limits."""
    parsed = read_config_file(config_path)
    m = parsed.matrix
    if m.input_len is None:
        sys.exit(f"{config_path}: set matrix.input_len: vLLM's latency benchmark sends synthetic prompts")
    config = resolve_config(config_path, parsed, needs_lora=False)
    command = [sys.executable, "-c", VLLM_LATENCY, "--model", str(config.model)]
    command += ["--input-len", str(m.input_len), "--output-len", str(m.output_len)]
    command += ["--batch-size", str(args.batch_size), "--num-iters-warmup", str(args.warmup)]
    command += ["--num-iters", str(args.iters), "--seed", str(m.seed)]
    engine = config.llm_kwargs(EngineSpec(enable_lora=False))
    for key in ("max_model_len", "max_num_seqs", "dtype"):
        if key in engine:
            command += [f"--{key.replace('_', '-')}", str(engine[key])]
    return command


def lorabench_config(args: argparse.Namespace, config_path: Path, folder: Path) -> Path:
    """The config narrowed to one batch size, vLLM's warm-up and iteration counts and one
    build, its relative paths made absolute so it can live in ``folder``."""
    raw = json.loads(config_path.read_text())
    raw["matrix"].update(batch_sizes=[args.batch_size], warmup_rounds=args.warmup, rounds=args.iters, builds=1)
    for key in ("model", "prompts", "adapters"):
        if isinstance(raw[key], str) and not raw[key].startswith("builtin:"):
            raw[key] = str((config_path.parent / raw[key]).resolve())
    path = folder / "crosscheck.json"
    path.write_text(json.dumps(raw))
    return path


def main(args: argparse.Namespace) -> int:
    config_path = Path(args.config).resolve()
    env = {**os.environ, **{k: str(v) for k, v in read_config_file(config_path).env.items()}}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        command = vllm_command(args, config_path)
        selection = ["-k", f"no_lora and lora-off and bs{args.batch_size}"]
        selection += ["--bench-config", str(lorabench_config(args, config_path, tmp))]

        def run_vllm(i: int) -> float:
            out = tmp / f"vllm{i}.json"
            subprocess.run([*command, "--output-json", str(out)], env=env, check=True, cwd=tmp)
            return json.loads(out.read_text())["avg_latency"] * 1000.0

        def run_lorabench(i: int) -> float:
            out = tmp / f"lorabench{i}.csv"
            pytest = [sys.executable, "-m", "pytest", str(ROOT / "bench"), "-q", "-p", "no:cacheprovider"]
            subprocess.run([*pytest, *selection, "--bench-output", str(out)], env=env, check=True, cwd=ROOT)
            return float(pd.read_csv(out)["e2e_ms"].iloc[0])

        theirs, ours = [], []
        for i in range(args.repeats):
            first, second = (run_vllm, run_lorabench) if i % 2 == 0 else (run_lorabench, run_vllm)
            for run in (first, second):
                (theirs if run is run_vllm else ours).append(run(i))
    print(f"vllm.benchmarks.latency avg per build: {', '.join(f'{v:.1f}' for v in theirs)} ms")
    print(f"lorabench no_lora lora-off e2e_ms per build: {', '.join(f'{v:.1f}' for v in ours)} ms")
    mean_theirs, mean_ours = sum(theirs) / len(theirs), sum(ours) / len(ours)
    print(f"means: vLLM {mean_theirs:.1f} ms, lorabench {mean_ours:.1f} ms, ratio {mean_ours / mean_theirs:.3f}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
