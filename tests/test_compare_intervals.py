"""compare shows each side's own interval beside its figure (issue 52): the widest build's
± on e2e, TTFT and decode, the hull of the builds' SLO edge intervals on a capacity; nothing
for files written before the columns, or where a build lacks its interval; and no verdict
changes with them."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pandas as pd

from lorabench.analysis.compare import compare, load_run
from lorabench.cli import main as cli
from lorabench.measure import capacity
from tests.helpers import make_row
from tests.test_capacity import capacity_rows, write_rows

CI = ("e2e_ms_ci_pct", "ttft_ms_ci_pct", "decode_ms_ci_pct")
EDGE = ("capacity_ci_low_rps", "capacity_ci_high_rps")


def batch(e2e: float, ci: list[dict], batch_size: int = 2) -> list:
    """One multi-LoRA case, a build per entry of ``ci`` (its interval columns), ``e2e`` ms on each."""
    return [
        make_row(batch_size=batch_size, e2e_ms=e2e, engine_id=f"loras2-rank16-cpu4-build{b}", build=b, **values)
        for b, values in enumerate(ci)
    ]


def sides(tmp_path, *, drop: tuple[str, ...] = ()):
    """Base at 100 ms, new at 130 ms; base's builds ±2.5 % and ±3.4 % on e2e, new's ±1.7 % and
    ±1.2 %; TTFT only on base's; a bs4 case where one new build has no interval."""
    base = batch(100.0, [{"e2e_ms_ci_pct": 2.5, "ttft_ms_ci_pct": 6.0}, {"e2e_ms_ci_pct": 3.4, "ttft_ms_ci_pct": 4.0}])
    new = batch(130.0, [{"e2e_ms_ci_pct": 1.7}, {"e2e_ms_ci_pct": 1.2}])
    base += batch(50.0, [{"e2e_ms_ci_pct": 5.0}, {"e2e_ms_ci_pct": 5.0}], batch_size=4)
    new += batch(50.0, [{"e2e_ms_ci_pct": 7.0}, {"e2e_ms_ci_pct": None}], batch_size=4)
    paths = []
    for name, rows in (("base", base), ("new", new)):
        path = write_rows(tmp_path / f"{name}.csv", rows)
        pd.read_csv(path).drop(columns=list(drop)).to_csv(path, index=False)
        paths.append(path)
    return paths


def line_of(out: str, case: str, metric: str) -> list[str]:
    """The table line of ``case`` (a label's words) and ``metric``, split on its column gaps."""
    (line,) = [line for line in out.splitlines() if case in line and re.search(rf"\s{metric}\s", line)]
    return re.split(r"\s{2,}", line.strip())


def test_each_side_shows_its_widest_builds_interval_beside_its_figure(tmp_path, capsys):
    base, new = sides(tmp_path)
    cli.main(["compare", base, new])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("case "))
    assert re.split(r"\s{2,}", header.strip())[2:6] == ["base", "±", "new", "±"]
    assert line_of(out, " bs2 ", "e2e_ms")[2:7] == ["100.00", "±3.4%", "130.00", "±1.7%", "1.300"]
    # TTFT: base's builds have ±6.0 and ±4.0, new's none: the new side's cell is blank.
    assert line_of(out, " bs2 ", "ttft_ms")[2:6] == ["1.50", "±6.0%", "1.50", "1.000"]
    # bs4: one new build has no interval, so the new side shows none (the other's 7 % could be too narrow).
    assert line_of(out, " bs4 ", "e2e_ms")[2:6] == ["50.00", "±5.0%", "50.00", "1.000"]
    # Metrics with no interval column show none.
    assert line_of(out, " bs2 ", "prefill_ms")[2:5] == ["1.50", "1.50", "1.000"]
    assert "nan" not in out.lower()
    assert "smallest change flagged at this noise" in out, "the minimum detectable change is still stated"
    cli.main(["compare", base, new, "--format", "markdown"])
    markdown = capsys.readouterr().out
    assert "| base | ± | new | ± | ratio |" in markdown
    assert "| 100.00 | ±3.4% | 130.00 | ±1.7% | 1.300 |" in markdown


