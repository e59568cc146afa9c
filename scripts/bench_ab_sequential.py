"""Sequential A/B (``lorabench ab --sequential``) against the fixed design, on simulated sessions.

Sessions as scripts/bench_ab_power.py makes them (tests/test_ab.py's: build 0 of a real run,
each turn at a random speed of its own shared by its cases, a linear drift, the new side
``--slowdown`` times slower), each seed one session of at most ``--pairs`` pairs. The fixed
design compares all of them at ``--alpha``; the sequential one looks after each pair from the
third at ``alpha / looks`` and stops where ``lorabench.analysis.compare.sequential.decision``
says the verdict is decided. Prints, for no change and for the slowdown: the share of sessions
that exit 1, the pairs each design ran (mean and distribution), and how the sequential ones stopped.

    .venv/bin/python scripts/bench_ab_sequential.py [--sessions 200] [--pairs 6] [--slowdown 1.2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def session(seed: int, pairs: int, factor: float, turn_sd: float, drift: float, threshold: float) -> dict:
    """One simulated session, judged both ways: exit 1 or not, and the pairs each ran."""
    sys.path.insert(0, str(ROOT))
    from lorabench.ab.sequential import needing_no_test
    from lorabench.analysis.compare.paired import compare_paired_runs
    from lorabench.analysis.compare.sequential import FIRST_LOOK, decision, look_alpha
    from tests.test_ab import session_runs

    def runs(n: int) -> tuple:
        # The same seed draws the same turns in the same order: n pairs are the session's first n.
        return session_runs(n, factor=factor, turn_sd=turn_sd, drift=drift, rng=np.random.default_rng(seed))

    fixed = compare_paired_runs(*runs(pairs), threshold=threshold, alpha=ALPHA)
    alpha = look_alpha(ALPHA, pairs)
    for n in range(FIRST_LOOK, pairs + 1):
        result = compare_paired_runs(*runs(n), threshold=threshold, alpha=alpha)
        decided = decision(result, needing_no_test(result), alpha)
        if decided is not None or n == pairs:
            break
    return {"fixed": bool(fixed.failed), "seq": bool(result.failed), "pairs": n, "decided": decided or "undecided"}


ALPHA = 0.05


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200, help="seeded sessions per condition (default 200)")
    parser.add_argument("--pairs", type=int, default=6, help="the fixed design's pairs, the sequential's most (6)")
    parser.add_argument("--slowdown", type=float, default=1.2, help="the planted slowdown's factor (default 1.2)")
    parser.add_argument("--turn-sd", type=float, default=0.03, help="each turn's speed, sd of its log (default 0.03)")
    parser.add_argument("--drift", type=float, default=0.02, help="log speed change a turn, both sides (0.02)")
    parser.add_argument("--seed", type=int, default=0, help="the first session's seed (default 0)")
    parser.add_argument("--threshold", type=float, default=0.1, help="compare's threshold, a fraction (0.1)")
    args = parser.parse_args()
    started = time.perf_counter()
    report = {}
    for name, factor in (("no change", 1.0), (f"{args.slowdown}x slower", args.slowdown)):
        seeds = range(args.seed, args.seed + args.sessions)
        done = [session(s, args.pairs, factor, args.turn_sd, args.drift, args.threshold) for s in seeds]
        report[name] = {
            "exit 1, fixed": sum(d["fixed"] for d in done) / len(done),
            "exit 1, sequential": sum(d["seq"] for d in done) / len(done),
            "pairs, fixed": args.pairs,
            "pairs, sequential (mean)": float(np.mean([d["pairs"] for d in done])),
            "pairs, sequential (count)": dict(sorted(Counter(d["pairs"] for d in done).items())),
            "stopped": dict(Counter(d["decided"] for d in done)),
        }
        print(f"{name}: {json.dumps(report[name])}", flush=True)
    took = time.perf_counter() - started
    print(f"{args.sessions} sessions a condition, alpha {ALPHA}, threshold {args.threshold:g}, in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
