"""Figures of capacity searches: SLO attainment against the probed rate (where the knee is)
and each configuration's capacity. Conventions as in ``figures``: a colour per engine
configuration, a line style per run, error bars over builds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lorabench.report.figures import STYLES, colors_for, pyplot, spread
from lorabench.report.runs import ReportRun


def knee(runs: Sequence[ReportRun]) -> Any | None:
    """Every probe of every search: attainment with its 95 % interval against the rate; a
    hollow marker is a probe that failed (below the target, or left requests unfinished)."""
    frames = [r.probes for r in runs]
    if all(f.empty for f in frames):
        return None
    colors, plt = colors_for(runs, [f for f in frames if not f.empty]), pyplot()
    shapes = sorted({s for f in frames if not f.empty for s in f["trace_suite"].astype(str)})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.4), squeeze=False)
    for r, (run, frame) in enumerate(zip(runs, frames)):
        groups = frame.groupby(["trace_suite", "engine", "build"]) if not frame.empty else ()
        for (suite, engine, _), probes in groups:
            ax = axes[0][shapes.index(str(suite))]
            probes = probes.sort_values("rate")
            line, marker = STYLES[r % len(STYLES)]
            color = colors[engine]
            ax.plot(probes["rate"], probes["attainment"], linestyle=line, color=color, label=f"{run.label} {engine}")
            passed = probes["passed"].astype(str).str.lower() == "true"
            for mask, face in ((passed, color), (~passed, "none")):
                shown = probes[mask]
                error = np.clip(
                    [shown["attainment"] - shown["ci_low"], shown["ci_high"] - shown["attainment"]], 0, None
                )
                ax.errorbar(
                    shown["rate"], shown["attainment"], yerr=error, fmt=marker, color=color, mfc=face, capsize=2
                )
            targets = run.scenario("capacity")["slo_target"].dropna()
            if not targets.empty:
                ax.axhline(float(targets.iloc[0]), color="gray", linestyle=":", linewidth=1)
    for ax, suite in zip(axes[0], shapes):
        ax.set(xscale="log", xlabel="probed rate (requests/s)", ylabel="SLO attainment", ylim=(-0.02, 1.02))
        ax.set_title(f"capacity search: {suite} (dotted: target)", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def capacity_by_configuration(runs: Sequence[ReportRun]) -> Any | None:
    """Each configuration's capacity per trace shape: the mean over builds, bars to the
    lowest and highest build; the lowest failing rate beside it as a tick."""
    frames = [r.scenario("capacity") for r in runs]
    if all(f.empty for f in frames):
        return None
    plt = pyplot()
    keys = sorted({(str(s), e) for f in frames for s, e in zip(f["trace_suite"], f["engine"])})
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(keys) * len(frames)), 4.4))
    width = 0.8 / len(frames)
    for r, (run, frame) in enumerate(zip(runs, frames)):
        stats = []
        for suite, engine in keys:
            cases = frame[(frame["trace_suite"].astype(str) == suite) & (frame["engine"] == engine)]
            stats.append(
                spread(cases.fillna({"capacity_rps": 0.0}), "capacity_rps") if not cases.empty else (np.nan, 0, 0)
            )
        y, lo, hi = (np.array(v, dtype=float) for v in zip(*stats))
        x = np.arange(len(keys)) + r * width
        ax.bar(x, y, width, yerr=np.vstack([lo, hi]), capsize=3, label=run.label)
        over = [
            frame[(frame["trace_suite"].astype(str) == s) & (frame["engine"] == e)]["capacity_over_rps"].min()
            for s, e in keys
        ]
        ax.scatter(x, over, marker="_", s=200, color="black")
    ax.set_xticks(np.arange(len(keys)) + width * (len(frames) - 1) / 2)
    ax.set_xticklabels([f"{s}\n{e}" for s, e in keys], fontsize=8)
    ax.set_ylabel("capacity (requests/s within the SLOs)")
    ax.set_title("capacity per configuration (tick: lowest failing rate)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
