"""One trace drawn: its rate over time, its length distributions and its adapters' shares.

What to look at before replaying a real trace: whether the window chosen is a burst or a
lull, how long the requests are against the model's limit, and how skewed the adapters.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lorabench.report.figures import pyplot
from lorabench.traces.summary import rate_over_time

if TYPE_CHECKING:
    from lorabench.traces.data import TraceData

TOP_ADAPTERS = 20


def draw_trace(data: TraceData, path: Path, *, title: str = "") -> Path:
    """Draw ``data`` into the PNG ``path`` (three panels) and return the path."""
    plt = pyplot()
    fig, (rate_ax, length_ax, share_ax) = plt.subplots(1, 3, figsize=(15, 4))
    width, rates = rate_over_time(data)
    rate_ax.step(np.arange(len(rates)) * width, rates, where="post", color="tab:blue")
    rate_ax.axhline(data.rate, color="gray", linestyle="--", label=f"mean {data.rate:.3g} req/s")
    rate_ax.set(xlabel="time (s)", ylabel=f"requests/s ({width:g} s buckets)", title="rate over time")
    rate_ax.legend(fontsize=8)
    top = max(int(data.input_len.max()), int(data.output_len.max()), 1)
    bins = np.unique(np.geomspace(1, top + 1, 40).astype(int))
    for values, name, color in ((data.input_len, "input", "tab:orange"), (data.output_len, "output", "tab:green")):
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
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
