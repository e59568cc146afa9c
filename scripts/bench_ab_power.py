"""How often an A/B comparison catches a planted slowdown, by the number of pairs.

Simulated sessions (tests/test_ab.py's: build 0 of a real run, each turn at a random speed
of its own shared by its cases, the new side ``--slowdown`` times slower) judged as
``lorabench ab`` judges them. Prints, per pair count, the share of sessions that fail (the
slowdown caught) and, with no slowdown, the share that fail anyway (false alarms). This is
what ``lorabench bisect --pairs`` trades against time: a step that is not caught is called good.

    .venv/bin/python scripts/bench_ab_power.py [--pairs 3 6] [--slowdown 1.2] [--turn-sd 0.03] [--sessions 40]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def caught(pairs: int, slowdown: float, turn_sd: float, sessions: int, threshold: float, alpha: float) -> float:
    """The share of ``sessions`` simulated sessions whose comparison fails."""
    sys.path.insert(0, str(ROOT))
    from lorabench.analysis.compare.paired import compare_paired_runs
    from tests.test_ab import session_runs

    failed = 0
    for seed in range(sessions):
        base, new, order = session_runs(pairs, factor=slowdown, turn_sd=turn_sd, rng=np.random.default_rng(seed))
        failed += compare_paired_runs(base, new, order, threshold=threshold, alpha=alpha).failed
    return failed / sessions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[3, 6], help="pair counts to try (default 3 6)")
    parser.add_argument("--slowdown", type=float, default=1.2, help="the new side's factor (default 1.2)")
    parser.add_argument("--turn-sd", type=float, default=0.03, help="each turn's speed, sd of its log (default 0.03)")
    parser.add_argument("--sessions", type=int, default=40, help="simulated sessions each (default 40)")
    parser.add_argument("--threshold", type=float, default=0.05, help="as bisect's default, 5 %% (0.05)")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    args = parser.parse_args()
    for pairs in args.pairs:
        hit = caught(pairs, args.slowdown, args.turn_sd, args.sessions, args.threshold, args.alpha)
        alarm = caught(pairs, 1.0, args.turn_sd, args.sessions, args.threshold, args.alpha)
        print(f"{pairs} pairs: x{args.slowdown:g} caught in {hit:.0%} of {args.sessions}, false alarms {alarm:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
