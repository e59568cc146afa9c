"""``lorabench report``: result files as one page of figures (``DIR/index.html``, PNGs beside it).

The page opens on a headline (``headline``: the largest LoRA overheads, the configuration
to choose, failed checks), then each run's provenance, then the figures.
Each result file is one run, drawn beside the others and labelled by commit. A figure
appears only when some run has what it shows (residency tiers, working sets, online
traces); each online case gets two of its own, the trace it replayed (``DIR/traces/``) and
the engine's timeline while it ran (``DIR/timelines/``, where one was recorded).
The same input gives the same files: figures carry no timestamp.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from lorabench.analysis.report import cache_figures, capacity_figures, figures, online_figures, prefix_figures
from lorabench.analysis.report.headline import headline
from lorabench.analysis.report.runs import ReportRun, load_runs
from lorabench.results.schema import PROVENANCE_COLUMNS

# file name, caption, figure function: in the page's order.
FIGURES: list[tuple[str, str, Callable[[Sequence[ReportRun]], Any]]] = [
    (
        "latency.png",
        "Batch e2e, TTFT and decode against batch size, a panel per workload; error bars span the builds.",
        figures.latency_by_batch_size,
    ),
    (
        "lora_overhead.png",
        "Each multi-LoRA case's e2e over the same batch without adapters, on the same build.",
        figures.lora_overhead,
    ),
    (
        "online_cdf.png",
        "Online traces: distribution of TTFT and TPOT over finished requests.",
        figures.online_latency_cdfs,
    ),
    (
        "online_adapters.png",
        "Online traces: each adapter's share of the requests against its SLO attainment and TTFT p99.",
        online_figures.online_adapters,
    ),
    (
        "prefix_hit_rates.png",
        "Prefix caching: each adapter's hit rate per replay against the one its trace's hash ids predict.",
        prefix_figures.hit_rates,
    ),
    (
        "prefix_ttft.png",
        "Prefix caching: TTFT p50 of the same case with caching off and on.",
        prefix_figures.ttft_gain,
    ),
    (
        "residency.png",
        "A request's TTFT and prefill when its adapter is in a slot, in the CPU cache only, or on disk.",
        cache_figures.residency,
    ),
    (
        "working_set.png",
        "Requests cycling through W adapters: where max_loras and max_cpu_loras bite.",
        cache_figures.working_sets,
    ),
    (
        "capacity_knee.png",
        "Capacity searches: each probe's SLO attainment (95 % interval) against its rate; hollow: the probe failed.",
        capacity_figures.knee,
    ),
    (
        "capacity.png",
        "Capacity per engine configuration and trace shape, over builds; tick: the lowest failing rate.",
        capacity_figures.capacity_by_configuration,
    ),
    ("memory.png", "Peak memory and KV cache capacity per engine configuration.", cache_figures.memory),
]
PROVENANCE = tuple(c for c in PROVENANCE_COLUMNS if c != "timestamp")


def write_report(paths: Sequence[Path], out: Path, title: str = "lorabench report") -> Path:
    """Draw every figure the runs have data for into ``out``; returns the page's path.
    Raises ``CompareError`` for a missing or foreign file."""
    runs = load_runs(paths)
    out.mkdir(parents=True, exist_ok=True)
    plt = figures.pyplot()
    sections = []
    for name, caption, figure in _drawn(runs):
        (out / name).parent.mkdir(exist_ok=True)
        figure.savefig(out / name, dpi=100, metadata={"Software": None})
        plt.close(figure)
        anchor = name.removesuffix(".png").replace("/", "-")  # the headline links to its figure
        sections.append(
            f'<figure id="{anchor}"><img src="{name}" alt="{html.escape(caption)}"><figcaption>'
            f"{html.escape(caption)}</figcaption></figure>"
        )
    page = out / "index.html"
    page.write_text(_page(title, runs, sections), encoding="utf-8")
    return page


def _drawn(runs: Sequence[ReportRun]) -> Iterator[tuple[str, str, Any]]:
    """Each figure the runs have data for, one at a time (a long run has many replays)."""
    for name, caption, draw in FIGURES:
        figure = draw(runs)
        if figure is not None:
            yield name, caption, figure
    yield from online_figures.replays(runs)


def _page(title: str, runs: Sequence[ReportRun], sections: list[str]) -> str:
    head = "".join(f"<th>{html.escape(r.label)}</th>" for r in runs)
    body = "".join(
        f"<tr><th>{c}</th>" + "".join(f"<td>{html.escape(_first(r, c))}</td>" for r in runs) + "</tr>"
        for c in ("file", *PROVENANCE, "cases", "builds")
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:1400px} img{max-width:100%} "
        "table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}"
        " #headline li{margin:0.4em 0} .failed{color:#b00000;font-weight:bold}"
        f"</style></head><body><h1>{html.escape(title)}</h1>{headline(runs)}"
        f"<h2>Runs</h2><table><tr><th></th>{head}</tr>{body}"
        f"</table><h2>Figures</h2>{''.join(sections)}</body></html>\n"
    )


def _first(run: ReportRun, column: str) -> str:
    if column == "file":
        return str(run.path)
    if column == "cases":  # a case's builds are rows of their own: cases are their keys
        return str(run.rows["_key"].nunique())
    if column == "builds":
        return str(run.rows["build"].nunique()) if "build" in run.rows else ""
    values = sorted({str(v) for v in run.rows[column].dropna()}) if column in run.rows else []
    return ", ".join(values)
