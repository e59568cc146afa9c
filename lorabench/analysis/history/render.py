"""The history's results as text: ``history show``'s series and ``history check``'s lines."""

from __future__ import annotations

from lorabench.analysis.history.changes import ALPHA, Change
from lorabench.analysis.history.gate import CONFIRM_NIGHTS, Regression
from lorabench.analysis.history.series import Series


def regression_line(r: Regression, family: int) -> str:
    """The gate's line for a regression: how much, how sure, and each change on the way with
    its own share and what changed around it (two steps that add up are both named)."""
    s, c = r.series, r.change
    head = (
        f"REGRESSION {s.case} {s.metric}: {r.level:.3f} -> {r.newest:.3f} ({100 * r.worse:.1f} % worse, "
        f"threshold {100 * r.threshold:g} %, p {r.p_value:.2g} over {family} series)"
    )
    if r.nights:
        since = f"since run {s.runs[c.position].run_id}{change_range(s, c)}"
        return f"{head} in the newest {r.nights} runs, {since}: {r.stack_change()}"
    if len(r.steps) <= 1:
        return f"{head} since run {s.runs[c.position].run_id}{change_range(s, c)}: {r.stack_change()}"
    steps = "; ".join(
        f"{100 * step.worse:+.1f} % since run {s.runs[step.change.position].run_id}{change_range(s, step.change)} "
        f"({r.stack_change(step.change)})"
        for step in r.steps
    )
    return f"{head} in {len(r.steps)} steps: {steps}"


def watch_line(w: Regression, family: int) -> str:
    """A suspected step the family's test has not confirmed: said each night until it is, or
    until the newest runs come back to their level; with why it does not fail yet."""
    s = w.series
    since = s.runs[w.change.position].run_id
    nights = f"the newest {w.nights} run(s), since run {since}," if w.nights else f"the level since run {since}"
    why = (
        f"{w.nights} night(s): {CONFIRM_NIGHTS} fail the gate"
        if w.nights and w.nights < CONFIRM_NIGHTS
        else f"not yet told from noise for the {family} series judged"
    )
    return (
        f"WATCH {s.case} {s.metric}: {nights} {100 * w.worse:.1f} % worse than the level before "
        f"({w.level:.3f} -> {w.newest:.3f}, p {w.own_p:.2g} for this series; {w.stack_change()}): {why}"
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
