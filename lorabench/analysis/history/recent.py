"""The newest nights against the level before them: a step seen before a change point can be.

A change point needs ``MIN_SIZE`` runs after it, and then its p-value is paid for every split
tried; so a fresh step took nights to fail the gate, and in between a single odd night could
hide it. Here the newest ``k`` runs (``k`` from 1 to ``MAX_BLOCK``) are tested together
against the runs of the level they follow, one-sided in the metric's worse direction, with
the noise pooled over the series' whole history (the spread of every earlier run about its
own level: dozens of degrees of freedom where one level has a few). The block that is most
surely worse is the suspect, its p-value multiplied by the blocks tried.

Its verdict is the family's: ``family_discoveries`` controls the false discovery rate over
every series judged (Benjamini-Hochberg) rather than their family-wise error: when all
series hold, a false discovery is as rare as under Bonferroni (at most ``ALPHA`` a night),
and when some step, it does not make each of them pay for all the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lorabench.analysis.cases import METRICS
from lorabench.analysis.history.changes import MIN_SIZE, on_scale
from lorabench.analysis.history.series import Series

# The most newest runs tested as one block: past this, a step has its change point.
MAX_BLOCK = 4


@dataclass(frozen=True)
class Suspect:
    """The newest ``nights`` runs of ``series``, worse than the level before them."""

    series: Series
    nights: int  # the block: the newest this many runs
    level: float  # the median of the level before the block
    newest: float  # the block's median
    worse: float  # by how much, in the metric's direction (0.12: 12 % worse)
    p_value: float  # one-sided, for this series (the blocks tried accounted for)
    own_p: float = 1.0  # the block's own, before that

    @property
    def first(self) -> int:
        """The position of the block's first run: where the suspected change lies."""
        return len(self.series.runs) - self.nights


def suspect(
    s: Series, threshold: float, worse_by: Callable[[str, float, float], float], min_nights: int = 1
) -> Suspect | None:
    """The block of at least ``min_nights`` newest runs most surely worse than the level
    before it beyond ``threshold``; None where no block is, or the series is too short to
    have a level before it. ``worse_by`` is the gate's measure of worse."""
    values, medians = on_scale(s.medians), s.medians
    n = len(values)
    tried, best = 0, None
    for k in _blocks(s, n, min_nights):
        start = _level_start(s, n - k)
        if n - k - start < MIN_SIZE:
            break
        tried += 1
        level = float(np.median(medians[start : n - k]))
        block = medians[n - k :]
        worse = worse_by(s.metric, level, float(np.median(block)))
        # A step moves every night after it: one odd night among normal ones is no step.
        least = min(worse_by(s.metric, level, float(v)) for v in block)
        if worse <= threshold or least <= threshold / 2:
            continue
        p, gap = _one_sided_p(s, values[: n - k], values[start : n - k], values[n - k :])
        rank = (p, -round(gap, 9), -k)  # the surest block; on a tie, the farther, then the longer
        if best is None or rank < best[0]:
            best = (rank, k, level, float(np.median(block)), worse)
    if best is None:
        return None
    (p, _, _), k, level, newest, worse = best
    return Suspect(s, k, level, newest, worse, min(1.0, p * tried), p)


def _blocks(s: Series, n: int, min_nights: int) -> range:
    """The block sizes to try. Where a change point lies among the newest runs, the block is
    the runs since it, and no other: a block that starts a run off the step would name the
    wrong run (and the stacks of two runs on one side of it), and the level path judges a
    step once it has ``MAX_BLOCK`` runs after it."""
    near = [c.position for c in s.changes if c.position > n - MAX_BLOCK - MIN_SIZE]
    if not near:
        return range(min_nights, MAX_BLOCK + 1)
    k = n - near[-1]
    return range(k, k + 1) if min_nights <= k <= MAX_BLOCK else range(0)


def _level_start(s: Series, end: int) -> int:
    """Where the level that runs up to ``end`` begins: the last change point that leaves it
    ``MIN_SIZE`` runs (a change point inside the block is the block's own step)."""
    starts = [c.position for c in s.changes if c.position <= end - MIN_SIZE]
    return starts[-1] if starts else 0


def _one_sided_p(s: Series, before: np.ndarray, level: np.ndarray, block: np.ndarray) -> tuple[float, float]:
    """Student's t of the block against the level, one-sided in the worse direction, with the
    noise pooled over every run before the block about its own level's mean; and the gap."""
    from lorabench.analysis.compare.noise import t_sf

    cuts = [0, *(c.position for c in s.changes if c.position < len(before)), len(before)]
    segments = [before[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
    df = len(before) - len(segments)
    gap = float(block.mean() - level.mean())
    gap = -gap if METRICS[s.metric] else gap  # higher is better: worse is lower
    if df < 1:
        return 1.0, gap
    pooled = sum(((seg - seg.mean()) ** 2).sum() for seg in segments) / df
    if pooled == 0:
        return (0.0 if gap > 0 else 1.0), gap
    return t_sf(gap / np.sqrt(pooled * (1 / len(block) + 1 / len(level))), df), gap


def family_discoveries(p_values: Sequence[float], alpha: float, family: int) -> list[bool]:
    """Benjamini-Hochberg at ``alpha`` over a family of ``family`` series, of which these are
    the ones with a p-value (the rest count as 1): which of them are discoveries."""
    order = np.argsort(p_values)
    ranked = np.asarray(p_values, dtype=float)[order]
    passed = np.flatnonzero(ranked <= alpha * np.arange(1, len(ranked) + 1) / max(family, 1))
    cutoff = passed[-1] + 1 if len(passed) else 0
    found = np.zeros(len(ranked), dtype=bool)
    found[order[:cutoff]] = True
    return found.tolist()


def adjusted(p_values: Sequence[float], family: int) -> list[float]:
    """Benjamini-Hochberg's adjusted p-values (the smallest alpha each would be found at)."""
    if not p_values:
        return []
    order = np.argsort(p_values)
    ranked = np.asarray(p_values, dtype=float)[order] * max(family, 1) / np.arange(1, len(p_values) + 1)
    ranked = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(len(ranked))
    out[order] = np.minimum(ranked, 1.0)
    return out.tolist()
