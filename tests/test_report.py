"""lorabench report: a page of figures from result files, drawn only for what they hold."""

import pandas as pd
import pytest

from lorabench.cli import main as cli
from lorabench.results.progress import RunProgress, trace_reporter
from tests.helpers import ROOT

DATA = ROOT / "tests" / "data"
BATCH_FIGURES = {"latency.png", "memory.png"}


def pngs(folder):
    return {p.name for p in folder.glob("*.png")}


def test_a_real_run_gives_its_figures_and_only_those(tmp_path):
    """default-run.csv: batch and online rows of an older version (no residency, sweep or
    overhead), kept without its samples file: the online figures, drawn from samples, stay out.
    A report of a fresh real run with samples is checked in test_plugin.py."""
    out = tmp_path / "report"
    assert cli.main(["report", str(DATA / "default-run.csv"), "--out", str(out)]) == 0
    assert pngs(out) == BATCH_FIGURES
    page = (out / "index.html").read_text()
    assert all(f'src="{name}"' in page for name in pngs(out))
    assert "<th>e905ef9a</th>" in page, "the runs' provenance table is headed by the commit"
    assert "<th>vllm_version</th>" in page


def test_two_runs_side_by_side_and_the_same_input_gives_the_same_files(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    args = ["report", str(DATA / "default-run.csv"), str(DATA / "default-run-2.csv")]
    assert cli.main([*args, "--out", str(first)]) == 0
    assert cli.main([*args, "--out", str(second)]) == 0
    for name in pngs(first):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    page = (first / "index.html").read_text()
    assert "e905ef9a #1" in page and "e905ef9a #2" in page, "runs of one commit are told apart"
    # 12 batch and 2 online cases, 4 builds each: cases, not rows.
    assert "<tr><th>cases</th><td>14</td><td>14</td></tr>" in page


def test_residency_sweep_and_overhead_panels_appear_with_their_rows(tmp_path):
    rows = pd.read_csv(DATA / "default-run.csv")
    batch = rows[rows.scenario == "multilora"].assign(lora_overhead=1.5)
    residency = batch.head(3).assign(scenario="residency", tier=["slot", "cpu", "disk"], batch_size=1)
    sweep = batch.head(2).assign(scenario="working_set", working_set=[1, 16], load_share=[0.0, 1.0])
    path = tmp_path / "run.csv"
    pd.concat([batch, residency, sweep]).to_csv(path, index=False)
    out = tmp_path / "report"
    assert cli.main(["report", str(path), "--out", str(out)]) == 0
    assert pngs(out) == BATCH_FIGURES | {"lora_overhead.png", "residency.png", "working_set.png"}


@pytest.mark.parametrize("content", [None, "a,b\n1,2\n", "not,a\ncsv"])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, content):
    path = tmp_path / "in.csv"
    if content is not None:
        path.write_text(content)
    assert cli.main(["report", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lorabench report: ") and err.count("\n") == 1 and "Traceback" not in err


def test_progress_lines():
    lines = []
    report = trace_reporter(lines.append, "skew-n8", 8.0, 40)
    for i in range(1, 41):
        report(i, i - 2, i * 0.2)
    report(40, 30, None)
    assert len(lines) == 10 and lines[0].startswith("trace skew-n8: 10% (0.8 of 8 s): 4/40 sent, 2 finished")
    assert lines[-1] == "trace skew-n8: all 40 requests sent, 30 finished; waiting for the rest"
    progress = RunProgress(builds=4, cases=72, trace_s=32.0)
    assert progress.first_guess().startswith("lorabench: 4 engine builds, 72 cases, 32 s of replays: about 8 min")
    assert progress.build_done().startswith("lorabench: 1 of 4 engine builds done")
    # Against a server at a URL nothing is built: the guess counts connections, not start-ups.
    at_url = RunProgress(builds=4, cases=72, trace_s=32.0, at_url=True)
    assert at_url.first_guess().startswith("lorabench: 4 connections, 72 cases, 32 s of replays: about 6 min 40 s")
    assert at_url.build_done().startswith("lorabench: 1 of 4 connections done")
