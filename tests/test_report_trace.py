"""The report draws, for every online case, the trace it replayed (rebuilt from the case's
samples) beside its timeline; a run without online cases gets no trace figure."""

import numpy as np
import pandas as pd
import pytest

from lorabench.analysis.report import figures
from lorabench.analysis.report.runs import load_runs
from lorabench.analysis.report.trace_figures import replayed_trace
from lorabench.cli import main as cli
from lorabench.results.records import SAMPLE_COLUMNS, SAMPLE_KEY, samples_path_for
from tests.helpers import ROOT

DATA = ROOT / "tests" / "data"


def case_samples(row: pd.Series, count: int, **columns) -> list[dict]:
    """``count`` replayed requests of ``row``'s case: adapters a0, a1, a2 in turn, one every
    half second, the last unfinished (it generated 2 of its tokens)."""
    key = {c: row[c] for c in SAMPLE_KEY if c in row}
    return [
        {
            **key,
            "round": 0,
            "request": i,
            "adapter": f"a{i % 3}",
            "prompt_tokens": 16 + i,
            "output_tokens": 2 if i == count - 1 else 8 + i % 4,
            "arrival_s": 0.5 * i,
            "send_lag_ms": 0.1,
            "ttft_ms": 30.0,
            "finished": i != count - 1,
            **columns,
        }
        for i in range(count)
    ]


def write_run(tmp_path, scenarios: set[str]):
    """default-run.csv cut to two cases of each of ``scenarios``, with a samples file for them."""
    rows = pd.read_csv(DATA / "default-run.csv")
    rows = pd.concat([rows[rows.scenario == s].head(2) for s in sorted(scenarios)])
    path = tmp_path / "run.csv"
    rows.to_csv(path, index=False)
    samples = [s for _, row in rows.iterrows() for s in case_samples(row, 12)]
    pd.DataFrame(samples).reindex(columns=SAMPLE_COLUMNS).to_csv(samples_path_for(path), index=False)
    return path


def test_every_online_case_gets_the_trace_it_replayed(tmp_path):
    path, out = write_run(tmp_path, {"online", "multilora"}), tmp_path / "report"
    assert cli.main(["report", str(path), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    drawn = sorted(p.name for p in (out / "traces").glob("*.png"))
    assert drawn == ["1.png", "2.png"], "one per online case, whether or not it has a timeline"
    assert all(f'src="traces/{name}"' in page for name in drawn)
    assert not (out / "timelines").exists(), "these runs recorded no timeline"


def test_a_run_without_online_cases_gets_no_trace_figure(tmp_path):
    path, out = write_run(tmp_path, {"multilora"}), tmp_path / "report"
    assert cli.main(["report", str(path), "--out", str(out)]) == 0
    assert not (out / "traces").exists()
    assert "traces/" not in (out / "index.html").read_text()


def test_the_trace_is_rebuilt_from_the_samples():
    row = pd.Series({"trace_duration_s": 8.0})
    samples = pd.DataFrame(case_samples(row, 7)).iloc[::-1]
    data, outputs = replayed_trace(row, samples)
    assert data.arrival_s.tolist() == [0.5 * i for i in range(7)], "in arrival order"
    assert data.adapters == ["a0", "a1", "a2"] and data.adapter.tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert data.input_len.tolist() == list(range(16, 23))
    assert outputs.tolist() == [8, 9, 10, 11, 8, 9], "the unfinished request's ask is unknown: left out"
    assert data.duration_s == 8.0 and data.rate == pytest.approx(7 / 8)
    _, no_duration = replayed_trace(pd.Series(dtype=object), samples.assign(finished="True"))
    assert len(no_duration) == 7
    assert np.isclose(replayed_trace(pd.Series(dtype=object), samples)[0].duration_s, 3.0)


def test_the_latency_cdfs_draw_each_trace_apart_and_leave_out_its_warm_up(tmp_path):
    """One configuration replayed two traces (skew at 4/s, TTFT 30 ms; uniform at 8/s, 60 ms),
    each with its first 2 s a warm-up whose requests took 5 s: two curves, neither holding a
    warm-up request, as the rows' own percentiles hold none (docs/metrics.md)."""
    rows = pd.read_csv(DATA / "default-run.csv").loc[[48]]
    rows = pd.concat([rows, rows.assign(trace_suite="uniform", trace_rate=8.0)])
    path = tmp_path / "run.csv"
    rows.to_csv(path, index=False)
    samples = pd.DataFrame(
        [s for (_, row), ttft in zip(rows.iterrows(), (30.0, 60.0)) for s in case_samples(row, 12, ttft_ms=ttft)]
    ).assign(trace_warmup_s=2.0)
    samples.loc[samples["arrival_s"] < 2.0, "ttft_ms"] = 5000.0
    samples.reindex(columns=SAMPLE_COLUMNS).to_csv(samples_path_for(path), index=False)

    fig = figures.online_latency_cdfs(load_runs([path]))
    curves = {line.get_label(): line.get_xdata() for line in fig.axes[0].get_lines()}
    assert len(curves) == 2, list(curves)
    skew, uniform = (
        next(x for label, x in curves.items() if label.endswith(t)) for t in ("skew at 4.0/s", "uniform at 8.0/s")
    )
    # 12 requests a trace: 4 in the warm-up, the last unfinished.
    assert list(skew) == [30.0] * 7 and list(uniform) == [60.0] * 7
