"""Figures of prefix caching: each adapter's hit rate measured against the one its trace's
hash ids predicted (``<run>.replays/adapters.csv``), and what caching did to TTFT, case by
case, where a run measured the same case with caching off and on. Conventions as in
``figures``; docs/metrics.md#prefix-caching defines the rates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from lorabench.analysis.cases import KEY_SEP, MATCH_KEY, case_label
from lorabench.analysis.report.figures import STYLES, colors_for, pyplot
from lorabench.analysis.report.runs import ReportRun

# A case but for caching: what pairs its rows off and on.
PAIR_KEY = tuple(c for c in MATCH_KEY if c not in ("enable_prefix_caching", "prefix_cache_salted"))


def hit_rates(runs: Sequence[ReportRun]) -> Any | None:
    """Per adapter and replay with caching on: the hit rate measured against the predicted one.
    On the diagonal, the engine reused every block the ids share; below it, it reused fewer
    (evicted, or not keyed as predicted); above it, it reused blocks another adapter computed."""
    frames = [_cached(run.adapters) for run in runs]
    if all(f.empty for f in frames):
        return None
    colors, plt = colors_for(runs, [f for f in frames if not f.empty]), pyplot()
    fig, ax = plt.subplots(figsize=(6, 5))
    ax.plot([0, 1], [0, 1], color="0.6", linewidth=1, label="measured = predicted")
    for r, (run, frame) in enumerate(zip(runs, frames)):
        for engine, group in frame.groupby("engine") if not frame.empty else ():
            ax.scatter(
                group["prefix_hit_rate_predicted"],
                group["prefix_hit_rate"],
                color=colors[engine],
                marker=STYLES[r % len(STYLES)][1],
                label=f"{run.label} {engine}",
            )
            for _, point in group.drop_duplicates(["adapter", "prefix_hit_rate"]).iterrows():
                ax.annotate(
                    point["adapter"], (point["prefix_hit_rate_predicted"], point["prefix_hit_rate"]), fontsize=6
                )
    ax.set_xlabel("hit rate its trace's hash ids predict (infinite cache)")
    ax.set_ylabel("hit rate measured (prompt tokens found cached)")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("prefix caching: each adapter's hit rate per replay")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _cached(adapters: pd.DataFrame) -> pd.DataFrame:
    needed = {"prefix_hit_rate", "prefix_hit_rate_predicted", "enable_prefix_caching"}
    if adapters.empty or not needed <= set(adapters):
        return pd.DataFrame()
    on = adapters[adapters["enable_prefix_caching"].astype(str) == "True"]
    return on.dropna(subset=["prefix_hit_rate", "prefix_hit_rate_predicted"])


def ttft_gain(runs: Sequence[ReportRun]) -> Any | None:
    """TTFT p50 with caching off and on, for each case a run measured both ways on the same
    configuration otherwise; where no run did, the cases the runs together measured both ways
    (a run with caching off and one with it on). The bar pair is labelled with off over on
    (means over builds)."""
    pairs = [(run.label, _paired(run.rows)) for run in runs]
    pairs = [(label, frame) for label, frame in pairs if not frame.empty]
    if not pairs and len(runs) > 1:
        pooled = _paired(pd.concat([run.rows for run in runs], ignore_index=True))
        pairs = [(" + ".join(run.label for run in runs), pooled)] if not pooled.empty else []
    if not pairs:
        return None
    plt = pyplot()
    count = sum(len(frame) for _, frame in pairs)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * count), 4.5))
    x, labels = 0, []
    for r, (name, frame) in enumerate(pairs):
        hatch = ["", "//", "..", "xx"][r % 4]
        for case, row in frame.iterrows():
            ax.bar(
                x - 0.2, row["off"], width=0.4, color="tab:gray", hatch=hatch, label="caching off" if x == 0 else None
            )
            ax.bar(
                x + 0.2, row["on"], width=0.4, color="tab:green", hatch=hatch, label="caching on" if x == 0 else None
            )
            ax.annotate(f"{row['off'] / row['on']:.2g}x", (x, max(row["off"], row["on"])), ha="center", va="bottom")
            labels.append(f"{name}\n{case}")
            x += 1
    ax.set_xticks(np.arange(len(labels)), labels, fontsize=7)
    ax.set_ylabel("TTFT p50 (ms), mean over builds")
    ax.set_title("prefix caching: TTFT off against on, same case (label: off / on)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _paired(rows: pd.DataFrame) -> pd.DataFrame:
    """TTFT p50 (mean over builds) off and on, indexed by a case label, for the cases a run
    measured both ways: matched on every key column but caching's own, as compare matches."""
    if "enable_prefix_caching" not in rows or "ttft_ms_p50" not in rows:
        return pd.DataFrame()
    frame = rows.dropna(subset=["ttft_ms_p50"]).copy()
    if frame.empty or frame["enable_prefix_caching"].astype(str).nunique() < 2:
        return pd.DataFrame()
    columns = [c for c in PAIR_KEY if c in frame]
    cells = frame[columns].map(_cell)
    frame["case"] = cells.agg(KEY_SEP.join, axis=1)
    frame["caching"] = np.where(frame["enable_prefix_caching"].astype(str) == "True", "on", "off")
    table = frame.pivot_table(index="case", columns="caching", values="ttft_ms_p50", aggfunc="mean")
    if not {"on", "off"} <= set(table.columns):
        return pd.DataFrame()
    table = table.dropna()
    table.index = [_label(dict(zip(columns, key.split(KEY_SEP)))) for key in table.index]
    return table


def _label(case: dict[str, str]) -> str:
    """The case as compare names it, with caching's part left out (the bars say it)."""
    full = {c: case.get(c, "") for c in MATCH_KEY}
    return case_label({**full, "enable_prefix_caching": "False"})


def _cell(value: object) -> str:
    if pd.isna(value):
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)
