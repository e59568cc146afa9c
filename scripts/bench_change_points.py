"""How well the history finds a step: located, missed, or invented.

200 series of --points points (default 60) with noise of --cv (default 3 %) and one step of
--step (default 5 %) at a random position, and 200 series with no step, through the
history's change points (lorabench.analysis.history.changes). A step is located when a
change point lies within 1 position of it. Prints the share located, the false change
points per 100 points without a step, and where the misses were.

    .venv/bin/python scripts/bench_change_points.py [--series 200] [--points 60] [--cv 0.03] [--step 0.05]

Exit status 1 when fewer than 95 % of steps are located or more than 1 false change point
falls per 100 points (issue 29's targets).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from lorabench.analysis.history.changes import MIN_SIZE, change_points
from lorabench.host.device import cpu_name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=200, help="series of each kind (default: 200)")
    parser.add_argument("--points", type=int, default=60, help="points a series (default: 60)")
    parser.add_argument("--cv", type=float, default=0.03, help="noise, as a share of the level (default: 0.03)")
    parser.add_argument("--step", type=float, default=0.05, help="the step, as a share (default: 0.05)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    started = time.process_time()
    located, misses, covered, width = 0, [], 0, 0
    for i in range(args.series):
        at = int(rng.integers(1, args.points))
        points = rng.normal(1.0, args.cv, args.points)
        points[at:] *= 1 + args.step
        changes = change_points(points, seed=i)
        found = [c.position for c in changes]
        nearest = min(changes, key=lambda c: abs(c.position - at), default=None)
        if nearest is not None:
            covered += nearest.first <= at <= nearest.last
            width += nearest.last - nearest.first + 1
        if any(abs(p - at) <= 1 for p in found):
            located += 1
        else:
            misses.append((at, found))
    false = sum(len(change_points(rng.normal(1.0, args.cv, args.points), seed=i)) for i in range(args.series))
    cpu_ms = 1000 * (time.process_time() - started) / (2 * args.series)
    share, per_100 = located / args.series, 100 * false / (args.series * args.points)
    edge = sum(1 for at, _ in misses if at < MIN_SIZE or at > args.points - MIN_SIZE)
    print(f"{cpu_name()} ({os.cpu_count()} cores); {args.series} series of {args.points} points, cv {args.cv:.1%}")
    print(f"step of {args.step:.0%} located within 1 position: {share:.1%} ({located}/{args.series})")
    print(f"  missed: {len(misses)}, of which {edge} have the step within {MIN_SIZE} points of an end")
    print(f"  missed steps (position: change points found): {misses[:12]}")
    detected = args.series - sum(1 for _, found in misses if not found)
    print(
        f"the range a change point gives holds the step in {covered}/{detected} series with a change point "
        f"({covered / max(detected, 1):.1%}), {width / max(detected, 1):.1f} runs wide on average"
    )
    print(f"no step: {false} false change points in {args.series * args.points} points ({per_100:.2f} per 100)")
    print(f"{cpu_ms:.1f} ms of CPU a series")
    return 0 if share >= 0.95 and per_100 <= 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
