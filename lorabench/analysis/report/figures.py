"""The report's figures. Each takes the runs and returns a figure, or None when no run has
what it draws. Several runs are overlaid: a colour per engine configuration (named as in
test ids), a line style and marker per run (labelled by commit). Error bars span the
builds of a case (their minimum to maximum)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from lorabench.analysis.report.runs import ReportRun
from lorabench.results.records import counted_by_rank

STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
LATENCIES = (("e2e_ms", "batch e2e (ms)"), ("ttft_ms_p50", "TTFT p50 (ms)"), ("decode_ms_p50", "decode p50 (ms/token)"))


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def colors_for(runs: Sequence[ReportRun], frames: Sequence[pd.DataFrame]) -> dict[str, Any]:
    engines = sorted({e for f in frames for e in f["engine"]})
    cmap = pyplot().get_cmap("tab10")
    return {e: cmap(i % 10) for i, e in enumerate(engines)}


def spread(group: pd.DataFrame, column: str) -> tuple[float, float, float]:
    """Mean over builds, and the distance down to the minimum and up to the maximum."""
    values = group[column].astype(float)
    return values.mean(), values.mean() - values.min(), values.max() - values.mean()


def curve(ax: Any, cases: pd.DataFrame, x: str, metric: str, color: Any, run_index: int, label: str) -> None:
    """``metric`` against ``x``: the mean over builds, error bars to their minimum and maximum."""
    stats = [(value, *spread(group, metric)) for value, group in cases.groupby(x)]
    xs, ys, lo, hi = (np.array(v) for v in zip(*stats))
    line, marker = STYLES[run_index % len(STYLES)]
    ax.errorbar(xs, ys, yerr=[lo, hi], color=color, linestyle=line, marker=marker, capsize=3, label=label)


def latency_by_batch_size(runs: Sequence[ReportRun]) -> Any | None:
    frames = [r.rows[r.rows["scenario"].isin(["multilora", "no_lora"])] for r in runs]
    if all(f.empty for f in frames):
        return None
    workloads = sorted({w for f in frames for w in f["workload"]})
    colors, plt = colors_for(runs, frames), pyplot()
    fig, axes = plt.subplots(len(LATENCIES), len(workloads), figsize=(3.6 * len(workloads), 8), squeeze=False)
    for r, (run, frame) in enumerate(zip(runs, frames)):
        for col, workload in enumerate(workloads):
            for (engine, _), cases in frame[frame["workload"] == workload].groupby(["engine", "workload"]):
                for row, (metric, _) in enumerate(LATENCIES):
                    curve(axes[row][col], cases, "batch_size", metric, colors[engine], r, f"{run.label} {engine}")
    for col, workload in enumerate(workloads):
        axes[0][col].set_title(f"workload: {'none (no LoRA)' if workload == 'none' else workload}", fontsize=10)
        axes[-1][col].set_xlabel("batch size (requests)")
        for row, (_, label) in enumerate(LATENCIES):
            axes[row][col].set_ylabel(label)
            axes[row][col].set_xticks(sorted({b for f in frames for b in f["batch_size"].dropna()}))
    _legend(fig, axes)
    return fig


def lora_overhead(runs: Sequence[ReportRun]) -> Any | None:
    frames = [r.scenario("multilora").dropna(subset=["lora_overhead"]) for r in runs if "lora_overhead" in r.rows]
    if not frames or all(f.empty for f in frames):
        return None
    plt = pyplot()
    keys = sorted({(w, e, int(b)) for f in frames for w, e, b in zip(f["workload"], f["engine"], f["batch_size"])})
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(keys) * len(frames)), 4.5))
    width = 0.8 / len(frames)
    for r, (run, frame) in enumerate(zip(runs, frames)):
        stats = [
            spread(frame[(frame.workload == w) & (frame.engine == e) & (frame.batch_size == b)], "lora_overhead")
            for w, e, b in keys
        ]
        y, lo, hi = (np.array(v) for v in zip(*stats))
        ax.bar(np.arange(len(keys)) + r * width, y, width, yerr=[lo, hi], capsize=2, label=run.label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(keys)) + width * (len(frames) - 1) / 2)
    ax.set_xticklabels([f"{w} bs{b}\n{e}" for w, e, b in keys], fontsize=7, rotation=60, ha="right")
    ax.set_ylabel("e2e / same batch without adapters (×)")
    ax.set_title("LoRA overhead against the no-LoRA baseline on the same build")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def online_requests(run: ReportRun) -> pd.DataFrame:
    """The online requests a row's latencies are over: finished, and sent after their
    trace's warm-up (``counted_by_rank``'s rule, docs/metrics.md)."""
    if run.samples.empty:
        return pd.DataFrame()
    frame = run.samples[run.samples["scenario"] == "online"]
    columns = [frame.get(c, pd.Series(None, index=frame.index)) for c in ("finished", "arrival_s", "trace_warmup_s")]
    return frame[[counted_by_rank(*values) for values in zip(*columns)]]


def _traces(frame: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """Each engine's requests of each trace it replayed (suite and rate), and a label:
    two traces of one configuration are two curves, not one mixing both loads."""
    if frame.empty:
        return []
    by = [c for c in ("engine", "trace_suite", "trace_rate") if c in frame]
    found = []
    for values, requests in frame.groupby([frame[c].fillna("").astype(str) for c in by], sort=True):
        named = dict(zip(by, values))
        suite, rate = named.get("trace_suite", ""), named.get("trace_rate", "")
        found.append((named["engine"], f"{suite} at {rate}/s" if rate else suite, requests))
    return found


def online_latency_cdfs(runs: Sequence[ReportRun]) -> Any | None:
    frames = [online_requests(r) for r in runs]
    if all(f.empty for f in frames):
        return None
    colors, plt = colors_for(runs, [f for f in frames if not f.empty]), pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    curve = 0
    for run, frame in zip(runs, frames):
        for engine, trace, requests in _traces(frame):
            for ax, metric in zip(axes, ("ttft_ms", "decode_ms")):
                values = np.sort(requests[metric].dropna().to_numpy(dtype=float))
                ax.step(
                    values,
                    np.arange(1, len(values) + 1) / len(values),
                    where="post",
                    color=colors[engine],
                    linestyle=STYLES[curve % len(STYLES)][0],
                    label=f"{run.label} {engine} {trace}".strip(),
                )
            curve += 1
    for ax, title in zip(axes, ("TTFT (ms)", "TPOT: time per output token after the first (ms)")):
        ax.set_xlabel(title)
        ax.set_ylabel("share of counted requests")
        ax.grid(alpha=0.3)
    axes[0].set_title("online traces: TTFT (finished, after the warm-up)")
    axes[1].set_title("online traces: TPOT")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _legend(fig: Any, axes: Any) -> None:
    handles, labels = {}, []
    for ax in np.ravel(axes):
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = h
                labels.append(label)
    fig.legend([handles[label] for label in labels], labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
