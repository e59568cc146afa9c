"""The nightly gate: is the newest run's level of a metric worse, beyond its threshold, than
a level the series held before it?

Two ways to see it, for each series. Levels: the series is cut at its change points, and the
newest level is compared with every earlier one, not only with the one just before: a 15 %
regression followed by a 5 % recovery is still 10 % worse, and two 4 % steps are 8 %; every
step between the two is named with its share. The newest nights (``recent``): a block of the
newest runs against the level they follow, before a change point can be placed.

Many series are judged at once (every case, every metric), so each series' p-value (Student's
t, multiplied by the splits or blocks it was chosen from, and by the two ways) is judged for
the whole family by Benjamini-Hochberg at ``FAMILY_ALPHA``: with no step anywhere, few nights
fail (2 in 300 on 200 series of noise, docs/lab/2026-12-measurements.md); with steps, they
are not each held back by the rest. A suspected step the family test does not yet confirm
is said every night until it is (WATCH).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from lorabench.analysis.cases import METRICS
from lorabench.analysis.history import recent
from lorabench.analysis.history.changes import MIN_SIZE, Change, on_scale, student_p
from lorabench.analysis.history.series import Series, settings_changed

# The smallest worsening that fails the gate: vLLM's dashboard flags 1.2x, vllm-ascend's
# nightly 0.97x of a baseline; a change is already told from noise, so the threshold only
# says how much is worth a failed night.
GATE_THRESHOLD = 0.05
# The newest nights must be this many to fail the gate before they make a level: one odd
# night (a noisy neighbour) is said (WATCH), not failed.
CONFIRM_NIGHTS = 2
# A series' own p-value at or under this puts a suspected step on the watch list.
WATCH_ALPHA = 0.01
# The family's false discovery rate, half the change points' ALPHA (0.01): the levels and blocks
# judged were chosen from the same runs, which makes their p-values a little optimistic; at
# 0.01, 200 series of noise alone failed 5 nights in 300 (scripts/bench_gate_power.py).
FAMILY_ALPHA = 0.005


@dataclass(frozen=True)
class Step:
    """One change point between the level compared with and the newest, and its share."""

    change: Change
    worse: float  # the level after it against the level before it (0.12: 12 % worse)


@dataclass(frozen=True)
class Regression:
    series: Series
    change: Change  # the first change point after the level compared with (recent: the block's start)
    level: float  # that earlier level (median of its runs)
    newest: float  # the newest level
    worse: float  # the share by which the metric got worse: 0.12 is 12 % worse
    p_value: float  # for the family of series judged (Benjamini-Hochberg's adjusted p)
    threshold: float  # the metric's threshold it passed
    steps: tuple[Step, ...] = ()  # each change point on the way, oldest first
    nights: int = 0  # recent: the newest this many runs, not yet a level of their own
    own_p: float = 1.0  # this series' own p-value for the level or block chosen, uncorrected

    def stack_change(self, change: Change | None = None) -> str:
        """What differs between the runs at the two ends of where ``change`` (the first, by
        default) may lie: their stacks (``vllm_version 0.32.0 -> 0.33.0``), then the settings
        they ran with that the case key leaves out (``settings: matrix.rounds: 10 -> 3``),
        which move a level as a new version does."""
        change = change or self.change
        runs = self.series.runs
        before, after = runs[max(change.first - 1, 0)], runs[change.last]
        old, new = before.stack, after.stack
        changed = [f"{k} {old[k]} -> {new[k]}" for k in old if old[k] != new.get(k)]
        settings = settings_changed(before, after, self.series.scenario)
        if settings:
            changed.append(f"settings: {'; '.join(settings)}")
        if changed:
            return ", ".join(changed)
        if settings is None:
            return "the same stack (the host, the harness or settings not kept drifted)"
        return "the same stack and settings (the host or the harness drifted)"


def worse_by(metric: str, before: float, after: float) -> float:
    """How much worse ``after`` is than ``before`` for ``metric``, in its own direction, as
    ``compare`` and ``ab`` say it: a throughput from 10 to 8 is 20 % worse (1 - 8/10), not 25 %."""
    higher_is_better = METRICS[metric]
    if not before:  # from 0 no ratio: any change is all the way, in its direction
        return 0.0 if after == before else float("-inf" if (after > before) == higher_is_better else "inf")
    if higher_is_better:
        return 1 - after / before
    return after / before - 1


def _levels(s: Series, values: np.ndarray) -> list[np.ndarray]:
    """``values`` (one a run) cut into the series' levels, oldest first."""
    cuts = [0, *(c.position for c in s.changes), len(s.runs)]
    return [values[a:b] for a, b in zip(cuts, cuts[1:])]


