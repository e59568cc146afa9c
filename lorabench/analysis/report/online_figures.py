"""Figures of online replays from what they recorded: each adapter's usage
(``<run>.replays/adapters.csv``) and, per replay, the trace it replayed (from the samples)
beside the engine timeline (``<run>.replays/timeline.csv``) on the trace's time axis.
Conventions as in ``figures``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from lorabench.analysis.report.figures import STYLES, colors_for, pyplot
from lorabench.analysis.report.runs import ReportRun, case_keys
from lorabench.analysis.report.trace_figures import replayed_trace, trace_figure

# Arrivals are counted in this many bins over the trace, at least this long each.
ARRIVAL_BINS, MIN_BIN_S = 60, 0.05


def online_adapters(runs: Sequence[ReportRun]) -> Any | None:
    """Per adapter and replay: its share of the requests against its SLO attainment and its
    TTFT p99. Starved adapters sit low on the left, and high on the right."""
    frames = [_with_shares(run.adapters) for run in runs]
    if all(f.empty for f in frames):
        return None
    colors, plt = colors_for(runs, [f for f in frames if not f.empty]), pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for r, (run, frame) in enumerate(zip(runs, frames)):
        for engine, group in frame.groupby("engine") if not frame.empty else ():
            for ax, metric in zip(axes, ("slo_attainment", "ttft_ms_p99")):
                ax.scatter(
                    group["share"],
                    group[metric],
                    color=colors[engine],
                    marker=STYLES[r % len(STYLES)][1],
                    label=f"{run.label} {engine}",
                )
            worst = group["slo_attainment"].idxmin()
            if group.at[worst, "slo_attainment"] < 1:
                axes[0].annotate(
                    group.at[worst, "adapter"],
                    (group.at[worst, "share"], group.at[worst, "slo_attainment"]),
                    fontsize=7,
                )
    for ax, label in zip(axes, ("SLO attainment of its requests", "TTFT p99 of its finished requests (ms)")):
        ax.set_xlabel("adapter's share of the replay's measured requests")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.05, 1.05)
    axes[0].set_title("online traces: per-adapter attainment (starved adapters sit low)")
    axes[1].set_title("online traces: per-adapter TTFT p99")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _with_shares(adapters: pd.DataFrame) -> pd.DataFrame:
    """Each adapter's requests over all the requests of its replay."""
    if adapters.empty:
        return adapters
    totals = adapters.groupby(case_keys(adapters))["requests"].transform("sum")
    return adapters.assign(share=adapters["requests"] / totals)


def replays(runs: Sequence[ReportRun]) -> Iterator[tuple[str, str, Any]]:
    """(file name, caption, figure) for each online case, run by run: the trace it replayed
    (``traces/N.png``, from its samples) and, beside it, the engine's timeline while it ran
    (``timelines/N.png``, where one was recorded); N counts the cases with either."""
    n = 0
    for run in runs:
        rows = run.scenario("online")
        samples, steps = _by_case(run.samples), _by_case(run.timeline)
        for key, row in zip(case_keys(rows), (r for _, r in rows.iterrows())):
            requests, timeline = samples.get(key, EMPTY), steps.get(key, EMPTY)
            if requests.empty and timeline.empty:
                continue
            n += 1
            case = f"{run.label} {row['engine_id']}, {row['test_id']}"
            if not requests.empty:
                caption = f"{case}: the trace replayed (rate over time, lengths, adapters' shares), from its samples."
                yield f"traces/{n}.png", caption, _trace(case, row, requests)
            if not timeline.empty:
                caption = (
                    f"{case}: arrivals, each request's TTFT at its send time, KV cache usage, running and "
                    "waiting requests, and distinct adapters against max_loras."
                )
                yield f"timelines/{n}.png", caption, _timeline(row, timeline, requests)


EMPTY = pd.DataFrame()


