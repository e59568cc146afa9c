"""The report's first section: what a reader opens the page for, before the provenance and
the figures. The cases LoRA slows most, the configuration the capacity search recommends,
and any check the run failed. Each line says plainly when the run has none of it, so that a
missing line is never read as a clean one.

The facts are those the rest of lorabench states: the overhead as the overhead figure draws
it (mean over builds), the recommendation's own lines (``recommend``, as the session's summary
prints them), the summary's ``wrong out`` column and the failures ``compare`` counts.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd

from lorabench.analysis.cases import case_label, case_of
from lorabench.analysis.compare.failures import CACHE_OFF, CACHING_CHANGED, CHURN, ISOLATION, RELOAD, Counted
from lorabench.analysis.recommend import recommendations
from lorabench.analysis.report.intervals import intervals_section
from lorabench.analysis.report.runs import ReportRun

TOP = 3  # the overheads named: enough to see a pattern, few enough to take in at a glance
# The canaries' other verdict that fails an isolation case (``measure.isolation.Verdict.failure``).
UNJUDGED = Counted(
    "isolation_unjudged",
    None,
    "ISOLATION NOT JUDGED",
    "canary answers could not tell a breach from a clean cache",
    " (the run's isolation.csv has the answers)",
)
COUNTED = (ISOLATION, RELOAD, UNJUDGED, CACHING_CHANGED, CACHE_OFF, CHURN)


def largest_overheads(run: ReportRun, top: int = TOP) -> list[tuple[str, float, float, float]]:
    """The ``top`` multi-LoRA cases with the highest ``lora_overhead``, largest first, keyed
    as the overhead figure keys its bars (workload, batch size, configuration): each case's
    label, its mean over builds, and its lowest and highest build."""
    if "lora_overhead" not in run.rows:
        return []
    rows = run.scenario("multilora").dropna(subset=["lora_overhead"])
    found = []
    for (workload, engine, batch), builds in rows.groupby(["workload", "engine", "batch_size"]):
        values = builds["lora_overhead"].astype(float)
        found.append((f"{workload} bs{int(batch)} on {engine}", values.mean(), values.min(), values.max()))
    return sorted(found, key=lambda f: (-f[1], f[0]))[:top]


def _overheads(run: ReportRun) -> tuple[str, list[str]]:
    """The overhead item's title and lines: one per case named, or why none is."""
    found = largest_overheads(run)
    if not found:
        return "<b>Largest LoRA overhead</b>", [
            "none measured: no multi-LoRA batch with a no-LoRA baseline in this run"
        ]
    title = (
        "<b>Largest LoRA overhead</b> (e2e with LoRA over the same batch without, largest first; "
        "<a href='#lora_overhead'>figure</a>)"
    )
    return title, [
        f"<b>{html.escape(label)}</b>: {mean:.2f}×" + (f" (builds {low:.2f}-{high:.2f})" if high > low else "")
        for label, mean, low, high in found
    ]


def _configuration_lines(run: ReportRun) -> list[str]:
    lines = recommendations(run.rows)
    if not lines:
        return ["none recommended: no capacity search in this run (<code>pytest bench -k capacity</code>)"]
    return [html.escape(line) for line in lines]


def wrong_outputs(run: ReportRun) -> list[str]:
    """Each build whose rows count wrong greedy outputs (the summary's ``wrong out``,
    ``digest_mismatches``: its adapters' answers against the run's first build's, and a
    residency probe's own), once per build: its count repeats on every row of the build."""
    if "digest_mismatches" not in run.rows:
        return []
    counted = run.rows.dropna(subset=["digest_mismatches"])
    lines = []
    for engine_id, rows in counted.groupby("engine_id", sort=True):
        wrong = rows[rows["digest_mismatches"].astype(float) > 0]
        if not wrong.empty:
            lines.append(
                f"OUTPUT DIGESTS MISMATCH: {engine_id}: wrong out {int(wrong['digest_mismatches'].max())} "
                f"in {len(wrong)} of {len(rows)} cases: greedy answers that are not the run's first build's"
            )
    return lines


def counted_failures(run: ReportRun) -> list[str]:
    """Each case whose builds count a failure of a kind ``compare`` fails on (broken isolation,
    stale KV after a reload, caching that changed outputs or was not in effect, failed churn
    operations), summed over its builds as ``compare`` sums them."""
    lines = []
    for kind in COUNTED:
        columns = [c for c in (kind.failed, kind.done) if c is not None]
        if any(c not in run.rows for c in columns):
            continue
        sums = run.rows[run.rows[kind.failed].notna()].groupby("_key")[columns].sum()
        for key, row in sums[sums[kind.failed] > 0].iterrows():
            of = f"{int(row[kind.failed])} of {int(row[kind.done])}" if kind.done else f"{int(row[kind.failed])}"
            lines.append(f"{kind.title}: {case_label(case_of(str(key)))}: {of} {kind.what}{kind.then}")
    return lines


def _checked(run: ReportRun) -> str:
    """What was checked and held, for a run that failed none: said, so that a run that
    checked nothing does not read as a clean one."""
    held = []
    if (digests := _filled(run.rows, "digest_mismatches")) is not None and digests["engine_id"].nunique() > 1:
        # The digests are held to the run's first build: one build has nothing to match.
        held.append(f"greedy output digests matched on all {digests['engine_id'].nunique()} LoRA builds")
    if (canaries := _filled(run.rows, "isolation_checked")) is not None:
        held.append(f"adapter isolation held in {canaries['_key'].nunique()} cases")
    if (churn := _filled(run.rows, "churn_ops")) is not None:
        held.append(f"every adapter load and unload succeeded in {churn['_key'].nunique()} churn cases")
    if not held:
        return "no check failed, and none ran: no output digests recorded, no isolation or churn case"
    return "no check failed: " + "; ".join(held)


def _run_items(run: ReportRun) -> str:
    failed = wrong_outputs(run) + counted_failures(run)
    checks = [f"<span class='failed'>{html.escape(line)}</span>" for line in failed] or [_checked(run)]
    items = [
        _overheads(run),
        ("<b>Configuration to choose</b>", _configuration_lines(run)),
        (f"<b>Failed checks: {len(failed)}</b>" if failed else "<b>Checks</b>", checks),
    ]
    return "".join(
        f"<li>{title}: {lines[0]}</li>"
        if len(lines) == 1
        else f"<li>{title}:<ul>{''.join(f'<li>{line}</li>' for line in lines)}</ul></li>"
        for title, lines in items
    )


def headline(runs: Sequence[ReportRun]) -> str:
    """The page's first sections, as HTML: for each run (headed by its label where there are
    several), its largest overheads, the configuration to choose and its failed checks; then
    its headline figures with their intervals (``intervals``), before the provenance, as what a
    reader weighs a figure by."""
    parts = ["<section id='headline'><h2>Headline</h2>"]
    for run in runs:
        if len(runs) > 1:
            parts.append(f"<h3>{html.escape(run.label)}</h3>")
        parts.append(f"<ul>{_run_items(run)}</ul>")
    return "".join(parts) + "</section>" + intervals_section(runs)


def _filled(rows: pd.DataFrame, column: str) -> pd.DataFrame | None:
    """The rows that have ``column`` filled, or None where none has (or the file lacks it)."""
    filled = rows.dropna(subset=[column]) if column in rows else rows.iloc[0:0]
    return None if filled.empty else filled
