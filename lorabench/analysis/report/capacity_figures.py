"""Figures of capacity searches: SLO attainment against the probed rate (where the knee is)
and each configuration's capacity, a panel per trace shape and SLOs. Conventions as in
``figures``: a colour per engine configuration, a line style per run, error bars over
builds; beside each capacity bar, its SLO edge's interval."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from lorabench.analysis.compare.intervals import edge_hull
from lorabench.analysis.recommend import shapes
from lorabench.analysis.report.figures import STYLES, colors_for, pyplot, spread
from lorabench.analysis.report.runs import ReportRun
from lorabench.results.search_stops import BELOW_RANGE, BRACKETED, NO_VERDICT


def _panels(frames: Sequence[pd.DataFrame]) -> list[str]:
    return list(dict.fromkeys(label for f in frames for label, _ in shapes(f)))


def knee(runs: Sequence[ReportRun]) -> Any | None:
    """Every probe of every search: attainment with its 95 % interval against the rate; a
    hollow marker is a probe that failed (below the target, or left requests unfinished)."""
    frames = [r.probes for r in runs]
    panels = _panels(frames)
    if not panels:
        return None
    colors, plt = colors_for(runs, [f for f in frames if not f.empty]), pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 4 * len(panels)), squeeze=False)
    for r, (run, frame) in enumerate(zip(runs, frames)):
        for label, shape in shapes(frame):
            ax = axes[panels.index(label)][0]
            for (engine, _), probes in shape.groupby(["engine", "build"]):
                _probes(
                    ax, probes.sort_values("rate"), colors[engine], STYLES[r % len(STYLES)], f"{run.label} {engine}"
                )
            ax.axhline(float(shape["slo_target"].iloc[0]), color="gray", linestyle=":", linewidth=1)
    for ax, label in zip(axes[:, 0], panels):
        ax.set(xscale="log", xlabel="probed rate (requests/s)", ylabel="SLO attainment", ylim=(-0.02, 1.02))
        ax.set_title(f"{label} (dotted: target; hollow: failed; x: too few requests to decide)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _probes(ax: Any, probes: pd.DataFrame, color: Any, style: tuple[str, str], label: str) -> None:
    line, marker = style
    ax.plot(probes["rate"], probes["attainment"], linestyle=line, color=color, label=label)
    passed = probes["passed"].astype(str).str.lower() == "true"
    # A probe of too few requests decided nothing (older files have no such column: all decided).
    decided = probes["decided"].astype(str).str.lower() != "false" if "decided" in probes else passed | True
    kinds = ((passed & decided, marker, color), (~passed & decided, marker, "none"), (~decided, "x", color))
    for mask, fmt, face in kinds:
        shown = probes[mask]
        error = np.clip([shown["attainment"] - shown["ci_low"], shown["ci_high"] - shown["attainment"]], 0, None)
        ax.errorbar(shown["rate"], shown["attainment"], yerr=error, fmt=fmt, color=color, mfc=face, capsize=2)


def capacity_by_configuration(runs: Sequence[ReportRun]) -> Any | None:
    """Each configuration's capacity per trace shape: the mean over builds, bars to the
    lowest and highest build (a search below its range counts 0); a tick at the lowest
    failing rate."""
    frames = [r.scenario("capacity") for r in runs]
    panels = _panels(frames)
    if not panels:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.6 * len(panels)), squeeze=False)
    for r, (run, frame) in enumerate(zip(runs, frames)):
        for label, shape in shapes(frame):
            ax = axes[panels.index(label)][0]
            engines = sorted(shape["engine"].unique())
            x = np.arange(len(engines)) + r * 0.8 / len(runs)
            cases = [_judged(shape[shape["engine"] == e]) for e in engines]
            y, lo, hi = (np.array(v, dtype=float) for v in zip(*(spread(c, "capacity_rps") for c in cases)))
            bars = ax.bar(x, y, 0.8 / len(runs), yerr=np.vstack([lo, hi]), capsize=3, label=run.label)
            overs = [np.nan if c["_unranked"].iloc[0] else c["capacity_over_rps"].min() for c in cases]
            ax.scatter(x, overs, marker="_", s=200, color="black")
            _edges(ax, x + 0.2 / len(runs), cases)
            for bar, at, case in zip(bars, x, cases):
                if case["_unranked"].iloc[0]:
                    ax.text(at, 0, case["_unranked"].iloc[0], rotation=90, ha="center", va="bottom", fontsize=8)
                elif case["_bound"].any():
                    bar.set_hatch("//")
            ax.set_xticks(np.arange(len(engines)))
            ax.set_xticklabels(engines, fontsize=8)
    for ax, label in zip(axes[:, 0], panels):
        ax.set_ylabel("requests/s within the SLOs")
        ax.set_title(
            f"{label}\n(tick: lowest failing rate; hatched: a lower bound, the search not bracketed; "
            "grey: the SLO edge's 95 % interval)",
            fontsize=9,
        )
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _edges(ax: Any, at: np.ndarray, cases: Sequence[pd.DataFrame]) -> None:
    """Each configuration's SLO edge interval (``intervals.edge_hull``: the hull of its
    builds), a grey band beside its bar: the bar's error bars already span the builds. Drawn
    where the builds bound the edge above; an open low end is drawn from 0."""
    for x, case in zip(at, cases):
        hull = edge_hull(case)
        if hull is not None and np.isfinite(hull[1]):
            ax.vlines(x, hull[0], hull[1], color="grey", linewidth=4, alpha=0.6)


def _judged(case: pd.DataFrame) -> pd.DataFrame:
    """A configuration's builds as the recommendation reads them (``recommend.Choice``,
    docs/capacity.md): a search below its range at 0; ``_bound`` where a capacity is a bound
    only (above the range, or stopped by a limit before it bracketed); and no bar at all,
    with ``_unranked`` saying why, where a build's search stopped with no verdict (failed
    requests, the client behind) or some builds found no capacity: the recommendation ranks
    such a configuration nowhere, and a bar of its other builds would rank it here."""
    stops = case.get("search_stop", pd.Series("", index=case.index)).fillna("").astype(str)
    no_verdict = stops.str.startswith(NO_VERDICT)
    capacity = pd.to_numeric(case["capacity_rps"], errors="coerce").mask(stops.eq(BELOW_RANGE), 0.0)
    judged = case.assign(capacity_rps=capacity)
    judged["_bound"] = ~no_verdict & ~stops.isin([BRACKETED, BELOW_RANGE, ""])  # "": a file before the column
    missing = int(capacity.isna().sum())
    why = (
        "no verdict"
        if no_verdict.any()
        else "none passed"
        if missing == len(case)
        else f"not ranked: {missing} of {len(case)} found none"
        if missing
        else ""
    )
    if why:
        judged["capacity_rps"] = np.nan
    return judged.assign(_unranked=why)
