"""Cross-check lorabench's no-LoRA e2e against vLLM's own latency benchmark.

Runs, one after the other on this machine, ``vllm.benchmarks.latency`` and the
``no_lora`` case on the LoRA-off engine, with the same model, batch size, lengths,
warm-up and iteration counts, then prints both mean latencies and their ratio.

    python scripts/crosscheck_vllm_latency.py [--config config/common.json] [--batch-size 8]
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

from lorabench.config import read_config_file, resolve_config

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "config" / "common.json"))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()

    config_path = Path(args.config).resolve()
    parsed = read_config_file(config_path)
    m = parsed.matrix
    if m.input_len is None:
        sys.exit(f"{config_path}: set matrix.input_len: vLLM's latency benchmark sends synthetic prompts")
    config = resolve_config(config_path, parsed, needs_lora=False)
    engine = parsed.llm_kwargs()
    env = {**os.environ, **{k: str(v) for k, v in parsed.env.items()}}

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        vllm_json = tmp / "vllm.json"
        vllm_cmd = [
            sys.executable, "-c", "import sys; from vllm.benchmarks.latency import add_cli_args, main; "
            "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; p = P(); add_cli_args(p); "
            "main(p.parse_args(sys.argv[1:]))",
            "--model", str(config.model), "--input-len", str(m.input_len), "--output-len", str(m.output_len),
            "--batch-size", str(args.batch_size), "--num-iters-warmup", str(args.warmup),
            "--num-iters", str(args.iters), "--seed", str(m.seed), "--output-json", str(vllm_json),
        ]
        if config.is_builtin_model:
            vllm_cmd += ["--load-format", "dummy"]
        for key in ("max_model_len", "max_num_seqs", "dtype"):
            if key in engine:
                vllm_cmd += [f"--{key.replace('_', '-')}", str(engine[key])]
        subprocess.run(vllm_cmd, env=env, check=True, cwd=tmp)

        raw = json.loads(config_path.read_text())
        raw["matrix"].update(batch_sizes=[args.batch_size], warmup_rounds=args.warmup, rounds=args.iters)
        for key in ("model", "prompts", "adapters"):
            if isinstance(raw[key], str) and not raw[key].startswith("builtin:"):
                raw[key] = str((config_path.parent / raw[key]).resolve())
        check_config = tmp / "crosscheck.json"
        check_config.write_text(json.dumps(raw))
        out_csv = tmp / "lorabench.csv"
        subprocess.run(
            [sys.executable, "-m", "pytest", str(ROOT / "bench"), "-q", "-p", "no:cacheprovider",
             "-k", f"no_lora and lora-off and bs{args.batch_size}",
             "--bench-config", str(check_config), "--bench-output", str(out_csv)],
            env=env, check=True, cwd=ROOT,
        )
        theirs = json.loads(vllm_json.read_text())["avg_latency"] * 1000.0
        ours = float(pd.read_csv(out_csv)["e2e_ms"].iloc[0])
    print(f"vllm.benchmarks.latency avg: {theirs:.1f} ms")
    print(f"lorabench no_lora lora-off e2e_ms: {ours:.1f} ms")
    print(f"ratio lorabench / vLLM: {ours / theirs:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
