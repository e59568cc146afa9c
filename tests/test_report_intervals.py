"""The report shows each headline figure's interval (issue 52), as its two ends: a batch
case's e2e, TTFT and decode with the interval over its builds (one build: over its rounds),
a capacity search's SLO edge interval in a table and on the capacity figure; and says
plainly where a run recorded none."""

from __future__ import annotations

from dataclasses import replace

from matplotlib.collections import LineCollection

from lorabench.analysis.report import capacity_figures
from lorabench.analysis.report.runs import load_runs
from lorabench.cli import main as cli
from tests.helpers import ROOT, make_row
from tests.test_capacity import capacity_rows, write_rows

ENGINE = {"max_loras": 2}
CASE = "multilora loras2-rank16-cpu4 bs2 in16 out4"


def section(tmp_path, *paths) -> str:
    out = tmp_path / "report"
    assert cli.main(["report", *map(str, paths), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert page.index("<h2>Headline</h2>") < page.index("<h2>Headline figures") < page.index("<h2>Runs</h2>")
    return page.split("<section id='intervals'>")[1].split("</section>")[0]


def batch_rows() -> list:
    """Two builds: e2e 100 and 120 ms (rounds ±2.5 % and ±3.4 %), TTFT 1.4 and 1.6 ms, decode
    1.5 ms on each (its rounds interval on one build only: the builds' interval needs none)."""
    builds = [
        {"e2e_ms": 100.0, "e2e_ms_ci_pct": 2.5, "ttft_ms": 1.4, "ttft_ms_ci_pct": 6.0, "decode_ms_ci_pct": 1.1},
        {"e2e_ms": 120.0, "e2e_ms_ci_pct": 3.4, "ttft_ms": 1.6, "ttft_ms_ci_pct": 4.0},
    ]
    return [make_row(engine_id=f"loras2-rank16-cpu4-build{b}", build=b, **values) for b, values in enumerate(builds)]


def edged(rows: list, edges: list) -> list:
    return [replace(r, capacity_ci_low_rps=low, capacity_ci_high_rps=high) for r, (low, high) in zip(rows, edges)]


def test_a_batch_case_shows_its_mean_with_the_interval_over_its_builds(tmp_path):
    html = section(tmp_path, write_rows(tmp_path / "run.csv", batch_rows()))
    # exp(mean log) ∓ t(0.975, 1 df) · sd / √2 of the builds' logs, not the builds' ±3.4 % over rounds:
    # it holds both builds (100, 120) and their geometric mean (109.5), and is wide.
    cells = "<td>110.00 [34.40, 348.85]</td><td>1.50 [0.64, 3.50]</td><td>1.50 [1.50, 1.50]</td>"
    assert f"<tr><td>distinct</td><td>{CASE}</td>{cells}</tr>" in html
    assert "<th>e2e ms</th><th>TTFT ms (mean)</th><th>decode ms (mean)</th>" in html
    assert "±" not in html


def test_a_case_of_one_build_shows_its_rounds_interval_with_its_true_low_end(tmp_path):
    row = make_row(engine_id="loras2-rank16-cpu4-build0", e2e_ms=100.0, e2e_ms_ci_pct=88.0)
    html = section(tmp_path, write_rows(tmp_path / "run.csv", [row]))
    # w = 0.88: 100 / 1.88 .. 100 · 1.88, not 12 .. 188; TTFT and decode record no interval: blank.
    assert f"<tr><td>distinct</td><td>{CASE}</td><td>100.00 [53.19, 188.00]</td><td>1.50</td><td>1.50</td></tr>" in html


def test_a_run_without_intervals_says_none_were_recorded(tmp_path):
    html = section(tmp_path, ROOT / "tests" / "data" / "default-run.csv")
    assert "none recorded" in html and "±" not in html.split("</p>", 1)[1] and "<table>" not in html


def test_runs_side_by_side_each_get_their_own_tables(tmp_path):
    planted = write_rows(tmp_path / "run.csv", batch_rows())
    html = section(tmp_path, planted, ROOT / "tests" / "data" / "default-run.csv")
    first, second = html.split("<h3>")[1:]
    assert "110.00 [34.40, 348.85]" in first and "none recorded" in second


def capacity_run(tmp_path) -> str:
    two = edged(capacity_rows(ENGINE, [10.0, 10.2]), [(9.8, 10.6), (9.9, 10.9)])
    eight = edged(capacity_rows({"max_loras": 8}, [13.0, 13.4]), [(None, 14.1), (12.6, 13.9)])
    return write_rows(tmp_path / "capacity.csv", [*two, *eight])


def test_a_capacity_search_shows_its_builds_edge_hull_in_the_table(tmp_path):
    html = section(tmp_path, capacity_run(tmp_path))
    assert "<td>loras2-rank16-cpu4</td><td>10, 10.2</td><td>[9.8, 10.9]</td>" in html
    assert "<td>loras8-rank16-cpu4</td><td>13, 13.4</td><td>(0, 14.1]</td>" in html
    assert "<th>SLO edge, 95 %</th>" in html


def test_the_capacity_figure_draws_each_edge_interval(tmp_path):
    runs = load_runs([capacity_run(tmp_path)])
    figure = capacity_figures.capacity_by_configuration(runs)
    segments = [
        tuple(round(float(y), 2) for y in segment[:, 1])
        for collection in figure.axes[0].collections
        if isinstance(collection, LineCollection)
        for segment in collection.get_segments()
    ]
    assert (9.8, 10.9) in segments and (0.0, 14.1) in segments
