"""The capacity search: the highest request rate at which a target share of requests meets
both latency SLOs (DistServe's goodput definition), found by probing.

A probe is one open-loop replay at one rate. It is *over* when its attainment is below
the target, or when requests are still unfinished at the end of its drain (each request's
SLO budget, twice, from its arrival: docs/capacity.md#the-drain): an engine whose queue
grows is overloaded whatever the requests that did finish say; one certainly over stops early
(``lorabench.measure.probe_stop``) and fails as it would have. The search starts from a
short closed-loop estimate of what the engine can serve, brackets the SLO edge by
doubling and halving the rate, then bisects (on a log scale: the bracket is a ratio)
until the lowest failing rate is within ``precision`` of the highest passing one. Only
rates inside the bracket are probed once it exists, so the highest passing rate always
stays below the lowest failing one, whatever the noise.

A probe that measured fewer than ``MIN_REQUESTS`` requests decides nothing: a verdict on
three requests is noise. It is run again at the same rate, its measured span twice as long
(up to ``MAX_STRETCH`` times the configured one), and only a decided probe moves the search.
Whether a probe is rerun depends on how many requests it measured, never on what they
showed, so the rerun cannot bias the verdict; and an undecided probe is neither the highest
passing nor the lowest failing one, so the bracket's invariant holds.

A probe in which the engine failed requests decides nothing either, and stops the search
(``search_stop`` says so): it measured a broken server, not a saturated one. Nor does a
probe whose client fell behind its schedule (it offered the engine less than its rate):
it is run once more at its rate, in case its host only hiccuped, and stops the search
if it falls behind again (docs/capacity.md).

Everything here is independent of the engine: a probe is a function of the rate, so the
search is tested against engines whose true capacity is known.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lorabench.config.trace_sections import MIN_REQUESTS
from lorabench.measure.capacity_edge import boundary_interval as boundary_interval  # the search's, read here
from lorabench.results.records import ProbeRecord
from lorabench.results.search_stops import (  # the search writes them; tests read them here too
    ABOVE_RANGE,
    BELOW_RANGE,
    BRACKETED,
    FAILED,
    PROBE_LIMIT,
    TIME_LIMIT,
    TOO_FEW,
)

# How many times the configured measured span an undecided probe's rerun may last: 1, 2, then 4.
MAX_STRETCH = 4.0
# The first probe, as a share of the closed-loop estimate (the engine's throughput with no
# latency target, at the estimate's concurrency): capacity under a target is usually below it.
FIRST_PROBE_SHARE = 0.5
Z_95 = 1.959964


def wilson_interval(met: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial share: honest near 0 and 1, where the
    normal approximation gives bounds outside [0, 1] or of zero width."""
    if n == 0:
        return (math.nan, math.nan)
    p = met / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class Probe:
    """One replay at one rate: its measured requests (after the warm-up), how many met the
    SLO, how many were still unfinished after the drain bound, and what else it recorded."""

    rate: float
    requests: int
    met: int
    unfinished: int
    target: float
    # Its measured span over the configured one: 1, or more for a rerun of an undecided probe.
    stretch: float = 1.0
    # Requests the engine failed (HTTP: an error status, a broken stream), and the first error.
    failed_requests: int = 0
    first_error: str = ""
    # Why its client fell behind its schedule (replay_summary.client_behind), or "".
    behind: str = ""
    # Why it stopped early, certainly over (lorabench.measure.probe_stop), or "": then
    # ``requests`` and ``met`` are those due by the stop, and ``planned`` what it would have measured.
    stopped: str = ""
    planned: int = 0
    # Goodput, engine state and latencies of the probe, as the probes file keeps them.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def attainment(self) -> float:
        return self.met / self.requests if self.requests else math.nan

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.met, self.requests)

    def record(self, index: int) -> ProbeRecord:
        """As the probes file keeps it: ``index`` in the order the search ran them."""
        low, high = self.interval
        return ProbeRecord(
            probe=index,
            rate=self.rate,
            requests=self.requests,
            met=self.met,
            unfinished=self.unfinished,
            attainment=self.attainment,
            ci_low=low,
            ci_high=high,
            failed_requests=self.failed_requests,
            passed=self.passed,
            decided=self.decided,
            undecided_why=None if self.decided else self.void or TOO_FEW,
            stopped_early=self.stopped or None,
            planned=self.planned or None,
            **self.extra,
        )

    @property
    def void(self) -> str:
        """What makes its verdict meaningless, however many requests it measured: requests the
        engine failed (not an overload), or a client that fell behind (not the rate claimed)."""
        if self.failed_requests:
            return f"{FAILED}: {self.first_error}"
        return self.behind

    @property
    def decided(self) -> bool:
        """Measured enough requests for a verdict (a stopped probe: planned them), and nothing
        voids it: otherwise it neither passes nor fails."""
        return (self.planned if self.stopped else self.requests) >= MIN_REQUESTS and not self.void

    @property
    def passed(self) -> bool:
        """At or above the target with nothing left unfinished: an overload never passes, nor
        does a probe stopped with its SLO lost."""
        return self.decided and not self.stopped and self.unfinished == 0 and self.attainment >= self.target

    @property
    def failed(self) -> bool:
        """Decided and not passed: below the target, or requests left unfinished."""
        return self.decided and not self.passed


