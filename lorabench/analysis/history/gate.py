"""The nightly gate: is the newest run's level of a metric worse, beyond its threshold, than
a level the series held before it?

Each series the newest run is in is cut at its change points into levels. The newest level
is compared with every earlier one, not only with the one just before: a 15 % regression
followed by a 5 % recovery is still 10 % worse, and two 4 % steps are 8 %. A level the
series held once is one it can hold. The worst such gap beyond the threshold fails.

Many series are judged at once (every case, every metric), so the gap must also be told
from noise for the whole family: Student's t-test between the two levels' runs, its p-value
multiplied by the splits its change points were chosen from and by the number of series
judged (Bonferroni), must stay under ``ALPHA``. Without it a nightly gate over hundreds of
series would fail some night on noise alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lorabench.analysis.cases import METRICS
from lorabench.analysis.history.changes import ALPHA, MIN_SIZE, Change, on_scale, student_p
from lorabench.analysis.history.series import Series, settings_changed

# The smallest worsening that fails the gate: vLLM's dashboard flags 1.2x, vllm-ascend's
# nightly 0.97x of a baseline; a change is already told from noise, so the threshold only
# says how much is worth a failed night.
GATE_THRESHOLD = 0.05


@dataclass(frozen=True)
class Regression:
    series: Series
    change: Change  # the first change point after the level compared with
    level: float  # that earlier level (median of its runs)
    newest: float  # the newest level
    worse: float  # the share by which the metric got worse: 0.12 is 12 % worse
    p_value: float  # for the family of series judged
    threshold: float  # the metric's threshold it passed

    def stack_change(self) -> str:
        """What differs between the runs at the two ends of where the change may lie: their
        stacks (``vllm_version 0.32.0 -> 0.33.0``), then the settings they ran with that the
        case key leaves out (``settings: matrix.rounds: 10 -> 3``), which move a level as a new
        version does."""
        runs = self.series.runs
        before, after = runs[max(self.change.first - 1, 0)], runs[self.change.last]
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


def _worst(s: Series, threshold: float, family: int) -> Regression | None:
    levels = _levels(s, s.medians)
    newest = levels[-1]
    scaled_levels = _levels(s, on_scale(s.medians))  # one scale for the whole series
    splits = max(len(s.runs) - 2 * MIN_SIZE + 1, 1)
    found = None
    for i, level in enumerate(levels[:-1]):
        worse = worse_by(s.metric, float(np.median(level)), float(np.median(newest)))
        p = min(1.0, student_p(scaled_levels[i], scaled_levels[-1]) * splits * family)
        if worse > threshold and p <= ALPHA and (found is None or worse > found.worse):
            found = Regression(s, s.changes[i], float(np.median(level)), float(np.median(newest)), worse, p, threshold)
    return found


def regressions(found: Sequence[Series], threshold: float, per_metric: dict[str, float]) -> list[Regression]:
    """The series (each with the newest run in it) whose newest level is worse than an
    earlier one beyond the metric's threshold, told from noise for the whole family."""
    out = []
    for s in found:
        worst = _worst(s, per_metric.get(s.metric, threshold), len(found)) if s.changes else None
        if worst is not None:
            out.append(worst)
    return out


@dataclass(frozen=True)
class Unconfirmed:
    series: Series
    level: float  # the median of the level the newest run ends
    newest: float
    worse: float


def unconfirmed(
    found: Sequence[Series], threshold: float, per_metric: dict[str, float], flagged: Sequence[Regression]
) -> list[Unconfirmed]:
    """Series whose newest run is worse than the level it ends beyond the threshold, and
    beyond every run of that level, with no regression found: a change point needs
    ``MIN_SIZE`` runs after it, so one or two such nights cannot fail the gate, and are said
    instead (the level: the runs since the last change point, but the newest two)."""
    out = []
    named = {id(r.series) for r in flagged}
    for s in (s for s in found if id(s) not in named):
        level = s.medians[(s.changes[-1].position if s.changes else 0) : -2]
        if len(level) < MIN_SIZE:
            continue
        newest, typical = float(s.medians[-1]), float(np.median(level))
        worse = worse_by(s.metric, typical, newest)
        beyond = newest < level.min() if METRICS[s.metric] else newest > level.max()
        if worse > per_metric.get(s.metric, threshold) and beyond:
            out.append(Unconfirmed(s, typical, newest, worse))
    return out


def output_changes(
    newest: dict[tuple[str, str, str], str], before: dict[tuple[str, str, str], str]
) -> list[tuple[tuple[str, str, str], str, str]]:
    """The adapters whose greedy output differs between the run before and the newest (same
    model and device): the night an output changed fails once, with both digests named."""
    shared = sorted(newest.keys() & before.keys())
    return [(key, before[key], newest[key]) for key in shared if newest[key] != before[key]]
