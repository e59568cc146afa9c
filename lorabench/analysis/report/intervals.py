"""The report's headline figures with their intervals, as numbers: each batch case's e2e, TTFT
and decode, and each capacity search's SLO edge. The figures draw the builds' spread as error
bars; the intervals are a table, with the figures as ``compare`` prints them: the mean over
builds, then the 95 % interval's two ends, over the builds where there are 2 or more, else the
one build's over its rounds (``compare.intervals`` says why, and why the ends;
docs/metrics.md#intervals defines the construction).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd

from lorabench.analysis.cases import case_label, case_of
from lorabench.analysis.compare.intervals import edge_hull, edge_text, ends_text, side_interval
from lorabench.analysis.recommend import shapes
from lorabench.analysis.report.runs import ReportRun

HEADLINE = (("e2e_ms", "e2e ms"), ("ttft_ms", "TTFT ms (mean)"), ("decode_ms", "decode ms (mean)"))
BATCH = ("no_lora", "multilora")
NONE_RECORDED = (
    "none recorded: no row of this run carries an interval (a file from before lorabench recorded them, "
    "cases of one round, or no batch case or capacity search)"
)


def _table(header: Sequence[str], lines: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in line) + "</tr>" for line in lines)
    return f"<table><tr>{head}</tr>{body}</table>"


def _figure(builds: pd.DataFrame, metric: str) -> str:
    """The mean over builds, then its interval's ends (none where it has none)."""
    values = pd.to_numeric(builds[metric], errors="coerce").dropna() if metric in builds else pd.Series(dtype=float)
    return "" if values.empty else f"{values.mean():.2f} {ends_text(side_interval(builds, metric))}".rstrip()


def batch_lines(run: ReportRun) -> list[list[str]]:
    """A line per batch case (workload, case, each headline figure): empty where no case's rows
    carry an interval, since the figures alone are the latency figure's."""
    rows = run.rows[run.rows["scenario"].isin(BATCH)]
    lines = []
    for key, builds in rows.groupby("_key", sort=False):
        case = case_of(str(key))
        lines.append([case["workload"], case_label(case), *(_figure(builds, m) for m, _ in HEADLINE)])
    if not any("[" in cell for line in lines for cell in line[2:]):
        return []
    return sorted(lines, key=lambda line: line[0])  # by workload, each in the run's order


def capacity_lines(run: ReportRun) -> list[list[str]]:
    """A line per trace shape and configuration whose searches bound their SLO edge: each
    build's capacity, and the hull of the builds' edge intervals."""
    lines = []
    for label, shape in shapes(run.scenario("capacity")):
        for engine, builds in shape.groupby("engine", sort=True):
            edge = edge_text(edge_hull(builds))
            if edge:
                found = pd.to_numeric(builds["capacity_rps"], errors="coerce")
                passed = ", ".join("none" if pd.isna(c) else f"{c:.3g}" for c in found)
                lines.append([label, str(engine), passed, edge])
    return lines


def _run_tables(run: ReportRun) -> str:
    batch, capacity = batch_lines(run), capacity_lines(run)
    if not batch and not capacity:
        return f"<p>{NONE_RECORDED}</p>"
    tables = [_table(("workload", "case", *(title for _, title in HEADLINE)), batch)] if batch else []
    if capacity:
        header = ("trace shape and SLOs", "configuration", "capacity rps, per build", "SLO edge, 95 %")
        tables.append(_table(header, capacity))
    return "".join(tables)


def intervals_section(runs: Sequence[ReportRun]) -> str:
    """The section, as HTML: for each run (headed by its label where there are several), its
    batch cases' headline figures with their intervals and its capacity searches' edge intervals."""
    parts = [
        "<section id='intervals'><h2>Headline figures and their intervals</h2><p>Mean over builds, then the ends of "
        "its 95 % interval: over the builds where there are 2 or more, else over the one build's rounds; capacity: "
        "the hull of the builds' SLO edge intervals (definitions: docs/metrics.md, docs/capacity.md). Blank: none "
        "recorded.</p>"
    ]
    for run in runs:
        if len(runs) > 1:
            parts.append(f"<h3>{html.escape(run.label)}</h3>")
        parts.append(_run_tables(run))
    return "".join(parts) + "</section>"