@dataclass(frozen=True)
class Limits:
    """Where the search may look and when it gives up."""

    precision: float
    min_rate: float
    max_rate: float | None
    max_probes: int
    max_time_s: float
    # The longest one probe takes (its arrivals and its drain): none starts that would end past
    # max_time_s. A rerun stretched k times is counted as k times that (its warm-up and drain too).
    probe_s: float = 0.0
    # Where a probe's length depends on its rate (an imported trace's fixed slice): its length
    # at (rate, stretch), arrivals and drain, instead of probe_s times the stretch.
    length: Callable[[float, float], float] | None = None

    def probe_length(self, rate: float, stretch: float) -> float:
        return self.length(rate, stretch) if self.length is not None else self.probe_s * stretch


@dataclass
class Search:
    """The probes in the order they ran, and why the search stopped."""

    probes: list[Probe]
    stop: str
    estimate_rps: float = math.nan

    @property
    def capacity(self) -> Probe | None:
        """The highest passing probe."""
        passed = [p for p in self.probes if p.passed]
        return max(passed, key=lambda p: p.rate) if passed else None

    @property
    def over(self) -> Probe | None:
        """The lowest failing probe."""
        failed = [p for p in self.probes if p.failed]
        return min(failed, key=lambda p: p.rate) if failed else None


def next_rate(search: Search, limits: Limits) -> float | None:
    """The rate to probe next, or None with ``search.stop`` set when the search is done."""
    low, high = search.capacity, search.over
    if low is not None and high is not None:
        if high.rate <= low.rate * (1 + limits.precision):
            search.stop = BRACKETED
            return None
        return math.sqrt(low.rate * high.rate)
    if high is None:
        if limits.max_rate is not None and low.rate >= limits.max_rate:
            search.stop = ABOVE_RANGE
            return None
        return min(2 * low.rate, limits.max_rate or math.inf)
    if high.rate <= limits.min_rate:
        search.stop = BELOW_RANGE
        return None
    return max(high.rate / 2, limits.min_rate)


def first_rate(estimate_rps: float, limits: Limits) -> float:
    """Where the search starts: a share of the closed-loop estimate, inside the range."""
    rate = FIRST_PROBE_SHARE * estimate_rps if estimate_rps > 0 else limits.min_rate
    return min(max(rate, limits.min_rate), limits.max_rate or math.inf)


def search(
    probe_at: Callable[[float, float], Probe],
    estimate_rps: float,
    limits: Limits,
    clock: Callable[[], float] = time.monotonic,
    started: float | None = None,
) -> Search:
    """Probe rates until the SLO edge is bracketed within ``limits.precision``, the range's
    end is passed, or a limit on probes or time is reached (``Search.stop`` says which).
    ``probe_at(rate, stretch)`` runs one probe, its measured span ``stretch`` times the
    configured one; ``started``: when the search's time began (before its estimate), on ``clock``."""
    started = clock() if started is None else started
    found = Search([], stop="", estimate_rps=estimate_rps)
    rate: float | None = first_rate(estimate_rps, limits)
    stretch, retried = 1.0, False
    while rate is not None:
        if len(found.probes) >= limits.max_probes:
            found.stop = PROBE_LIMIT
            break
        if clock() - started + limits.probe_length(rate, stretch) > limits.max_time_s:
            found.stop = TIME_LIMIT
            break
        probe = probe_at(rate, stretch)
        found.probes.append(probe)
        if probe.void:
            if probe.failed_requests or retried:
                found.stop = probe.void
                break
            retried = True  # a client behind once may have met a passing hiccup of its host
            continue
        retried = False
        if probe.decided:
            rate, stretch = next_rate(found, limits), 1.0
        elif probe.stretch < stretch or 2 * stretch > MAX_STRETCH:
            # As long as it could be made, or as long as allowed.
            found.stop = TOO_FEW
            break
        else:
            stretch *= 2
    return found
