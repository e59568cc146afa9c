"""How long `lorabench trace import` takes on a big trace, and how much memory it holds.

Writes an Azure-format CSV of --rows rows (default 1,000,000: about a day of Azure's code
trace), then runs `lorabench trace import` and `lorabench trace stats` on it, each in its
own process, and prints their wall time and peak RSS (from that process's rusage) with
the CPU model. Exit status 1 when the import misses its budget (60 s, 1 GiB).

    .venv/bin/python scripts/bench_trace_import.py [--rows N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

IMPORT_BUDGET_S = 60.0
IMPORT_BUDGET_MIB = 1024.0


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"unknown ({os.cpu_count()} cores)"


def write_azure_csv(path: Path, rows: int, seed: int = 0) -> None:
    """Bursty arrivals (Gamma gaps, CV 2) at about 12 requests/s, Azure's timestamp format."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.gamma(0.25, 4 / 12, size=rows))
    contexts = rng.integers(1, 8000, size=rows)
    generated = rng.integers(0, 800, size=rows)
    start = datetime(2023, 11, 16, 18, 15, 46)
    with path.open("w", encoding="utf-8") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for offset, context, output in zip(offsets.tolist(), contexts.tolist(), generated.tolist()):
            whole = int(offset)
            stamp = (start + timedelta(seconds=whole)).strftime("%Y-%m-%d %H:%M:%S")
            f.write(f"{stamp}.{round((offset - whole) * 1e7):07d},{context},{output}\n")


def measure(args: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS in MiB and exit status of one `lorabench` run in a child process."""
    began = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "lorabench", *args], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - began
    child.returncode = os.waitstatus_to_exitcode(status)
    return elapsed, usage.ru_maxrss / 1024, child.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="write the files here and leave them (default: a temporary folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        source, out = folder / "azure-big.csv", folder / "azure-big.jsonl"
        began = time.perf_counter()
        write_azure_csv(source, args.rows)
        print(f"cpu: {cpu_model()}")
        mib = source.stat().st_size / 2**20
        print(f"source: {args.rows} rows, {mib:.1f} MiB (written in {time.perf_counter() - began:.1f} s)")
        options = ["--num-adapters", "64", "--popularity", "powerlaw:0.3", "--rate", "20", "--max-model-len", "4096"]
        seconds, peak, status = measure(["trace", "import", "azure", str(source), "--out", str(out), *options])
        within = status == 0 and seconds < IMPORT_BUDGET_S and peak < IMPORT_BUDGET_MIB
        print(
            f"import: {seconds:.1f} s, peak RSS {peak:.0f} MiB, exit {status} "
            f"({'within' if within else 'OVER'} the budget of {IMPORT_BUDGET_S:g} s and {IMPORT_BUDGET_MIB:g} MiB)"
        )
        seconds, peak, status = measure(["trace", "stats", str(out)])
        print(f"stats: {seconds:.1f} s, peak RSS {peak:.0f} MiB, exit {status}")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
