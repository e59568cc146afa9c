"""One trace drawn: its rate over time, its length distributions and its adapters' shares.

What to look at before replaying a real trace: whether the window chosen is a burst or a
lull, how long the requests are against the model's limit, and how skewed the adapters.
The report draws the same for every online case, from the trace rebuilt out of the case's
samples (``replayed_trace``), so what was replayed is seen beside how the engine served it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lorabench.analysis.report.figures import pyplot
from lorabench.load.traces.data import TraceData
from lorabench.load.traces.summary import rate_over_time

TOP_ADAPTERS = 20


def draw_trace(data: TraceData, path: Path, *, title: str = "") -> Path:
    """Draw ``data`` into the PNG ``path`` (three panels) and return the path."""
    plt = pyplot()
    fig = trace_figure(data, title=title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def trace_figure(
    data: TraceData, *, title: str = "", outputs: np.ndarray | None = None, note: str = "", warmup_s: float = 0.0
) -> Any:
    """Three panels: rate over time, length histograms, adapter shares. ``outputs`` replaces
    the output lengths drawn (a replay knows them only for its finished requests), ``note``
    says so in the legend; a replay's warm-up is shaded, as on its timeline."""
    plt = pyplot()
    fig, (rate_ax, length_ax, share_ax) = plt.subplots(1, 3, figsize=(15, 4))
    width, rates = rate_over_time(data)
    rate_ax.step(np.arange(len(rates)) * width, rates, where="post", color="tab:blue")
    rate_ax.axhline(data.rate, color="gray", linestyle="--", label=f"mean {data.rate:.3g} req/s")
    if warmup_s > 0:
        rate_ax.axvspan(0, warmup_s, color="grey", alpha=0.15, linewidth=0, label="warm-up")
    rate_ax.set(xlabel="time (s)", ylabel=f"requests/s ({width:g} s buckets)", title="rate over time")
    rate_ax.legend(fontsize=8)
    outputs = data.output_len if outputs is None else outputs
    top = max(int(data.input_len.max(initial=0)), int(outputs.max(initial=0)), 1)
    bins = np.unique(np.geomspace(1, top + 1, 40).astype(int))
    for values, name, color in ((data.input_len, "input", "tab:orange"), (outputs, f"output{note}", "tab:green")):
        length_ax.hist(values, bins=bins, histtype="step", color=color, label=name)
    length_ax.set(xscale="log", xlabel="tokens", ylabel="requests", title="lengths")
    length_ax.legend(fontsize=8)
    counts = np.bincount(data.adapter, minlength=len(data.adapters))
    order = np.argsort(-counts, kind="stable")[:TOP_ADAPTERS]
    share_ax.bar(range(len(order)), counts[order] / max(len(data), 1), color="tab:purple")
    share_ax.set_xticks(range(len(order)), [data.adapters[i] for i in order], rotation=60, ha="right", fontsize=7)
    shown = f" (top {TOP_ADAPTERS} of {len(data.adapters)})" if len(data.adapters) > TOP_ADAPTERS else ""
    share_ax.set(ylabel="share of requests", title=f"adapter shares{shown}")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def replayed_trace(row: pd.Series, requests: pd.DataFrame) -> tuple[TraceData, np.ndarray]:
    """The trace an online case replayed, rebuilt from its samples (every replayed request
    is one, warm-up included), and the output lengths known: those of its finished requests,
    which generated exactly what they asked (``ignore_eos``); an unfinished one's ask is not kept.
    Adapters are named as the samples name them, in name order; its duration is the row's."""
    requests = requests.sort_values("arrival_s", kind="stable")
    names = requests["adapter"].fillna("(no adapter)").astype(str)
    adapters = sorted(set(names))
    finished = requests["finished"].astype(str).str.lower().isin(("true", "1", "1.0")).to_numpy()
    output_len = requests["output_tokens"].fillna(0).to_numpy(dtype=np.int64)
    arrival_s = requests["arrival_s"].to_numpy(dtype=float)
    duration = pd.to_numeric(row.get("trace_duration_s"), errors="coerce")
    if not duration > 0:  # a row without it: the span the requests cover
        duration = float(arrival_s.max(initial=0.0))
    data = TraceData(
        header={},
        adapters=adapters,
        arrival_s=arrival_s,
        adapter=names.map({name: i for i, name in enumerate(adapters)}).to_numpy(dtype=np.int64),
        input_len=requests["prompt_tokens"].to_numpy(dtype=np.int64),
        output_len=output_len,
        duration_s=float(duration),
    )
    return data, output_len[finished]
