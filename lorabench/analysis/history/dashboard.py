"""The history as one static page: a trend per case and metric, each build a point, each
run's median a line, change points marked with the runs they may lie between, and the
stack changes along the series named. One HTML file with its figures inline (SVG) and a
few lines of script for the filter, so it opens from the file system with no network.

Hand-drawn SVG rather than matplotlib's: a nightly history has hundreds of series, and a
matplotlib figure each took a good part of a second.
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lorabench.analysis.history.series import Series, settings_changed
from lorabench.analysis.history.store import StoredRun

WIDTH, HEIGHT, PAD = 640, 180, 36

_SCRIPT = """
function filter() {
  const scenario = document.getElementById('scenario').value;
  const config = document.getElementById('config').value;
  for (const figure of document.querySelectorAll('figure')) {
    const shown = (!scenario || figure.dataset.scenario === scenario) && (!config || figure.dataset.config === config);
    figure.style.display = shown ? '' : 'none';
  }
}
"""


def _stack_changes(s: Series) -> list[tuple[int, str]]:
    """Where the stack or the settings change along the series, and what changed
    (``vllm_version 0.32.0 → 0.33.0``, ``matrix.rounds: 10 → 3``)."""
    out = []
    for i in range(1, len(s.runs)):
        before, after = s.runs[i - 1].stack, s.runs[i].stack
        changed = [f"{k} {before[k]} → {after[k]}" for k in before if before[k] != after.get(k)]
        changed += [c.replace(" -> ", " → ") for c in settings_changed(s.runs[i - 1], s.runs[i], s.scenario) or []]
        if changed:
            out.append((i, ", ".join(changed)))
    return out


def _svg(s: Series) -> str:
    values = np.concatenate(s.builds)
    low, high = float(values.min()), float(values.max())
    span = (high - low) or abs(high) or 1.0
    low, high = low - 0.1 * span, high + 0.1 * span
    n = len(s.runs)

    def x(i: float) -> float:
        return PAD + (WIDTH - 2 * PAD) * (i / max(n - 1, 1))

    def y(v: float) -> float:
        return HEIGHT - PAD + (v - low) / (high - low) * (2 * PAD - HEIGHT)

    parts = []
    for c in s.changes:  # the splits a change may lie at (before run first .. before run last), then the one found
        parts.append(
            f'<rect x="{x(c.first - 0.5):.1f}" y="{PAD / 2}" width="{max(x(c.last - 0.5) - x(c.first - 0.5), 2):.1f}" '
            f'height="{HEIGHT - 1.5 * PAD}" fill="#fde2c4">'
            f"<title>change somewhere in runs {c.first}-{c.last}</title></rect>"
        )
        parts.append(
            f'<line x1="{x(c.position - 0.5):.1f}" x2="{x(c.position - 0.5):.1f}" y1="{PAD / 2}" '
            f'y2="{HEIGHT - PAD}" stroke="#d95f02" stroke-width="2"><title>change at run {c.position}: '
            f"{c.before:.3f} → {c.after:.3f} (p {c.p_value:.3f})</title></line>"
        )
    for i, text in _stack_changes(s):
        parts.append(
            f'<text x="{x(i - 0.5):.1f}" y="{PAD / 2 - 4}" font-size="9" text-anchor="middle">'
            f"{html.escape(text)}</text>"
        )
    medians = " ".join(f"{x(i):.1f},{y(m):.1f}" for i, m in enumerate(s.medians))
    parts.append(f'<polyline points="{medians}" fill="none" stroke="#1b9e77" stroke-width="1.5"/>')
    for i, (run, builds) in enumerate(zip(s.runs, s.builds)):
        for v in builds:
            parts.append(
                f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.5" fill="#7570b3">'
                f"<title>{html.escape(run.run_id)} ({run.timestamp}): {v:.3f}</title></circle>"
            )
    for i in range(1, n):  # a release of vLLM: a dashed line, its version under the axis
        version = s.runs[i].stack.get("vllm_version")
        if version and version != s.runs[i - 1].stack.get("vllm_version"):
            parts.append(
                f'<line x1="{x(i - 0.5):.1f}" x2="{x(i - 0.5):.1f}" y1="{PAD / 2}" y2="{HEIGHT - PAD}" '
                f'stroke="#999" stroke-dasharray="3,3"/><text x="{x(i - 0.5):.1f}" y="{HEIGHT - 20}" '
                f'font-size="9" text-anchor="middle">vLLM {html.escape(version)}</text>'
            )
    axis = (
        f'<text x="4" y="{y(high - 0.1 * span) + 4:.1f}" font-size="10">{high - 0.1 * span:.3g}</text>'
        f'<text x="4" y="{y(low + 0.1 * span) + 4:.1f}" font-size="10">{low + 0.1 * span:.3g}</text>'
        f'<text x="{x(0):.1f}" y="{HEIGHT - 6}" font-size="10">{html.escape(_day(s.runs[0]))}</text>'
        f'<text x="{x(n - 1):.1f}" y="{HEIGHT - 6}" font-size="10" text-anchor="end">'
        f"{html.escape(_day(s.runs[-1]))}</text>"
    )
    return f'<svg width="{WIDTH}" height="{HEIGHT}" role="img">{"".join(parts)}{axis}</svg>'


def _day(run: StoredRun) -> str:
    """A run's date and vLLM release, what a reader of a nightly's axis looks for."""
    version = run.stack.get("vllm_version")
    return f"{run.timestamp[:10]}" + (f" (vLLM {version})" if version else "")


def _options(element: str, label: str, values: Sequence[str]) -> str:
    choices = "".join(f'<option value="{html.escape(v)}">{html.escape(v)}</option>' for v in values)
    select = f'<select id="{element}" onchange="filter()"><option value="">all</option>{choices}</select>'
    return f"<label>{label} {select}</label>"


@dataclass(frozen=True)
class Finding:
    """A line of the page's summary: what was found, how bad (for the order), and its series."""

    kind: str  # REGRESSION, WATCH, OUTPUT CHANGED, NOT COMPARABLE, MISSING, ACCEPTED
    text: str
    severity: float = 0.0  # the larger, the higher in the summary
    series: Series | None = None


