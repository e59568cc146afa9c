"""A sequential A/B session (``lorabench ab --sequential``): the pairs are looked at after each
one from the ``FIRST_LOOK``-th, and the session stops at the first look where its verdict is
decided, rather than after the ``--pairs`` it was given, which is then its most.

The design is group-sequential with Bonferroni's split over the looks: of K possible looks,
each tests at ``alpha / K``. An interim look is decided where:

- **found**: a case-metric's change in the bad direction is past its threshold at ``1 -
  alpha / K`` (its one-sided lower bound at or past the threshold, not only its estimate), or
  the comparison found what needs no test (a failure, an isolation breach, changed outputs, a
  collapsed capacity: the other kinds of ``lorabench.ab.kinds``);
- **cleared**: nothing was found, every shared case-metric was tested, and each either
  IMPROVED or has its one-sided ``1 - alpha / K`` upper bound on the change in the bad
  direction below its threshold; and no capacity was left undecided by its bounds.

So a stop claims a change past the threshold, or none as large, each wrong at ``alpha / K`` a
look for a case-metric, ``alpha`` over the session by the union bound. A session that runs to
``--pairs`` is judged as ``compare`` judges, at ``alpha / K`` (its estimate past the threshold
and significant against no change), which is the fixed design's rule at a smaller alpha.
Bonferroni over looks is conservative where looks are correlated (each adds one pair to the
last), but holds for any number of looks and needs no spending function. What it saves and
costs: ``scripts/bench_ab_sequential.py`` (the lab log).
"""

from __future__ import annotations

import math

from lorabench.analysis.cases import METRICS
from lorabench.analysis.compare.analysis import IMPROVED, REGRESSED, Comparison, Finding
from lorabench.analysis.compare.noise import t_ppf

FIRST_LOOK = 3  # the first pair count with both orders and a drift to fit (lorabench.analysis.compare.paired)
FOUND, CLEARED = "found", "cleared"


def looks(max_pairs: int) -> int:
    """How many looks a session of at most ``max_pairs`` pairs may take."""
    return max(1, max_pairs - FIRST_LOOK + 1)


def look_alpha(alpha: float, max_pairs: int) -> float:
    """The level each look tests at: ``alpha`` split over the looks."""
    return alpha / looks(max_pairs)


def worse_bound_pct(finding: Finding, alpha_look: float, upper: bool = True) -> float | None:
    """The one-sided ``1 - alpha_look`` upper (or lower) bound on ``finding``'s change in its bad
    direction, %; None where it was not tested on pairs."""
    if finding.se is None or finding.df is None:
        return None
    worse = -math.log(finding.ratio) if METRICS[finding.metric] else math.log(finding.ratio)
    margin = t_ppf(1 - alpha_look, finding.df) * finding.se
    return (math.exp(worse + (margin if upper else -margin)) - 1) * 100


def decision(result: Comparison, found: int, alpha_look: float) -> str | None:
    """FOUND, CLEARED or None (look again after another pair) for a comparison made at
    ``alpha_look``; ``found``: its findings that need no test (``lorabench.ab.kinds.found_in``
    but the slowdowns, which are judged here on their bounds)."""
    if found or any(_past(f, alpha_look) for f in result.findings):
        return FOUND
    if not result.findings or any(b.change == 0 for b in result.capacity_bounds):
        return None
    for f in result.findings:
        bound = worse_bound_pct(f, alpha_look)
        if f.verdict != IMPROVED and (bound is None or bound >= f.threshold_pct):
            return None
    return CLEARED


def _past(finding: Finding, alpha_look: float) -> bool:
    """A regression whose change past the threshold is established: its lower bound too."""
    lower = worse_bound_pct(finding, alpha_look, upper=False)
    return finding.verdict == REGRESSED and lower is not None and lower >= finding.threshold_pct
