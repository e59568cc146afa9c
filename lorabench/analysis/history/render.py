"""The history's results as text: ``history show``'s series and ``history check``'s lines."""

from __future__ import annotations

from lorabench.analysis.history.changes import ALPHA, Change
from lorabench.analysis.history.gate import Regression
from lorabench.analysis.history.series import Series


def regression_line(r: Regression, family: int) -> str:
    """The gate's line for a regression, what changed around it at its end."""
    s, c = r.series, r.change
    return (
        f"REGRESSION {s.case} {s.metric}: {r.level:.3f} -> {r.newest:.3f} ({100 * r.worse:.1f} % worse, "
        f"threshold {100 * r.threshold:g} %, p {r.p_value:.2g} over {family} series) since run "
        f"{s.runs[c.position].run_id}{change_range(s, c)}: "
        f"{r.stack_change()}"
    )


def change_range(s: Series, c: Change) -> str:
    """Where else the change may lie: the noise leaves its exact run uncertain."""
    if c.first == c.last:
        return ""
    return f" (somewhere from run {s.runs[c.first].run_id} to {s.runs[c.last].run_id})"


def render_series(s: Series) -> str:
    """``history show``'s text for one series: each run's point, then each change point."""
    lines = [f"{s.case}  {s.metric}  ({len(s.runs)} runs; change points at p <= {ALPHA})"]
    lines += [
        f"  {i:3d}  {r.timestamp}  stack {r.stack_id}  {m:10.3f}  ({len(b)} builds)"
        for i, (r, m, b) in enumerate(zip(s.runs, s.medians, s.builds))
    ]
    for c in s.changes:
        before, after = s.runs[c.position - 1], s.runs[c.position]
        change = f"{100 * (c.ratio - 1):+.1f} %" if c.before else "from 0"
        lines.append(
            f"  change at run {c.position}{change_range(s, c)}: {c.before:.3f} -> {c.after:.3f} "
            f"({change}, p {c.p_value:.3f}), stack {before.stack_id} -> {after.stack_id}"
        )
    return "\n".join(lines)
