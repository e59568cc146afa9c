"""Sequential stopping of a batch case's rounds (``--bench-precision``, docs/metrics.md#sequential-stopping).

A case runs its minimum rounds (``matrix.rounds``), then more, until the 95 % interval of
every headline metric is within the target or ``matrix.max_rounds`` is reached. Checking a
fixed-n t interval after every round would not do: the more often it is looked at, the
likelier one look misses, and stopping when the rounds happen to agree (a small variance)
is stopping when the interval is likeliest to be too narrow. So the design is group
sequential: the intervals are looked at only at a few round counts fixed in advance (each
about 1.5 times the one before, the minimum first, the maximum last), and the 5 % error is
spent equally over those looks (Bonferroni). By the union bound, the chance that the
interval misses at *any* look is at most 5 %, so the interval at whatever look the case
stops at covers with 95 % at least, however the stop was decided (on this metric, another,
or the variance). Within each look, a t interval on the log of the per-round values: the
noise is relative, and the variance is unknown and estimated from the same rounds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lorabench.measure.latency import RoundSample
from lorabench.results.schema import ResultRow

ALPHA = 0.05
# The batch cases' headline metrics with a value per round: the round's e2e, and the mean
# TTFT and decode of its requests (the row's means are the means of these).
HEADLINE = ("e2e_ms", "ttft_ms", "decode_ms")
# Each look at about this many times the rounds of the one before: few looks, each with its
# share of the error large enough that an early stop stays possible.
LOOK_GROWTH = 1.5


def looks(min_rounds: int, max_rounds: int) -> tuple[int, ...]:
    """The round counts at which the intervals are judged: the minimum (2 at least: one
    round has no variance), each next about ``LOOK_GROWTH`` times the last, the maximum."""
    at = [min(max(min_rounds, 2), max_rounds)]
    while at[-1] < max_rounds:
        at.append(min(max_rounds, max(at[-1] + 1, math.ceil(at[-1] * LOOK_GROWTH))))
    return tuple(at)


def round_values(rnd: RoundSample) -> dict[str, float]:
    """One round's headline values: its e2e, and its requests' mean TTFT and decode (NaN
    where no request has one, as the prefill of an HTTP target)."""
    out = {"e2e_ms": rnd.e2e_ms}
    for metric in ("ttft_ms", "decode_ms"):
        values = [v for r in rnd.requests if not math.isnan(v := getattr(r, metric))]
        out[metric] = statistics.fmean(values) if values else math.nan
    return out


@dataclass(frozen=True)
class Interval:
    """A metric's interval: around the geometric mean of its per-round values, times and
    divided by ``1 + half_width`` (the half-width relative, as a fraction)."""

    center: float
    half_width: float

    @property
    def low(self) -> float:
        return self.center / (1.0 + self.half_width)

    @property
    def high(self) -> float:
        return self.center * (1.0 + self.half_width)


@dataclass(frozen=True)
class Verdict:
    """The intervals at one look, against the target (a fraction)."""

    rounds: int
    target: float
    intervals: Mapping[str, Interval]

    @property
    def half_width(self) -> float | None:
        """The widest interval's relative half-width; None when no metric could be judged."""
        return max((i.half_width for i in self.intervals.values()), default=None)

    @property
    def reached(self) -> bool:
        return self.half_width is not None and self.half_width <= self.target

    def interval_fields(self) -> dict[str, float]:
        """Each judged headline metric's half-width, %, as the row's ``<metric>_ci_pct``."""
        return {f"{metric}_ci_pct": 100.0 * i.half_width for metric, i in self.intervals.items()}

    def fields(self) -> dict[str, float | bool | None]:
        """The row's columns: the target and the achieved half-width in percent, and whether it was reached."""
        width = self.half_width
        return {
            "precision_target_pct": 100.0 * self.target,
            "precision_pct": None if width is None else 100.0 * width,
            "precision_reached": self.reached,
        }


