"""How often the capacity search's interval on the SLO edge covers the true edge.

A search (``lorabench.measure.capacity.search``, the plugin's own) against engines whose true
edge is known: at rate r a probe measures Poisson(r * duration) requests, each within the SLO
with probability p(r) = 1 / (1 + (r / r50) ** steepness), falling with the rate; the edge r* is
where p(r*) equals the target. Above ``overload`` times r* the engine's queue grows, and a
probe leaves requests unfinished. Each seed draws r50 and the closed-loop estimate (0.8 to 3
times r*). Prints the share of searches whose interval (``capacity_ci_low_rps`` to
``capacity_ci_high_rps``, an open side unbounded) covers r*, against the bracket's (the
highest passing to the lowest failing rate), and the intervals' median width (high / low).

    .venv/bin/python scripts/bench_capacity_interval.py [--searches 200] [--steepness 6] [--duration 5]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from lorabench.measure.capacity import Limits, Probe, boundary_interval, search

TARGET, MAX_PROBES = 0.9, 6


def one_search(seed: int, steepness: float, duration: float, overload: float = 1.5) -> dict:
    """One search against a drawn engine: the true edge, the interval, the bracket."""
    rng = np.random.default_rng(seed)
    r50 = float(rng.uniform(2.0, 20.0))
    edge = r50 * ((1 - TARGET) / TARGET) ** (1 / steepness)  # p(edge) = TARGET

    def probe_at(rate: float, stretch: float) -> Probe:
        n = int(rng.poisson(rate * duration * stretch))
        met = int(rng.binomial(n, 1 / (1 + (rate / r50) ** steepness))) if n else 0
        unfinished = int(rng.poisson(2)) + 1 if rate > overload * edge else 0
        return Probe(rate, n, met, unfinished, TARGET, stretch=stretch)

    estimate = edge * float(rng.uniform(0.8, 3.0))
    limits = Limits(precision=0.25, min_rate=0.05, max_rate=None, max_probes=MAX_PROBES, max_time_s=math.inf)
    found = search(probe_at, estimate, limits, clock=lambda: 0.0)
    low, high = boundary_interval(found.probes)
    at, over = found.capacity, found.over
    return {
        "edge": edge,
        "covered": (low or 0.0) <= edge <= (high or math.inf),
        "bracket_covered": (at.rate if at else 0.0) <= edge <= (over.rate if over else math.inf),
        "width": (high / low) if low and high else math.inf,
    }


def coverage(searches: int, steepness: float, duration: float, seed: int = 0) -> dict:
    done = [one_search(s, steepness, duration) for s in range(seed, seed + searches)]
    widths = [d["width"] for d in done]
    return {
        "interval covers": sum(d["covered"] for d in done) / len(done),
        "bracket covers": sum(d["bracket_covered"] for d in done) / len(done),
        "median width (high / low)": float(np.median(widths)),
        "open on a side": sum(math.isinf(w) for w in widths) / len(done),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--searches", type=int, default=200, help="seeded searches (default 200)")
    parser.add_argument("--steepness", type=float, default=6.0, help="how fast attainment falls with the rate (6)")
    parser.add_argument("--duration", type=float, default=5.0, help="a probe's measured seconds (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="the first search's seed (default 0)")
    args = parser.parse_args()
    started = time.perf_counter()
    print(json.dumps(coverage(args.searches, args.steepness, args.duration, args.seed)))
    print(f"{args.searches} searches, target {TARGET}, in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