def test_pooled_runs_show_the_widest_over_every_runs_builds(tmp_path, capsys):
    base, new = sides(tmp_path)
    wider = tmp_path / "base2.csv"
    rows = pd.read_csv(base)
    rows.assign(run_id="run-2", e2e_ms_ci_pct=rows["e2e_ms_ci_pct"] * 2).to_csv(wider, index=False)
    cli.main(["compare", f"{base},{wider}", new])
    assert line_of(capsys.readouterr().out, " bs2 ", "e2e_ms")[2:4] == ["100.00", "±6.8%"]


def test_files_without_the_columns_show_no_interval_and_the_old_table(tmp_path, capsys):
    base, new = sides(tmp_path, drop=(*CI, *EDGE))
    assert cli.main(["compare", base, new]) in (0, 1)
    out = capsys.readouterr().out
    assert "±" not in out and "nan" not in out.lower()
    header = next(line for line in out.splitlines() if line.startswith("case "))
    assert re.split(r"\s{2,}", header.strip())[2:5] == ["base", "new", "ratio"]
    cli.main(["compare", base, new, "--format", "markdown"])
    assert "| case | metric | base | new | ratio | change | p (BH) | verdict |" in capsys.readouterr().out


def test_the_intervals_change_no_verdict(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with_ci = compare(*(load_run(p) for p in sides(tmp_path / "a")))
    without = compare(*(load_run(p) for p in sides(tmp_path / "b", drop=CI)))
    assert [(f.metric, f.verdict, f.p_adjusted) for f in with_ci.findings] == [
        (f.metric, f.verdict, f.p_adjusted) for f in without.findings
    ]
    assert with_ci.detectable_pct == without.detectable_pct


def edged(rows: list, edges: list[tuple[float | None, float | None]]) -> list:
    return [replace(r, capacity_ci_low_rps=low, capacity_ci_high_rps=high) for r, (low, high) in zip(rows, edges)]


def test_a_capacity_shows_each_sides_edge_hull(tmp_path, capsys):
    engine = {"max_loras": 2}
    base = edged(capacity_rows(engine, [10.0, 10.2]), [(9.8, 10.6), (9.9, 10.9)])
    new = edged(capacity_rows(engine, [8.0, 8.2]), [(None, 8.6), (7.9, 8.4)])
    base_csv, new_csv = write_rows(tmp_path / "base.csv", base), write_rows(tmp_path / "new.csv", new)
    cli.main(["compare", base_csv, new_csv])
    out = capsys.readouterr().out
    # The hull of base's builds; new's first build has no lower end: open at 0.
    assert line_of(out, "capacity loras2", "capacity_rps")[2:6] == ["10.10", "[9.8, 10.9]", "8.10", "(0, 8.6]"]


def test_a_capacity_judged_on_bounds_names_each_sides_edge(tmp_path, capsys):
    engine = {"max_loras": 2}
    capped = {"search_stop": capacity.ABOVE_RANGE, "capacity_max_rate": 40.0}
    base = edged(capacity_rows(engine, [40.0], over=None, **capped), [(31.5, None)])
    new = edged(capacity_rows(engine, [10.0], over=1.05, capacity_max_rate=40.0), [(9.7, 10.8)])
    base_csv, new_csv = write_rows(tmp_path / "base.csv", base), write_rows(tmp_path / "new.csv", new)
    assert cli.main(["compare", base_csv, new_csv]) == 1
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("CAPACITY REGRESSED")]
    assert "base at least 40 req/s (SLO edge [31.5, inf)), new between 10 and 10.5 req/s (SLO edge [9.7, 10.8])" in line
    cli.main(["compare", base_csv, new_csv, "--format", "json"])
    assert "SLO edge" not in json.dumps(json.loads(capsys.readouterr().out)["capacity_bounds"]), "JSON: the bounds only"


def test_the_comparison_page_shows_the_intervals(tmp_path):
    base, new = sides(tmp_path)
    cli.main(["compare", base, new, "--report", str(tmp_path / "page")])
    page = (tmp_path / "page" / "index.html").read_text()
    assert "<th>base</th><th>±</th><th>new</th><th>±</th>" in page
    assert "<td>100.00</td><td>±3.4%</td><td>130.00</td><td>±1.7%</td>" in page