# The summary's order: what fails the gate first, then what is watched, then what is said.
_RANK = {
    "STALE STORE": 7,
    "REGRESSION": 6,
    "OUTPUT CHANGED": 5,
    "MISSING": 4,
    "NOT MEASURED": 4,
    "WATCH": 3,
    "NOT COMPARABLE": 2,
    "STALE": 1,
    "NEW MACHINE": 1,
}


def _anchor(s: Series) -> str:
    return "s" + hashlib.sha256(f"{s.case}|{s.metric}".encode()).hexdigest()[:10]


def _summary(findings: Sequence[Finding]) -> str:
    """What changed, worst first, each linking to its chart; a page with nothing says so."""
    said = [f for f in findings if f.kind]  # the plain lines (the newest run's age) are the terminal's
    if not any(f.kind in _RANK for f in said):
        nothing = "<p>Nothing changed: no regression, no step watched, no output changed, no case missing.</p>"
        said_list = "".join(f"<li><b>{html.escape(f.kind)}</b> {html.escape(f.text)}</li>" for f in said)
        return f"<h2>Summary</h2>{nothing}" + (f"<ul>{said_list}</ul>" if said_list else "")
    items = []
    for f in sorted(said, key=lambda f: (-_RANK.get(f.kind, 0), -f.severity)):
        link = f' <a href="#{_anchor(f.series)}">chart</a>' if f.series is not None else ""
        items.append(f"<li><b>{html.escape(f.kind)}</b> {html.escape(f.text)}{link}</li>")
    return f"<h2>Summary</h2><ul>{''.join(items)}</ul>"


def _figure(s: Series) -> tuple[str, str, str]:
    scenario, config = s.case.split(" ")[:2]
    caption = f"{s.case}: {s.metric} over {len(s.runs)} runs, {len(s.changes)} change point(s)"
    figure = (
        f'<figure id="{_anchor(s)}" data-scenario="{html.escape(scenario)}" data-config="{html.escape(config)}">'
        f"{_svg(s)}<figcaption>{html.escape(caption)}</figcaption></figure>"
    )
    return scenario, config, figure


def write_dashboard(found: Sequence[Series], out: Path, title: str, findings: Sequence[Finding] = ()) -> Path:
    """The page, ``out/index.html``: the summary of ``findings`` first, then the charts of the
    series they name or that changed, then the unchanged ones folded away; its figures are in it."""
    named = {_anchor(f.series) for f in findings if f.series is not None}  # the gate judged its own copies
    shown, folded, scenarios, configs = [], [], set(), set()
    for s in found:
        scenario, config, figure = _figure(s)
        scenarios.add(scenario)
        configs.add(config)
        (shown if s.changes or _anchor(s) in named else folded).append(figure)
    rest = (
        f"<details><summary>{len(folded)} series with no change point</summary>{''.join(folded)}</details>"
        if folded
        else ""
    )
    out.mkdir(parents=True, exist_ok=True)
    page = out / "index.html"
    page.write_text(
        f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<script>{_SCRIPT}</script></head><body><h1>{html.escape(title)}</h1>{_summary(findings)}"
        f"<h2>Charts</h2><p>{_options('scenario', 'scenario', sorted(scenarios))} "
        f"{_options('config', 'configuration', sorted(configs))}</p>"
        "<p>Points: each build; line: each run's median; orange: a change point and the runs it may lie between; "
        "dashed: a new vLLM release; text above: what changed in the stack.</p>"
        f"{''.join(shown)}{rest}</body></html>",
        encoding="utf-8",
    )
    return page