@dataclass(frozen=True)
class Design:
    """The group-sequential design of one case: the target (a fraction) and the looks."""

    target: float
    looks: tuple[int, ...]
    alpha: float = ALPHA

    @classmethod
    def of(cls, target_pct: float, min_rounds: int, max_rounds: int) -> Design:
        return cls(target_pct / 100.0, looks(min_rounds, max_rounds))

    @property
    def max_rounds(self) -> int:
        return self.looks[-1]

    def interval(self, values: Sequence[float]) -> Interval | None:
        """The t interval of the mean log value at the look's level, ``alpha`` over the number
        of looks; None for a metric that has a value of 0 or less, or none, in some round."""
        if len(values) < 2 or not all(v > 0 for v in values):  # NaN fails the test too
            return None
        from scipy.special import stdtrit  # Student's t quantile; a third of a second to import, for this only

        logs = [math.log(v) for v in values]
        n = len(logs)
        quantile = float(stdtrit(n - 1, 1.0 - self.alpha / (2 * len(self.looks))))
        spread = quantile * statistics.stdev(logs) / math.sqrt(n)
        return Interval(math.exp(statistics.fmean(logs)), math.expm1(spread))

    def judge(self, rounds: Sequence[Mapping[str, float]]) -> Verdict | None:
        """The verdict after these rounds' headline values (one mapping a round); None where
        their count is not a look, and rounds must go on to the next."""
        if len(rounds) not in self.looks:
            return None
        intervals = {}
        for metric in HEADLINE:
            interval = self.interval([r[metric] for r in rounds])
            if interval is not None:
                intervals[metric] = interval
        return Verdict(len(rounds), self.target, intervals)

    @classmethod
    def fixed(cls, rounds: int) -> Design:
        """One look at ``rounds``, with no target: a fixed number of rounds' 95 % intervals."""
        return cls(math.inf, (rounds,))

    def stops(self, verdict: Verdict | None) -> bool:
        """Whether the case stops at this verdict: the target reached, or the last look."""
        return verdict is not None and (verdict.reached or verdict.rounds >= self.max_rounds)


def builds_fields(plan: Design, rows: Sequence[Mapping[str, float | None]]) -> dict[str, float | bool | None]:
    """A case's row on a build, given its builds' headline values so far (this one's last): the
    widest half-width of the builds' intervals at the design's level, %, and whether the design
    stops here (a look, every judged interval within the target). Blank before two builds."""
    if len(rows) < 2:
        return {}
    values = [{m: math.nan if r.get(m) is None else float(r[m]) for m in HEADLINE} for r in rows]
    widths = [i.half_width for m in HEADLINE if (i := plan.interval([v[m] for v in values])) is not None]
    if not widths:
        return {}
    verdict = plan.judge(values)
    return {"builds_precision_pct": 100.0 * max(widths), "builds_precision_reached": bool(verdict and verdict.reached)}


def cost_line(rows: Sequence[ResultRow], fixed_rounds: int) -> str | None:
    """What sequential stopping spent against the fixed design the run would have run without a
    target (``matrix.rounds`` a case): the cases that reached it, the measured rounds and
    seconds, each case's fixed rounds at its own mean round. None where no case had a target."""
    cases = [r for r in rows if r.precision_target_pct is not None and r.measured_s and r.rounds]
    if not cases:
        return None
    spent = sum(r.measured_s for r in cases)
    fixed = sum(r.measured_s / r.rounds * fixed_rounds for r in cases)
    reached = sum(bool(r.precision_reached) for r in cases)
    return (
        f"sequential stopping: {reached} of {len(cases)} cases reached {cases[0].precision_target_pct:g} %, in "
        f"{sum(r.rounds for r in cases)} measured rounds ({fixed_rounds} a case without a target): {spent:.1f} s "
        f"measured against about {fixed:.1f} s at the fixed rounds ({spent / fixed:.2f}x), no-LoRA baselines apart"
    )
