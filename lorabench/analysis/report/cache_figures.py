"""Figures of what adapters and engines hold: residency tiers, working-set sweeps, memory
and KV cache per engine configuration. Conventions as in ``figures``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from lorabench.analysis.report.figures import colors_for, curve, pyplot, spread
from lorabench.analysis.report.runs import ReportRun
from lorabench.config.target import INPROCESS

TIERS = ("slot", "cpu", "disk")


def residency(runs: Sequence[ReportRun]) -> Any | None:
    frames = [r.scenario("residency") for r in runs]
    if all(f.empty for f in frames):
        return None
    plt = pyplot()
    groups = sorted({(run.label, e) for run, f in zip(runs, frames) for e in f["engine"]})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(groups)
    http = False
    for g, (label, engine) in enumerate(groups):
        frame = next(f for run, f in zip(runs, frames) if run.label == label)
        frame = frame[frame["engine"] == engine]
        for ax, metric in zip(axes, ("ttft_ms_p50", "tier_extra_ttft_ms")):
            stats = [
                spread(frame[frame["tier"] == t], metric)
                if metric in frame and (frame["tier"] == t).any()
                else (np.nan, 0, 0)
                for t in TIERS
            ]
            y, lo, hi = (np.array(v) for v in zip(*stats))
            bars = ax.bar(
                np.arange(len(TIERS)) + g * width, y, width, yerr=[lo, hi], capsize=2, label=f"{label} {engine}"
            )
            if metric == "ttft_ms_p50" and _over_http(frame):
                bars[TIERS.index("disk")].set_hatch("//")  # its load was paid before the request
                http = True
    for ax, title in zip(axes, ("TTFT p50 (ms)", "TTFT over the same request right after, in a slot (ms)")):
        ax.set_xticks(np.arange(len(TIERS)) + width * (len(groups) - 1) / 2)
        ax.set_xticklabels(["device slot", "CPU cache only", "disk"])
        ax.set_ylabel(title)
    axes[0].set_title("adapter residency: one request at a time")
    if http:
        note = "hatched: over HTTP the disk load is paid by /v1/load_lora_adapter before the request (right: with it)"
        axes[0].set_xlabel(note, fontsize=7)
    axes[1].axhline(0, color="black", linewidth=0.8)
    axes[1].set_title("what the tier costs, measured back to back")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def working_sets(runs: Sequence[ReportRun]) -> Any | None:
    frames = [r.scenario("working_set") for r in runs]
    if all(f.empty for f in frames):
        return None
    colors, plt = colors_for(runs, frames), pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (("output_tokens_per_s", "output tokens/s"), ("ttft_ms_p50", "TTFT p50 (ms)"), ("load_share", None))
    for r, (run, frame) in enumerate(zip(runs, frames)):
        for engine, cases in frame.groupby("engine"):
            for ax, (metric, _) in zip(axes, panels):
                curve(ax, cases, "working_set", metric, colors[engine], r, f"{run.label} {engine}")
            first = cases.iloc[0]
            for ax in axes:
                for limit, style in ((first["max_loras"], ":"), (first["max_cpu_loras"], "--")):
                    ax.axvline(float(limit), color=colors[engine], linestyle=style, linewidth=0.8, alpha=0.6)
    for ax, (_, label) in zip(axes, panels):
        ax.set_xlabel("working set W (adapters in use)")
        ax.set_ylabel(label or "share of requests loading their adapter from disk")
        ax.grid(alpha=0.3)
    axes[0].set_title("working sets: throughput")
    axes[1].set_title("working sets: TTFT")
    axes[2].set_title("working sets: load_share")
    axes[2].legend(fontsize=7)
    fig.suptitle("dotted: max_loras, dashed: max_cpu_loras, in each configuration's colour", fontsize=9)
    fig.tight_layout()
    return fig


def memory(runs: Sequence[ReportRun]) -> Any | None:
    plt = pyplot()
    engines = sorted({e for r in runs for e in r.rows["engine"]})
    if not engines:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(runs)
    for r, run in enumerate(runs):
        by = run.rows.groupby("engine")
        for ax, metric in zip(axes, ("peak_memory_mb", "kv_cache_tokens")):
            if metric not in run.rows:
                continue
            y = [by[metric].max().get(e, np.nan) for e in engines]
            ax.bar(np.arange(len(engines)) + r * width, y, width, label=run.label)
    titles = ("peak memory (MiB; device on NPU/CUDA, process RSS on CPU)", "KV cache capacity (tokens)")
    for ax, title in zip(axes, titles):
        ax.set_xticks(np.arange(len(engines)) + width * (len(runs) - 1) / 2)
        ax.set_xticklabels(engines, fontsize=7, rotation=30, ha="right")
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def _over_http(frame: pd.DataFrame) -> bool:
    return "target" in frame and bool((frame["target"].fillna(INPROCESS) != INPROCESS).any())
