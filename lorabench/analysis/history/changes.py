"""Change points in a series of runs: where a metric's level moved, and whether it really did.

Where: binary segmentation with the l2 cost, one split at a time: the split that most
lowers the segment's sum of squared deviations from its means; what the ``ruptures``
package's ``Binseg(model="l2")`` finds (a test holds the two equal). It is computed here
because the permutation test below needs the same gain for hundreds of shuffles at once,
as one array operation, and importing ruptures (it imports scipy.stats and scipy.spatial)
took 1.6 s of a command that should answer in one.
Whether: a permutation test, as E-divisive means (Otava/Hunter) decides it. The split's
gain is compared with the best gain of the same segment shuffled (``PERMUTATIONS`` times):
under no change, the order of the runs is exchangeable, so the share of shuffles that gain
as much is the split's p-value, whatever the noise's distribution, and it already accounts
for the split having been chosen as the best of all positions. A split with
``p <= ALPHA`` is a change point, and each side is searched again.

Where exactly is uncertain: with noise, the best split often lies a run or two from the
true one (at 3 % noise and a 5 % step, within one run in 2 cases of 3; the least-squares
split itself, the best one can do, gets 77 %). So each change point comes with the runs it
may lie between: every
split whose gain falls short of the best by at most ``LOCATION_KAPPA`` times the noise's
variance. In simulation (scripts/bench_change_points.py) that range holds the true step in
93 % of the series where a 1.7-sigma step was found (7 runs wide on average) and 97 % at 3.3
sigmas (1.6 runs wide).

A permutation test cannot say less than one in as many distinct orders as the runs have:
6 runs split 3 and 3 have 20, so nothing would ever be significant at 0.01, and a change
with 3 runs after it among 10 has 2 in 120 orders as extreme. Where a split and its mirror
are more than ``ALPHA / 2`` of all orders, whether it is real is Student's t-test of the
two sides (as Otava decides throughout), its p-value multiplied by the number of splits
tried (Bonferroni), since the split tested is the best of them.

A run is one point: the median of its builds, which are replicates of one stack, not
points of the series. A series whose points are all positive is tested on their logs
(``on_scale``); medians stay in the metric's units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALPHA = 0.01
PERMUTATIONS = 499
# A level needs this many runs on each side to be told from one odd run.
MIN_SIZE = 3
# How far below the best split's gain, in units of the noise's variance, a split still may
# be where the change lies (about 95 % coverage in simulation, whatever the step's size).
LOCATION_KAPPA = 6.0


@dataclass(frozen=True)
class Change:
    """A change point: the series' level moved between run ``position - 1`` and run ``position``."""

    position: int
    first: int  # the earliest position the change may have been at
    last: int  # the latest one
    before: float  # median of the segment before
    after: float  # median of the segment after
    p_value: float

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before else float("nan")


def gains(rows: np.ndarray) -> np.ndarray:
    """Each row's l2 gain at each split that leaves ``MIN_SIZE`` on each side (column j:
    the split before position ``MIN_SIZE + j``): the sum of squares a split into two means
    removes, ``n1 n2 / n (mean1 - mean2)^2``."""
    n = rows.shape[1]
    sizes = np.arange(MIN_SIZE, n - MIN_SIZE + 1)
    sums = np.cumsum(rows, axis=1)[:, sizes - 1]
    left = sums / sizes
    right = (rows.sum(axis=1, keepdims=True) - sums) / (n - sizes)
    return sizes * (n - sizes) / n * (left - right) ** 2


def _split(values: np.ndarray, rng: np.random.Generator) -> tuple[int, float, int, int] | None:
    """The best split of ``values``, its permutation p-value and the range of splits it may
    be (``LOCATION_KAPPA``); None where too short."""
    n = len(values)
    if n < 2 * MIN_SIZE:
        return None
    own = gains(values[np.newaxis])[0]
    best = int(own.argmax())
    cut = MIN_SIZE + best
    if 2 / math.comb(n, min(cut, n - cut)) > ALPHA / 2:  # this split and its mirror among all orders
        p = min(1.0, len(own) * student_p(values[:cut], values[cut:]))
    else:
        shuffles = np.array([rng.permutation(values) for _ in range(PERMUTATIONS)])
        as_large = int((gains(shuffles).max(axis=1) >= own[best] * (1 - 1e-12)).sum())
        p = (as_large + 1) / (PERMUTATIONS + 1)
    # What the split leaves unexplained; rounding can take it just under 0 for exact levels.
    variance = max((((values - values.mean()) ** 2).sum() - own[best]) / max(n - 2, 1), 0.0)
    near = np.flatnonzero(own[best] - own <= LOCATION_KAPPA * variance + 1e-12 * own[best])
    return MIN_SIZE + best, p, MIN_SIZE + int(near[0]), MIN_SIZE + int(near[-1])


def on_scale(values: np.ndarray) -> np.ndarray:
    """The values as the tests here read them: their logs where every one is positive (a
    latency or a throughput, whose noise grows with its level: a run twice as slow jitters
    twice as much, so a pooled variance on raw values lets a noisy slower level hide; compare
    and ab test log ratios for the same reason), the values themselves otherwise (a count, a
    rate that can be 0)."""
    return np.log(values) if len(values) and (values > 0).all() else values


def student_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of Student's t-test between ``a`` and ``b``, their variance pooled:
    a series' noise is the same on both sides of a level change, and 3 runs alone say
    little about it; 0 for two exact levels."""
    from lorabench.analysis.compare.noise import t_sf

    df = len(a) + len(b) - 2
    pooled = (((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()) / df
    if pooled == 0:
        return 0.0 if a.mean() != b.mean() else 1.0
    t = abs(a.mean() - b.mean()) / np.sqrt(pooled * (1 / len(a) + 1 / len(b)))
    return 2 * t_sf(t, df)


def change_points(points: np.ndarray, *, alpha: float = ALPHA, seed: int = 0) -> list[Change]:
    """The change points of ``points`` (one value a run, in order), each with the medians of
    the segments either side of it among the final segmentation; NaN points are left out."""
    raw = np.asarray(points, dtype=float)
    index = np.flatnonzero(~np.isnan(raw))
    raw = raw[index]
    values = on_scale(raw)
    rng = np.random.default_rng(seed)
    cuts: list[tuple[int, float, int, int]] = []
    pending = [(0, len(values))]
    while pending:
        start, end = pending.pop()
        found = _split(values[start:end], rng)
        if found is None or found[1] > alpha:
            continue
        cut, p, first, last = found
        cuts.append((start + cut, p, start + first, start + last))
        pending += [(start, start + cut), (start + cut, end)]
    cuts.sort()
    bounds = [0, *(c[0] for c in cuts), len(values)]
    return [
        Change(
            position=int(index[cut]),
            first=int(index[first]),
            last=int(index[last]),
            before=float(np.median(raw[bounds[i] : cut])),
            after=float(np.median(raw[cut : bounds[i + 2]])),
            p_value=p,
        )
        for i, (cut, p, first, last) in enumerate(cuts)
    ]
