"""``lorabench compare --report DIR``: the comparison as a page of the report's kind: the
new/base ratio of every case-metric with its verdict, the noise band, and the table."""

from __future__ import annotations

import html
from pathlib import Path

from lorabench.analysis.compare import Comparison, plot
from lorabench.analysis.compare.intervals import SideIntervals
from lorabench.analysis.compare.render import HEADER, MARKS, bound_lines, cells, failure_lines, preamble, shown_columns


def write_comparison_report(c: Comparison, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    plot(c, out / "ratios.png")
    findings = sorted(c.findings, key=lambda f: -f.worse_pct)
    ci = SideIntervals(c.base, c.new)
    lines = [cells(f, ci.texts(f.case, f.metric)) for f in findings]
    shown = shown_columns(lines)  # each side's interval beside its figure, where its rows have one
    head = "".join(f"<th>{html.escape(HEADER[i])}</th>" for i in shown)
    rows = "".join(
        f"<tr class='{f.verdict.replace(' ', '-')}'>"
        + "".join(f"<td>{html.escape(line[i])}</td>" for i in shown)
        + "</tr>"
        for f, line in zip(findings, lines)
    )
    notes = "".join(f"<li>{html.escape(line)}</li>" for line in preamble(c))
    # Capacity bounds, changed outputs, collapses, failed churn operations: as the text says them.
    changed = "".join(f"<li>{html.escape(line)}</li>" for line in (*bound_lines(c), *failure_lines(c)))
    page = out / "index.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>lorabench comparison</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:1400px} img{max-width:100%} table{border-collapse:collapse}"
        " td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px} .regressed{background:#fdd}"
        " .improved{background:#dfd}</style></head><body><h1>lorabench comparison</h1>"
        f"<ul>{notes}{changed}</ul><p>Verdicts: {', '.join(v or 'within threshold' for v in MARKS.values())}. The noise"
        " band is the spread between engine builds stated above; a bar is coloured only when the change passes the"
        " threshold.</p><figure><img src='ratios.png' alt='new/base ratio per case and metric'></figure>"
        f"<table><tr>{head}</tr>{rows}</table></body></html>\n",
        encoding="utf-8",
    )
    return page
