"""The capacity search's SLO edge with a 95 % interval over its probes (``capacity_ci_low_rps``,
``capacity_ci_high_rps``; ``lorabench.measure.capacity`` runs the search and judges its probes).

Attainment is taken to fall with the rate as ``logit p(r) = logit(target) - b * log(r / edge)``,
b > 0: the edge is where it meets the target. The interval is the edges whose profile
likelihood, maximised over b, is within ``chi2(1, 0.95) / 2`` of the best.

What each decided probe adds to the likelihood:

- a probe that ran whole, its measured requests, each a Bernoulli trial at its rate;
- a probe that left requests unfinished (a queue that grew), nothing: it bounds the edge from
  above, whatever its attainment;
- a probe stopped early with its SLO lost (``lorabench.measure.probe_stop``), the one thing it
  made certain: its ``planned`` requests would have met the SLOs fewer than ``target`` times,
  ``P(Binomial(planned, p(r)) < target × planned)``. Its requests not sent are neither meets nor
  misses there, nor are those it sent: they are its earliest, before its queue grew as long as
  it would have, so their attainment is higher than a whole probe's (9 of 9 met at 1.2 times
  the stand-in's rate, where the whole probe fails); taken as trials they would pull the edge
  up past rates that fail.

That event is one bit, and its likelihood ratio is not the chi-squared's: near the edge it can
rule a rate out more firmly than the whole probe's count would (an unlucky 26 of 29 at a rate
20 % under the edge). A probe is therefore stopped only while at most half of its requests are
sent (``probe_stop.CLEAR_SHARE``), where a fail is an overload beyond doubt. Simulated on
scripts/bench_capacity_interval.py's attainment curves (no queue growth), 400 searches each,
requests in random order: with every fail stopped as soon as certain, coverage fell from
94.5 % to 91 % (steepness 6) and from 91 % to 81 % (steepness 2); stopped by that rule, it
stayed at 94.5 % and 91 %, as with whole probes (tests/test_probe_stop.py checks it; a
share of 0.75 gave 86 % at steepness 2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

# The edge's profile likelihood: the grid of edges (log rate) from this far below the lowest
# probed rate to as far above the highest, and of attainment slopes; the chi-squared(1) cut.
EDGE_SPAN, EDGE_GRID, SLOPE_GRID = 3.0, 601, 121
CHI2_1_95 = 3.841459
# A stopped probe's log-probability of failing, tabled against logit p from -40 to 40 by 0.02.
FAIL_LOGIT, FAIL_GRID = 40.0, 4001


class Judged(Protocol):
    """What the interval reads of a probe (``lorabench.measure.capacity.Probe``)."""

    rate: float
    requests: int
    met: int
    unfinished: int
    target: float
    stopped: str
    planned: int

    @property
    def decided(self) -> bool: ...


def boundary_interval(probes: Sequence[Judged]) -> tuple[float | None, float | None]:
    """The SLO edge's 95 % profile-likelihood interval over the decided probes (the module's
    docstring). A side the probes do not bound (every probe passed, or none did) is None."""
    decided = [p for p in probes if p.decided]
    counted = [p for p in decided if p.unfinished == 0 and not p.stopped]
    stopped = [p for p in decided if p.stopped]
    overloaded = [p.rate for p in decided if p.unfinished > 0]
    if not counted and not stopped:
        return None, (min(overloaded) if overloaded else None)
    import numpy as np

    rates = np.log([p.rate for p in (*counted, *stopped)])
    edges = np.linspace(rates.min() - EDGE_SPAN, rates.max() + EDGE_SPAN, EDGE_GRID)
    slopes = np.exp(np.linspace(math.log(0.05), math.log(200.0), SLOPE_GRID))
    target = (counted or stopped)[0].target
    logit = math.log(target / (1 - target))
    # log p(r) and log (1 - p(r)) at each probe's rate, for each edge and slope: (edge, slope, probe).
    eta = logit - slopes[None, :, None] * (rates[None, None, :] - edges[:, None, None])
    log_meet, log_miss = -np.logaddexp(0, -eta), -np.logaddexp(0, eta)
    met, n = np.array([p.met for p in counted], float), np.array([p.requests for p in counted], float)
    k = len(counted)
    loglik = (met * log_meet[..., :k] + (n - met) * log_miss[..., :k]).sum(axis=2)
    for j, p in enumerate(stopped, k):
        loglik += np.interp(eta[..., j], *_log_fail(p.planned, target))
    loglik = loglik.max(axis=1)
    inside = edges[loglik >= loglik.max() - CHI2_1_95 / 2]
    low = None if inside.min() <= edges[0] else float(math.exp(inside.min()))
    high = None if inside.max() >= edges[-1] else float(math.exp(inside.max()))
    if overloaded:
        high = min(high if high is not None else math.inf, min(overloaded))
    if low is not None and high is not None and low > high:  # the overload bound cuts it away
        low = None
    return low, high


def _log_fail(planned: int, target: float) -> tuple[Any, Any]:
    """``log P(Binomial(planned, p) < target × planned)`` against ``logit p`` on a grid, to be
    interpolated: the distribution function at every point of the likelihood's grid took half a
    second a probe. Past the grid's ends p is 0 or 1 to 17 digits, and the value flat enough."""
    import numpy as np
    from scipy.special import bdtr, expit

    grid = np.linspace(-FAIL_LOGIT, FAIL_LOGIT, FAIL_GRID)
    fail = bdtr(_most_met_failing(planned, target), planned, expit(grid))
    return grid, np.log(np.maximum(fail, 1e-300))


def _most_met_failing(planned: int, target: float) -> int:
    """The most meets of ``planned`` that still fail ``target``, as a probe judges it (met /
    requests >= target passes), floating point included."""
    most = math.ceil(target * planned)
    while most > 0 and most / planned >= target:
        most -= 1
    return most
