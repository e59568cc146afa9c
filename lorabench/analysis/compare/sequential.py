"""A sequential A/B session (``lorabench ab --sequential``): the pairs are looked at after each
one from the ``FIRST_LOOK``-th, and the session stops at the first look where its verdict is
decided, rather than after the ``--pairs`` it was given, which is then its most.

The design is group-sequential with Bonferroni's split over the looks: of K possible looks,
each tests at ``alpha / K``, so that over the whole session a false finding, and a wrong "not
slower", each happen at ``alpha`` at most for a case-metric, however the looks fall. A look is
decided where:

- **found**: the comparison at ``alpha / K`` found what fails an A/B session (a case-metric
  REGRESSED past its threshold, a failure, an isolation breach, changed outputs: the kinds of
  ``lorabench.ab.kinds``), which more pairs would not take back at these error rates;
- **cleared**: nothing was found, and every shared case-metric was tested and either IMPROVED
  or its one-sided ``1 - alpha / K`` upper bound on the change in the bad direction is below
  its threshold: more pairs could not show a slowdown that large at these error rates.

Bonferroni over looks is conservative where looks are correlated (they are: each adds one pair
to the last), so a fixed session of the same most pairs flags a little more often; in exchange
the bound holds for any number of looks and needs no spending function. The cost is measured
in ``scripts/bench_ab_sequential.py``.
"""

from __future__ import annotations

import math

from lorabench.analysis.cases import METRICS
from lorabench.analysis.compare.analysis import IMPROVED, Comparison, Finding
from lorabench.analysis.compare.noise import t_ppf

FIRST_LOOK = 3  # the first pair count with both orders and a drift to fit (lorabench.analysis.compare.paired)
FOUND, CLEARED = "found", "cleared"


def looks(max_pairs: int) -> int:
    """How many looks a session of at most ``max_pairs`` pairs may take."""
    return max(1, max_pairs - FIRST_LOOK + 1)


def look_alpha(alpha: float, max_pairs: int) -> float:
    """The level each look tests at: ``alpha`` split over the looks."""
    return alpha / looks(max_pairs)


def worse_bound_pct(finding: Finding, alpha_look: float) -> float | None:
    """The one-sided ``1 - alpha_look`` upper bound on ``finding``'s change in its bad direction,
    %; None where it was not tested on pairs."""
    if finding.se is None or finding.df is None:
        return None
    worse = -math.log(finding.ratio) if METRICS[finding.metric] else math.log(finding.ratio)
    return (math.exp(worse + t_ppf(1 - alpha_look, finding.df) * finding.se) - 1) * 100


def decision(result: Comparison, found: int, alpha_look: float) -> str | None:
    """FOUND, CLEARED or None (look again after another pair) for a comparison made at
    ``alpha_look``; ``found``: its findings of every kind (``lorabench.ab.kinds.found_in``)."""
    if found:
        return FOUND
    if not result.findings:
        return None
    for f in result.findings:
        bound = worse_bound_pct(f, alpha_look)
        if f.verdict != IMPROVED and (bound is None or bound >= f.threshold_pct):
            return None
    return CLEARED
