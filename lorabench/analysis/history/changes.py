"""Change points in a series of runs: where a metric's level moved, and whether it really did.

Where: binary segmentation with the l2 cost, from the ``ruptures`` package, one split at a
time: the split that most lowers the segment's sum of squared deviations from its means.
Whether: a permutation test, as E-divisive means (Otava/Hunter) decides it. The split's
gain is compared with the best gain of the same segment shuffled (``PERMUTATIONS`` times):
under no change, the order of the runs is exchangeable, so the share of shuffles that gain
as much is the split's p-value, whatever the noise's distribution, and it already accounts
for the split having been chosen as the best of all positions. A split with
``p <= ALPHA`` is a change point, and each side is searched again.

A run is one point: the median of its builds, which are replicates of one stack, not
points of the series.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import ruptures

ALPHA = 0.01
PERMUTATIONS = 499
# A level needs this many runs on each side to be told from one odd run.
MIN_SIZE = 3


@dataclass(frozen=True)
class Change:
    """A change point: the series' level moved between run ``position - 1`` and run ``position``."""

    position: int
    before: float  # median of the segment before
    after: float  # median of the segment after
    p_value: float

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before else float("nan")


def _best_gains(shuffled: np.ndarray) -> np.ndarray:
    """Each row's largest l2 gain over the splits that leave ``MIN_SIZE`` on each side: the
    sum of squares a split into two means removes, ``n1 n2 / n (mean1 - mean2)^2``."""
    n = shuffled.shape[1]
    sizes = np.arange(MIN_SIZE, n - MIN_SIZE + 1)
    sums = np.cumsum(shuffled, axis=1)[:, sizes - 1]
    total = shuffled.sum(axis=1, keepdims=True)
    left = sums / sizes
    right = (total - sums) / (n - sizes)
    return (sizes * (n - sizes) / n * (left - right) ** 2).max(axis=1)


def _split(values: np.ndarray, rng: np.random.Generator) -> tuple[int, float] | None:
    """The best split of ``values`` (ruptures) and its permutation p-value; None where too short."""
    n = len(values)
    if n < 2 * MIN_SIZE:
        return None
    cut = ruptures.Binseg(model="l2", min_size=MIN_SIZE, jump=1).fit(values).predict(n_bkps=1)[0]
    left, right = values[:cut], values[cut:]
    gain = len(left) * len(right) / n * (left.mean() - right.mean()) ** 2
    shuffles = np.array([rng.permutation(values) for _ in range(PERMUTATIONS)])
    as_large = int((_best_gains(shuffles) >= gain * (1 - 1e-12)).sum())
    return cut, (as_large + 1) / (PERMUTATIONS + 1)


def change_points(points: np.ndarray, *, alpha: float = ALPHA, seed: int = 0) -> list[Change]:
    """The change points of ``points`` (one value a run, in order), each with the medians of
    the segments either side of it among the final segmentation; NaN points are left out."""
    values = np.asarray(points, dtype=float)
    index = np.flatnonzero(~np.isnan(values))
    values = values[index]
    rng = np.random.default_rng(seed)
    cuts: list[tuple[int, float]] = []
    pending = [(0, len(values))]
    while pending:
        start, end = pending.pop()
        found = _split(values[start:end], rng)
        if found is None or found[1] > alpha:
            continue
        cut, p = found
        cuts.append((start + cut, p))
        pending += [(start, start + cut), (start + cut, end)]
    cuts.sort()
    bounds = [0, *(c for c, _ in cuts), len(values)]
    return [
        Change(
            position=int(index[cut]),
            before=float(np.median(values[bounds[i] : cut])),
            after=float(np.median(values[cut : bounds[i + 2]])),
            p_value=p,
        )
        for i, (cut, p) in enumerate(cuts)
    ]
