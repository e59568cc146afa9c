"""The end of a benchmark session (``--bench-report``, ``--bench-compare``) through pytester,
on a finished run's result file: no engine, the plugin's state given the run's writer."""

from __future__ import annotations

import shutil
import sqlite3

import pandas as pd
import pytest

from tests.helpers import ROOT

DATA = ROOT / "tests" / "data" / "default-run.csv"
DATA2 = ROOT / "tests" / "data" / "default-run-2.csv"

# The run's writer as the plugin leaves it after the cases, set before the session ends.
CONFTEST = """
from pathlib import Path
from types import SimpleNamespace

from lorabench.pytest_plugin.session import STATE


def pytest_sessionstart(session):
    results = Path({results!r})
    session.config.stash[STATE].writer = SimpleNamespace(
        path=results, samples_path=results.with_suffix(".samples.csv"), rows=[], by_rank=None,
        log_dir=results.parent / "no-logs",
    )
"""


@pytest.fixture
def finished_run(pytester, tmp_path):
    results = tmp_path / "run.csv"
    shutil.copy(DATA, results)
    pytester.makeconftest(CONFTEST.format(results=str(results)))
    pytester.makepyfile("def test_plain(): pass")
    return results


def test_a_report_that_cannot_be_written_is_one_line_and_the_comparison_still_runs(pytester, finished_run, tmp_path):
    taken = tmp_path / "report"
    taken.write_text("a file where the report's folder should go")
    result = pytester.runpytest(
        "--bench-report", str(taken), "--bench-compare", str(DATA2), "--bench-compare-fail", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(
        [
            "*= lorabench compare =*",
            "*cases compared; of their * metrics 0 regressed, 0 improved*",
            "*= lorabench report =*",
            f"report not written to {taken}: FileExistsError: *; the results are in {finished_run}",
        ]
    )


def test_a_failed_report_does_not_let_a_regression_through(pytester, finished_run, tmp_path):
    """The gate still fails the session on a regression when the page could not be drawn:
    the base is the same run with every latency halved."""
    taken = tmp_path / "report"
    taken.write_text("")
    base = pd.read_csv(DATA)
    for column in [c for c in base.columns if c.startswith(("ttft_ms", "prefill_ms", "decode_ms", "e2e_ms"))]:
        base[column] /= 2
    base["output_tokens_per_s"] *= 2
    base.to_csv(tmp_path / "fast.csv", index=False)
    result = pytester.runpytest(
        "--bench-report",
        str(taken),
        "--bench-compare",
        str(tmp_path / "fast.csv"),
        "--bench-compare-fail",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*the session fails (--bench-compare-fail)", f"report not written to {taken}: *"])


def test_the_sessions_run_goes_into_the_history_once_and_a_store_that_refuses_it_is_one_line(pytester, tmp_path):
    """A fixed output file holds an earlier run too: only this session's is added."""
    results, db = tmp_path / "fixed.csv", tmp_path / "history.db"
    pd.concat([pd.read_csv(DATA), pd.read_csv(DATA2)]).to_csv(results, index=False)
    ours = pd.read_csv(DATA2)["run_id"].iloc[0]
    conftest = (
        CONFTEST.format(results=str(results)) + f"    session.config.stash[STATE].provenance = {{'run_id': {ours!r}}}\n"
    )
    pytester.makeconftest(conftest)
    pytester.makepyfile("def test_plain(): pass")
    for said in ("added: run", "already stored: run"):
        result = pytester.runpytest("--bench-history", str(db), "-p", "no:cacheprovider")
        assert result.ret == pytest.ExitCode.OK, result.stdout.str()
        result.stdout.fnmatch_lines(["*= lorabench history =*", f"{said} {ours} to {db}"])
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT run_id FROM runs").fetchall() == [(ours,)]
    not_a_db = tmp_path / "not.db"
    not_a_db.write_text("not a database")
    result = pytester.runpytest("--bench-history", str(not_a_db), "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK and "INTERNALERROR" not in result.stdout.str()
    result.stdout.fnmatch_lines([f"not added to {not_a_db}: *not a lorabench history database*; the run stays in its*"])