def _worst(s: Series, threshold: float) -> Regression | None:
    """The earlier level the newest is worst against beyond ``threshold``, with this series'
    own p-value (Student's t times the splits its change points were chosen from)."""
    levels = _levels(s, s.medians)
    newest = float(np.median(levels[-1]))
    scaled_levels = _levels(s, on_scale(s.medians))  # one scale for the whole series
    splits = max(len(s.runs) - 2 * MIN_SIZE + 1, 1)
    found = None
    for i, level in enumerate(levels[:-1]):
        worse = worse_by(s.metric, float(np.median(level)), newest)
        if worse > threshold and (found is None or worse > found.worse):
            own = student_p(scaled_levels[i], scaled_levels[-1])
            p = min(1.0, own * splits)
            steps = tuple(
                Step(c, worse_by(s.metric, float(np.median(levels[j])), float(np.median(levels[j + 1]))))
                for j, c in enumerate(s.changes)
                if j >= i
            )
            found = Regression(s, s.changes[i], float(np.median(level)), newest, worse, p, threshold, steps, own_p=own)
    return found


def _recent(s: Series, threshold: float, min_nights: int) -> Regression | None:
    """The newest nights as a block worse than their level (``recent``), as a ``Regression``."""
    found = recent.suspect(s, threshold, worse_by, min_nights)
    if found is None:
        return None
    at = found.first
    # A change point where the block starts says where else the step may lie.
    change = next((c for c in s.changes if c.position == at), Change(at, at, at, found.level, found.newest, 0.0))
    return Regression(
        s,
        change,
        found.level,
        found.newest,
        found.worse,
        found.p_value,
        threshold,
        nights=found.nights,
        own_p=found.own_p,
    )


def only_bounds(r: Regression) -> bool:
    """Whether every run of the newest level or block is a bound (a capacity capped at its
    max_rate: at least that), which cannot read as worse than a level measured above it."""
    s = r.series
    return bool(s.bounds) and all(s.bounds[r.change.position if r.nights else _newest_start(s) :])


def _newest_start(s: Series) -> int:
    return s.changes[-1].position if s.changes else 0


def not_comparable(found: Sequence[Series], threshold: float, per_metric: dict[str, float]) -> list[Regression]:
    """The series whose newest runs read as worse only because they are bounds: said, never failed."""
    out = []
    for s in (s for s in found if s.bounds and s.bounds[-1]):
        limit = per_metric.get(s.metric, threshold)
        ways = [w for w in (_worst(s, limit) if s.changes else None, _recent(s, limit, 1)) if w]
        out += [w for w in ways[:1] if only_bounds(w)]
    return out


def _candidates(found: Sequence[Series], threshold: float, per_metric: dict[str, float], min_nights: int):  # noqa: ANN202
    """Each series' surest way of being worse (levels or its newest nights), its p-value
    doubled for the two ways looked at; bounds read as worse are none."""
    out = []
    for s in found:
        limit = per_metric.get(s.metric, threshold)
        ways = [w for w in (_worst(s, limit) if s.changes else None, _recent(s, limit, min_nights)) if w]
        ways = [w for w in ways if not only_bounds(w)]
        if ways:
            best = min(ways, key=lambda w: w.p_value)
            out.append(replace(best, p_value=min(1.0, 2 * best.p_value)))
    return out


def regressions(found: Sequence[Series], threshold: float, per_metric: dict[str, float]) -> list[Regression]:
    """The series (each with the newest run in it) whose newest level, or newest
    ``CONFIRM_NIGHTS`` nights and more, are worse than an earlier level beyond the metric's
    threshold, told from noise for the whole family (Benjamini-Hochberg at ``FAMILY_ALPHA``)."""
    candidates = _candidates(found, threshold, per_metric, CONFIRM_NIGHTS)
    p_values = [c.p_value for c in candidates]
    q_values = recent.adjusted(p_values, len(found))
    return [replace(c, p_value=q) for c, q in zip(candidates, q_values) if q <= FAMILY_ALPHA]


def watch(
    found: Sequence[Series], threshold: float, per_metric: dict[str, float], flagged: Sequence[Regression]
) -> list[Regression]:
    """Series worse than their level beyond the threshold, by their own test of the level or
    block chosen (p at most ``WATCH_ALPHA``, uncorrected: a watch list trades a few lines of
    noise for naming a real step from its first night), that no regression names: a step too
    fresh, or too small against the noise, for the family's test. Said every night until
    confirmed or gone; never a failure."""
    named = {id(r.series) for r in flagged}
    rest = [s for s in found if id(s) not in named]
    return [c for c in _candidates(rest, threshold, per_metric, 1) if c.own_p <= WATCH_ALPHA]


def output_changes(
    newest: dict[tuple[str, str, str], str], before: dict[tuple[str, str, str], str]
) -> list[tuple[tuple[str, str, str], str, str]]:
    """The adapters whose greedy output differs between the run before and the newest (same
    model and device): the night an output changed fails once, with both digests named."""
    shared = sorted(newest.keys() & before.keys())
    return [(key, before[key], newest[key]) for key in shared if newest[key] != before[key]]
