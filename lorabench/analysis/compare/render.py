"""Rendering a comparison: text and markdown tables, CSV and JSON (the ratio plot: ``ratio_plot``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from lorabench.analysis.cases import case_label
from lorabench.analysis.compare.analysis import (
    IMPROVED,
    NOT_SIGNIFICANT,
    REGRESSED,
    TOO_FEW,
    WITHIN,
    Comparison,
    Finding,
)
from lorabench.analysis.compare.capacity import CapacityBound
from lorabench.analysis.compare.intervals import SideIntervals
from lorabench.analysis.compare.load import rank_medians
from lorabench.analysis.compare.noise import UNTESTABLE_PCT
from lorabench.analysis.compare.paired import PAIRS
from lorabench.analysis.compare.ratio_plot import plot  # noqa: F401  (the package's name for it, and show.py's)


def _ordered(comparison: Comparison) -> list[tuple[str, list[Finding]]]:
    """Findings grouped by workload; worst regression first, within and across groups."""
    groups: dict[str, list[Finding]] = {}
    for f in comparison.findings:
        groups.setdefault(f.case["workload"], []).append(f)
    rank = {REGRESSED: 0, NOT_SIGNIFICANT: 1, TOO_FEW: 1, WITHIN: 2, IMPROVED: 3}
    for findings in groups.values():
        findings.sort(key=lambda f: (rank[f.verdict], -f.worse_pct))
    return sorted(groups.items(), key=lambda item: (rank[item[1][0].verdict], -item[1][0].worse_pct))


MARKS = {
    REGRESSED: "REGRESSED",
    IMPROVED: "improved",
    WITHIN: "",
    NOT_SIGNIFICANT: "? not significant",
    TOO_FEW: "? too few builds",
}


def cells(f: Finding, shown: tuple[str, str] = ("", "")) -> list[str]:
    """A finding's line; ``shown``: each side's own 95 % interval, its two ends, beside its
    figure (``intervals``: over its builds, or one build's over its rounds)."""
    p = "" if f.p_adjusted is None else f"{f.p_adjusted:.3g}"
    return [
        case_label(f.case),
        f.metric,
        f"{f.base:.2f}",
        shown[0],
        f"{f.new:.2f}",
        shown[1],
        f"{f.ratio:.3f}",
        f"{f.change_pct:+.1f}%",
        p,
        MARKS[f.verdict],
    ]


HEADER = ["case", "metric", "base", "95% CI", "new", "95% CI", "ratio", "change", "p (BH)", "verdict"]
INTERVALS = (3, 5)
LEFT = (0, 1, *INTERVALS, 9)  # text, and each interval against its figure


def shown_columns(rows: list[list[str]]) -> list[int]:
    """The columns a table shows: all but the intervals where no line has one (older files)."""
    blank = not any(r[i] for r in rows for i in INTERVALS)
    return [i for i in range(len(HEADER)) if not (blank and i in INTERVALS)]


def _lines(c: Comparison, findings: list[Finding]) -> tuple[list[int], list[list[str]]]:
    """The columns shown and a table's lines, header first; each side's interval beside its figure."""
    ci = SideIntervals(c.base, c.new)
    rows = [cells(f, ci.texts(f.case, f.metric)) for f in findings]
    shown = shown_columns(rows)
    return shown, [[r[i] for i in shown] for r in [HEADER, *rows]]


def _table(shown: list[int], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(shown))]
    fmt = lambda r: "  ".join(c.ljust(w) if shown[i] in LEFT else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [fmt(rows[0]), "  ".join("-" * w for w in widths), *(fmt(r).rstrip() for r in rows[1:])]


def preamble(c: Comparison) -> list[str]:
    lines = [
        f"base: {c.base.label}  commit {c.base.commit}",
        f"new:  {c.new.label}  commit {c.new.commit}",
    ]
    lines += c.notes
    if c.detectable_pct:
        for level in dict.fromkeys(nz.level for nz in c.noise.values()):
            noise = ", ".join(f"{m} {nz.pct:.1f}% (df {nz.df})" for m, nz in c.noise.items() if nz.level == level)
            lines.append(f"noise between {level}: {noise}")
        smallest = ", ".join(f"{m} {_pct(lone)} / {_pct(every)}" for m, (lone, every) in c.detectable_pct.items())
        lines.append(f"smallest change flagged at this noise, in one case alone / in every case: {smallest}")
        lines += _untestable(c)
    lines += [f"WARNING: {w}" for w in c.warnings]
    return lines


def _pct(figure: float | None) -> str:
    return "not testable" if figure is None else f"{figure:.0f}%"


def _untestable(c: Comparison) -> list[str]:
    """Why a figure reads "not testable", and what gives the test something to work with."""
    lone = [m for m, (figure, _) in c.detectable_pct.items() if figure is None]
    every = [m for m, (_, figure) in c.detectable_pct.items() if figure is None]
    if not lone:  # every case's figure is the smaller one: it is never missing alone
        return []
    parts = [f"{kind} in {', '.join(ms)}" for kind, ms in (("one case alone", lone), ("every case", every)) if ms]
    df = min(c.noise[m].df for m in lone)
    draws = "pairs (lorabench ab --pairs, with --resume)" if c.noise[lone[0]].level == PAIRS else "builds or runs"
    return [
        f"not testable: a change of {' or of '.join(parts)} would have to pass +{UNTESTABLE_PCT:.0f}% to be "
        f"flagged at this noise on {df} degree{'s' if df > 1 else ''} of freedom; run more {draws}"
    ]


def _summary_line(c: Comparison) -> str:
    counts = {v: sum(f.verdict == v for f in c.findings) for v in (REGRESSED, IMPROVED, NOT_SIGNIFICANT, TOO_FEW)}
    bounds = [sum(b.change == change for b in c.capacity_bounds) for change in (-1, 1, 0)]
    cases = len({tuple(f.case.values()) for f in c.findings})
    return (
        f"{cases} cases compared; of their {len(c.findings)} metrics {counts[REGRESSED]} regressed, "
        f"{counts[IMPROVED]} improved, {counts[NOT_SIGNIFICANT]} past the threshold but not significant, "
        f"{counts[TOO_FEW]} past the threshold with too few builds to test"
        + (
            f"; capacity bounds: {bounds[0]} regressed, {bounds[1]} improved, {bounds[2]} not shown"
            if any(bounds)
            else ""
        )
    )


def bound_line(b: CapacityBound, edges: tuple[str, str] = ("", "")) -> str:
    """A capacity judged on its bounds, with both sides' intervals and the verdict's reason;
    ``edges``: each side's SLO edge interval, where its rows have one (``intervals``)."""
    head = {-1: "CAPACITY REGRESSED", 1: "capacity improved", 0: "capacity not shown"}[b.change]
    base, new = (f"{side}{f' (SLO edge {edge})' if edge else ''}" for side, edge in zip((b.base, b.new), edges))
    return f"{head}: {b.case['workload']} {case_label(b.case)}: base {base}, new {new}: {b.why}"


def bound_lines(c: Comparison) -> list[str]:
    ci = SideIntervals(c.base, c.new)
    return [bound_line(b, ci.texts(b.case, "capacity_rps")) for b in c.capacity_bounds]


def failure_lines(c: Comparison) -> list[str]:
    """What fails the comparison whatever the timings say: changed outputs, collapsed
    capacities, capacity searches with no verdict, failed churn operations, broken isolation."""
    changed = [
        f"OUTPUT CHANGED: adapter {adapter} ({model}) answers the greedy probe differently: {b} -> {n}"
        for model, adapter, b, n in c.digest_changes
    ]
    lines = [*c.capacity_collapses, *c.capacity_unjudged, *c.churn_failures, *c.isolation_failures]
    return [*changed, *lines, *c.hit_rate_falls, *c.unfinished_rises, *c.unmeasured]


def _unmatched(c: Comparison) -> list[str]:
    lines = []
    for side, cases in (("base", c.only_base), ("new", c.only_new)):
        for case in cases:
            lines.append(f"only in {side}: {case['workload']} {case_label(case)}")
    return lines


def render_text(c: Comparison) -> str:
    lines = preamble(c)
    for workload, findings in _ordered(c):
        lines += ["", f"workload: {workload}", *_table(*_lines(c, findings))]
    lines += ["", *_unmatched(c), *bound_lines(c), *failure_lines(c), _summary_line(c)]
    return "\n".join(lines)


def render_markdown(c: Comparison) -> str:
    lines = [f"- {line}" for line in preamble(c)]
    for workload, findings in _ordered(c):
        header, *rows = _lines(c, findings)[1]
        lines += ["", f"### {workload}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", *(f"- {u}" for u in (*_unmatched(c), *bound_lines(c), *failure_lines(c))), "", _summary_line(c)]
    return "\n".join(lines)


def _records(c: Comparison) -> list[dict[str, Any]]:
    return [{**f.case, **{k: v for k, v in asdict(f).items() if k != "case"}} for f in c.findings]


def render_csv(c: Comparison) -> str:
    return pd.DataFrame(_records(c)).to_csv(index=False)


def _bound_record(b: CapacityBound) -> dict[str, Any]:
    """A capacity bound for JSON: each side's ends (null where unbounded), as said and judged."""
    ends = {f"{side}_{end}": getattr(getattr(b, side), end) for side in ("base", "new") for end in ("low", "high")}
    return {
        **b.case,
        **{k: v if np.isfinite(v) else None for k, v in ends.items()},
        "base": str(b.base),
        "new": str(b.new),
        "verdict": {-1: REGRESSED, 1: IMPROVED, 0: "not shown"}[b.change],
        "why": b.why,
    }


def render_json(c: Comparison) -> str:
    return json.dumps(
        {
            "base": {"paths": [str(p) for p in c.base.paths], "commit": c.base.commit},
            "new": {"paths": [str(p) for p in c.new.paths], "commit": c.new.commit},
            "warnings": c.warnings,
            "notes": c.notes,
            "noise": {
                m: {"sd_pct": nz.pct, "df": nz.df, "draws": nz.draws, "level": nz.level} for m, nz in c.noise.items()
            },
            "detectable_pct": c.detectable_pct,
            "findings": _records(c),
            "only_base": c.only_base,
            "only_new": c.only_new,
            "regressions": len(c.regressions),
            "digest_changes": [dict(zip(("model", "adapter", "base", "new"), d)) for d in c.digest_changes],
            "capacity_collapses": c.capacity_collapses,
            "capacity_unjudged": c.capacity_unjudged,
            "capacity_bounds": [_bound_record(b) for b in c.capacity_bounds],
            "churn_failures": c.churn_failures,
            "isolation_failures": c.isolation_failures,
            "hit_rate_falls": c.hit_rate_falls,
            "unfinished_rises": c.unfinished_rises,
            "unmeasured": c.unmeasured,
        },
        indent=2,
    )


def render_by_rank(c: Comparison) -> str:
    """Median TTFT and decode per scenario, engine configuration and adapter rank, base and new."""
    base, new = rank_medians(c.base), rank_medians(c.new)
    if base.empty or new.empty:
        return "by adapter rank: the samples files beside the result files carry no adapter_rank"
    both = base.join(new, lsuffix="_base", rsuffix="_new", how="inner")
    lines = ["by adapter rank (median over LoRA requests):"]
    for (scenario, engine, rank), row in both.iterrows():
        lines.append(
            f"  {scenario} {engine} rank {rank}: ttft {row.ttft_ms_base:.1f} -> {row.ttft_ms_new:.1f} ms "
            f"({row.ttft_ms_new / row.ttft_ms_base:.3f}), decode {row.decode_ms_base:.2f} -> "
            f"{row.decode_ms_new:.2f} ms ({row.decode_ms_new / row.decode_ms_base:.3f})"
        )
    return "\n".join(lines)


RENDERERS = {"text": render_text, "markdown": render_markdown, "csv": render_csv, "json": render_json}
