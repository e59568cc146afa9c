"""Bisect on a chain of 16 stand-in environments with a slowdown planted at each position.

For each k in 1..15, a chain of --envs stand-in interpreters (tests/test_bisect.py's: each
turn writes a real run's rows, scaled) in which environments k and later are --slowdown
times slower, bisected by `lorabench bisect` through real `lorabench ab` sessions; then a
chain with no slowdown. Prints, for each, the environment named and the A/B sessions it
took. Exit status 1 when one is not found at k, takes more than 6 sessions, or a chain with
no slowdown names one (issue 29's target).

    .venv/bin/python scripts/bench_bisect.py [--envs 16] [--slowdown 1.15] [--pairs 2]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lorabench.host.device import cpu_name

ROOT = Path(__file__).resolve().parents[1]
MAX_SESSIONS = 6


def bisect(folder: Path, envs: int, slow_from: int, slowdown: float, pairs: int) -> tuple[str, int]:
    """The environment the bisection names (or its last line) and the sessions it ran."""
    sys.path.insert(0, str(ROOT))
    from tests.test_bisect import chain_of_fake_interpreters

    folder.mkdir(parents=True)
    chain = chain_of_fake_interpreters(folder, envs, slow_from, slowdown)
    command = [sys.executable, "-m", "lorabench", "bisect", "--envs", str(chain), "--out", str(folder / "out")]
    done = subprocess.run([*command, "--pairs", str(pairs), "--", "bench"], capture_output=True, text=True, cwd=ROOT)
    found = re.search(r"first slower environment: (\S+) \(after \S+\), (\d+) sessions", done.stdout)
    if found:
        return found.group(1), int(found.group(2))
    return (done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or ["no output"])[-1], -1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16, help="environments in the chain (default: 16)")
    parser.add_argument("--slowdown", type=float, default=1.15, help="the planted slowdown (default: 1.15)")
    parser.add_argument("--pairs", type=int, default=2, help="pairs of each A/B session (default: 2)")
    args = parser.parse_args()
    failed, started = 0, time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lorabench-bisect-") as tmp:
        for k in [*range(1, args.envs), args.envs]:
            named, sessions = bisect(Path(tmp) / f"k{k}", args.envs, k, args.slowdown, args.pairs)
            expected = f"nightly-{k}" if k < args.envs else None
            ok = named == expected and sessions <= MAX_SESSIONS if expected else sessions == -1
            failed += not ok
            verdict = "ok" if ok else "FAIL"
            print(f"slowdown from {k if expected else 'nowhere'}: {named} ({sessions} sessions) {verdict}")
    print(f"{cpu_name()}: {time.perf_counter() - started:.0f} s; {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
