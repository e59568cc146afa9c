"""The nightly gate: does the newest run lie after a change point that made a metric worse
by more than its threshold? A regression that persists keeps failing the gate until a
later change point brings the metric back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lorabench.analysis.compare.load import METRICS
from lorabench.analysis.history.changes import Change
from lorabench.analysis.history.series import Series

# The smallest worsening that fails the gate: vLLM's dashboard flags 1.2x, vllm-ascend's
# nightly 0.97x of a baseline; a change point is already told from noise, so the threshold
# only says how much is worth a failed night.
GATE_THRESHOLD = 0.05


@dataclass(frozen=True)
class Regression:
    series: Series
    change: Change
    worse: float  # the share by which the metric got worse: 0.12 is 12 % worse

    def stack_change(self) -> str:
        """What differs between the stacks either side of the change: ``vllm_version 0.32.0 -> 0.33.0``."""
        before = self.series.runs[self.change.position - 1].stack
        after = self.series.runs[self.change.position].stack
        changed = [f"{k} {before[k]} -> {after[k]}" for k in before if before[k] != after.get(k)]
        return ", ".join(changed) or "the same stack (the host or the harness drifted)"


def worse_by(metric: str, change: Change) -> float:
    """How much worse ``change`` left ``metric``, in its own direction (negative: better)."""
    if METRICS[metric]:  # higher is better
        return change.before / change.after - 1 if change.after else float("inf")
    return change.after / change.before - 1 if change.before else float("inf")


def regressions(found: Sequence[Series], threshold: float, per_metric: dict[str, float]) -> list[Regression]:
    """The series whose last change point (the one the newest run lies after) is a regression
    beyond the metric's threshold."""
    out = []
    for s in found:
        if s.changes:
            worse = worse_by(s.metric, s.changes[-1])
            if worse > per_metric.get(s.metric, threshold):
                out.append(Regression(s, s.changes[-1], worse))
    return out
