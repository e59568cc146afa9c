"""A comparison's ratio plot (``compare --plot``, the page of ``compare --report``): apart from
the text renderers in ``render``, as it alone draws, with matplotlib imported when it does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lorabench.analysis.cases import METRICS, case_label
from lorabench.analysis.compare.analysis import (
    IMPROVED,
    NOT_SIGNIFICANT,
    REGRESSED,
    TOO_FEW,
    WITHIN,
    Comparison,
)


def plot(c: Comparison, out: Path) -> None:
    """One panel per metric: the new/base ratio of every case, regressions in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches
    import matplotlib.pyplot as plt

    labels = sorted({f"{f.case['workload']} {case_label(f.case)}" for f in c.findings})
    colors = {
        REGRESSED: "tab:red",
        IMPROVED: "tab:green",
        NOT_SIGNIFICANT: "tab:orange",
        TOO_FEW: "tab:orange",
        WITHIN: "tab:gray",
    }
    # A panel for each metric compared: most scenarios fill only some (churn, capacity).
    metrics = [m for m in METRICS if any(f.metric == m for f in c.findings)] or list(METRICS)[:1]
    size = (4 * len(metrics), 0.35 * len(labels) + 1.5)
    fig, axes = plt.subplots(1, len(metrics), figsize=size, sharey=True, squeeze=False)
    axes = axes[0]
    for ax, metric in zip(axes, metrics):
        by_label = {f"{f.case['workload']} {case_label(f.case)}": f for f in c.findings if f.metric == metric}
        ratios = [by_label[label].ratio if label in by_label else np.nan for label in labels]
        ax.barh(
            labels,
            ratios,
            color=[colors[by_label[label].verdict] if label in by_label else "white" for label in labels],
        )
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{metric} ({'higher' if METRICS[metric] else 'lower'} is better)", fontsize=9)
        ax.set_xlabel("new / base")
    axes[0].tick_params(axis="y", labelsize=7)
    legend = [
        (REGRESSED, "tab:red"),
        (IMPROVED, "tab:green"),
        ("past threshold, untested or not significant", "tab:orange"),
        (WITHIN, "tab:gray"),
    ]
    fig.legend(
        handles=[matplotlib.patches.Patch(color=c, label=t) for t, c in legend], loc="lower center", ncol=4, fontsize=8
    )
    fig.suptitle(f"{c.base.commit} -> {c.new.commit}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)