def _by_case(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """A file beside the rows (samples, timeline) split by case, keyed as ``case_keys`` keys rows."""
    if frame.empty:
        return {}
    return {key: group for key, group in frame.groupby(case_keys(frame), sort=False)}


def _trace(case: str, row: pd.Series, requests: pd.DataFrame) -> Any:
    data, outputs = replayed_trace(row, requests)
    note = "" if len(outputs) == len(data) else f" ({len(outputs)} finished of {len(data)})"
    warmup = pd.to_numeric(row.get("trace_warmup_s"), errors="coerce")
    title = f"{case}: the trace replayed"
    return trace_figure(data, title=title, outputs=outputs, note=note, warmup_s=warmup if warmup > 0 else 0.0)


def _timeline(row: pd.Series, steps: pd.DataFrame, requests: pd.DataFrame) -> Any:
    plt = pyplot()
    fig, axes = plt.subplots(5, 1, figsize=(10, 12), sharex=True)
    t = steps["t_s"].to_numpy(dtype=float)
    if not requests.empty:
        arrivals = requests["arrival_s"].to_numpy(dtype=float)
        width = max(float(max(arrivals.max(), t.max())) / ARRIVAL_BINS, MIN_BIN_S)
        counts, edges = np.histogram(arrivals, bins=np.arange(0, arrivals.max() + 2 * width, width))
        axes[0].stairs(counts / width, edges, fill=True, alpha=0.6)
        sent = arrivals + requests["send_lag_ms"].to_numpy(dtype=float) / 1000.0
        axes[1].scatter(sent, requests["ttft_ms"], s=6)
    axes[1].axhline(float(row["slo_ttft_ms"]), color="red", linestyle="--", linewidth=0.8, label="SLO")
    axes[2].step(t, steps["kv_usage"], where="post")
    for column in ("running", "waiting"):
        axes[3].step(t, steps[column], where="post", label=column)
    for column in ("adapters_running", "adapters_waiting"):
        axes[4].step(t, steps[column], where="post", label=f"{column.replace('_', ' ')} (engine)")
    if not requests.empty:
        awaiting = _awaiting_first_token(requests, t)
        axes[4].step(t, awaiting, where="post", linestyle="--", label="adapters awaiting a first token (samples)")
    axes[4].axhline(float(row["max_loras"]), color="black", linestyle=":", linewidth=1, label="max_loras")
    labels = (
        "arrivals/s",
        "TTFT (ms) at send time",
        "KV cache usage (0-1)",
        "requests",
        "distinct adapters",
    )
    for ax, label in zip(axes, labels):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.axvspan(0, float(row["trace_warmup_s"]), color="grey", alpha=0.15, linewidth=0)
    for ax in axes[1], axes[3], axes[4]:
        ax.legend(fontsize=7, loc="upper right")
    axes[2].set_ylim(0, max(1.0, float(steps["kv_usage"].max()) * 1.05))
    axes[-1].set_xlabel("seconds since the trace started (grey: warm-up, left out of the row's statistics)")
    axes[0].set_title(f"{row['engine_id']}: {row['test_id']}", fontsize=9)
    fig.tight_layout()
    return fig


def _awaiting_first_token(requests: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """At each time of ``t``, the distinct adapters with a request sent and still without its
    first token (never, for a request that got none): what the engine made wait, seen from
    the samples, whatever the engine's own stats say of waiting adapters."""
    sent = requests["arrival_s"].to_numpy(dtype=float) + requests["send_lag_ms"].to_numpy(dtype=float) / 1000.0
    # Samples files written before ttft_from_send_ms existed held the TTFT from the send in ttft_ms.
    from_send = requests["ttft_from_send_ms"] if "ttft_from_send_ms" in requests else requests["ttft_ms"]
    first = np.nan_to_num(sent + from_send.to_numpy(dtype=float) / 1000.0, nan=np.inf)
    count = np.zeros(len(t), dtype=int)
    for adapter in requests["adapter"].unique():
        mine = (requests["adapter"] == adapter).to_numpy()
        started = np.searchsorted(np.sort(sent[mine]), t, side="right")
        answered = np.searchsorted(np.sort(first[mine]), t, side="right")
        count += started > answered
    return count
