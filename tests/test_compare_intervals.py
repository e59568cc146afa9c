"""compare shows each side's own 95 % interval beside its figure (issue 52), as its two ends:
over the side's builds where it has 2 or more (the t interval of their geometric mean, df =
builds - 1; pooled runs: over the runs' means), the one build's rounds interval where it has
one, the hull of the builds' SLO edge intervals on a capacity; nothing for files written
before the columns, or a lone build without its interval; and no verdict changes with them."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy import stats

from lorabench.analysis.compare import compare, load_run
from lorabench.cli import main as cli
from lorabench.measure import capacity
from tests.helpers import make_row
from tests.test_capacity import capacity_rows, write_rows

CI = ("e2e_ms_ci_pct", "ttft_ms_ci_pct", "decode_ms_ci_pct")
EDGE = ("capacity_ci_low_rps", "capacity_ci_high_rps")


def batch(builds: list[dict], batch_size: int = 2) -> list:
    """One multi-LoRA case, a build per entry of ``builds`` (its figures and interval columns)."""
    return [
        make_row(batch_size=batch_size, engine_id=f"loras2-rank16-cpu4-build{b}", build=b, **values)
        for b, values in enumerate(builds)
    ]


def sides(tmp_path, *, drop: tuple[str, ...] = ()):
    """bs2: base's builds at 100 and 120 ms (rounds ±2.5 % and ±3.4 %), new's at 128 and 132;
    bs4, one build a side at 50 ms: base's rounds interval w = 0.88, new's blank (one round)."""
    base = batch([{"e2e_ms": 100.0, "e2e_ms_ci_pct": 2.5}, {"e2e_ms": 120.0, "e2e_ms_ci_pct": 3.4}])
    new = batch([{"e2e_ms": 128.0, "e2e_ms_ci_pct": 1.7}, {"e2e_ms": 132.0, "e2e_ms_ci_pct": 1.2}])
    base += batch([{"e2e_ms": 50.0, "e2e_ms_ci_pct": 88.0}], batch_size=4)
    new += batch([{"e2e_ms": 50.0, "e2e_ms_ci_pct": None}], batch_size=4)
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


def ends(cell: str) -> tuple[float, float]:
    low, high = re.fullmatch(r"\[(\S+), (\S+)\]", cell).groups()
    return float(low), float(high)


def t_interval(values: list[float]) -> tuple[float, float]:
    """docs/metrics.md#intervals's construction on ``values``: exp(m) / (1 + w) .. exp(m) · (1 + w)."""
    logs = np.log(values)
    w = math.expm1(stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs)))
    return math.exp(logs.mean()) / (1 + w), math.exp(logs.mean()) * (1 + w)


def test_a_side_of_several_builds_shows_the_interval_over_its_builds(tmp_path, capsys):
    base, new = sides(tmp_path)
    cli.main(["compare", base, new])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("case "))
    assert re.split(r"\s{2,}", header.strip())[2:6] == ["base", "95% CI", "new", "95% CI"]
    figure, interval, *_ = line_of(out, " bs2 ", "e2e_ms")[2:]
    assert figure == "110.00" and interval == "[34.40, 348.85]"  # t with 1 df: 12.7 standard errors
    low, high = ends(interval)
    assert (low, high) == tuple(round(v, 2) for v in t_interval([100.0, 120.0]))
    # Not the builds' rounds (±3.4 %): it holds both builds and their geometric mean, and is wide.
    assert low < 100.0 < math.sqrt(100.0 * 120.0) < 120.0 < high and high / low > 10
    assert line_of(out, " bs2 ", "e2e_ms")[4:6] == ["130.00", "[106.90, 158.05]"]
    # Metrics with no interval column show none.
    assert line_of(out, " bs2 ", "prefill_ms")[2:5] == ["1.50", "1.50", "1.000"]
    assert "±" not in out and "nan" not in out.lower()
    assert "smallest change flagged at this noise" in out, "the minimum detectable change is still stated"
    cli.main(["compare", base, new, "--format", "markdown"])
    markdown = capsys.readouterr().out
    assert "| base | 95% CI | new | 95% CI | ratio |" in markdown
    assert "| 110.00 | [34.40, 348.85] | 130.00 | [106.90, 158.05] | 1.187 |" in markdown


def test_a_side_of_one_build_shows_its_rounds_interval_with_its_true_low_end(tmp_path, capsys):
    base, new = sides(tmp_path)
    cli.main(["compare", base, new])
    # w = 0.88: 50 / 1.88 and 50 · 1.88, not 50 · (1 - 0.88); new's build has none (one round): blank.
    assert line_of(capsys.readouterr().out, " bs4 ", "e2e_ms")[2:6] == ["50.00", "[26.60, 94.00]", "50.00", "1.000"]


def test_pooled_runs_show_the_interval_over_the_runs_means(tmp_path, capsys):
    base, new = sides(tmp_path)
    second = tmp_path / "base2.csv"
    rows = pd.read_csv(base)
    rows.assign(run_id="run-2", e2e_ms=rows["e2e_ms"] * 1.03).to_csv(second, index=False)
    cli.main(["compare", f"{base},{second}", new])
    # Each run's geometric mean is one draw (drift between runs is noise), as the test counts them.
    means = [math.sqrt(100.0 * 120.0), math.sqrt(103.0 * 123.6)]
    expected = "[{:.2f}, {:.2f}]".format(*t_interval(means))
    assert line_of(capsys.readouterr().out, " bs2 ", "e2e_ms")[3] == expected == "[92.14, 134.14]"


def test_files_without_the_columns_show_no_interval_and_the_old_table(tmp_path, capsys):
    base, new = sides(tmp_path, drop=(*CI, *EDGE))
    assert cli.main(["compare", base, new]) in (0, 1)
    out = capsys.readouterr().out
    assert "[" not in out and "nan" not in out.lower()
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
    assert "<th>base</th><th>95% CI</th><th>new</th><th>95% CI</th>" in page
    assert "<td>110.00</td><td>[34.40, 348.85]</td><td>130.00</td><td>[106.90, 158.05]</td>" in page
    assert "<td>50.00</td><td>[26.60, 94.00]</td><td>50.00</td><td></td>" in page
