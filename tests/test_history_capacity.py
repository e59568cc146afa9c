"""Capacity searches in the history: how their rows become points of a series. A build whose
search collapsed (fell below its range) must not drop out of its run's median in silence,
and a capacity capped at max_rate is stored as the bound it is (docs/history.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lorabench.analysis.cases import case_of
from lorabench.analysis.history.runs import CAPPED_AT, read_runs
from lorabench.cli.main import main
from tests.test_history import check, write_runs


def capacity_runs(folder, count: int, stop_of) -> list:
    """``count`` runs of write_runs' two cases (bs2, bs8) with two builds each, turned into
    capacity searches that bracketed 4 req/s (2 % noise); ``stop_of(run, batch_size, build)``
    gives another row's stop: ``below min_rate`` (failed at 0.5, passed none) or ``above
    max_rate`` (passed everything up to 8)."""
    paths = write_runs(folder, count, seed=3)
    for i, path in enumerate(paths):
        rows = pd.read_csv(path)
        stops = [stop_of(i, b, build) for b, build in zip(rows["batch_size"], rows["build"])]
        noise = np.random.default_rng(i).normal(1, 0.02, len(rows))
        rows["search_stop"] = [s or "bracketed" for s in stops]
        rows["capacity_rps"] = [None if s == "below min_rate" else 8.0 if s else 4.0 * n for s, n in zip(stops, noise)]
        rows["capacity_over_rps"] = [0.5 if s == "below min_rate" else None if s else 4.4 for s in stops]
        rows["capacity_max_rate"] = 8.0
        rows.to_csv(path, index=False)
    return paths


def test_one_build_of_two_that_collapses_fails_the_gate_the_night_it_does(tmp_path, capsys):
    """The newest run's bs2 case: build 0 bracketed as every night, build 1 fell below its
    range. Dropping build 1 left the run's median at build 0's 4 req/s: nothing to see, exit 0."""

    def stop_of(run, batch_size, build):
        return "below min_rate" if (run, batch_size, build) == (7, 2, 1) else None

    paths = capacity_runs(tmp_path, 8, stop_of)
    db = tmp_path / "h.db"
    assert main(["history", "add", "--db", str(db), *map(str, paths)]) == 0
    capsys.readouterr()
    assert check(db, "--metric", "capacity_rps", "--metric", "ttft_ms") == 1
    out = capsys.readouterr().out
    blank = [line for line in out.splitlines() if line.startswith("NOT MEASURED")]
    assert len(blank) == 1 and " bs2 " in blank[0] and " capacity_rps: " in blank[0], out
    assert "newest run run-007" in blank[0]
    assert main(["history", "show", "--db", str(db), "-k", "bs2", "--metric", "capacity_rps"]) == 0
    assert "(7 runs;" in capsys.readouterr().out  # the collapsed night is no point at build 0's rate
    assert main(["history", "show", "--db", str(db), "-k", "bs8", "--metric", "capacity_rps"]) == 0
    assert "(8 runs;" in capsys.readouterr().out  # a case whose builds held keeps its point


def test_a_collapsed_build_blanks_its_cases_capacity_in_that_run_only(tmp_path):
    def stop_of(run, batch_size, build):
        return "below min_rate" if (run, batch_size, build) == (1, 8, 0) else None

    first, second = (read_runs(path)[0] for path in capacity_runs(tmp_path, 2, stop_of))
    assert all("capacity_rps" in metrics for _, _, _, metrics in first.rows)
    kept = {(case_of(key)["batch_size"], build): "capacity_rps" in m for key, _, build, m in second.rows}
    assert kept == {("2", 0): True, ("2", 1): True, ("8", 0): False, ("8", 1): False}, kept
    assert all("ttft_ms" in metrics for _, _, _, metrics in second.rows)  # its other figures stay


def test_a_capacity_capped_at_max_rate_is_stored_with_its_cap_as_a_bound(tmp_path):
    """A search that passed every rate up to max_rate found at least that: the row says so
    beside the point, so that the series can tell a bound from a measurement."""

    def stop_of(run, batch_size, build):
        return "above max_rate" if build == 1 else None

    (run,) = read_runs(capacity_runs(tmp_path, 1, stop_of)[0])
    by_build = {build: metrics for _, _, build, metrics in run.rows}
    assert by_build[1]["capacity_rps"] == 8.0 and by_build[1][CAPPED_AT] == 8.0
    assert CAPPED_AT not in by_build[0] and 3.5 < by_build[0]["capacity_rps"] < 4.5


def test_a_lowered_max_rate_is_not_comparable_and_a_measured_fall_from_a_cap_fails(tmp_path, capsys):
    """Six nights capped at max_rate 20, then four capped at 8 (the config's cap lowered): at
    least 8 is no 60 % regression; four nights measured at 8 after the cap of 20 are one."""
    for name, last_stop in (("lowered", "above max_rate"), ("fell", "bracketed")):
        folder = tmp_path / name
        folder.mkdir()
        paths = write_runs(folder, 10, seed=3)
        for i, path in enumerate(paths):
            rows = pd.read_csv(path)
            cap = 20.0 if i < 6 else 8.0
            noise = np.random.default_rng(i).normal(1, 0.01, len(rows))
            rows["search_stop"] = "above max_rate" if i < 6 else last_stop
            rows["capacity_rps"] = [cap if i < 6 or last_stop != "bracketed" else cap * n for n in noise]
            rows["capacity_over_rps"] = None if i < 6 or last_stop != "bracketed" else 9.0
            rows["capacity_max_rate"] = cap if i < 6 else 20.0 if last_stop == "bracketed" else 8.0
            rows.to_csv(path, index=False)
        db = folder / "h.db"
        main(["history", "add", "--db", str(db), *map(str, paths)])
        capsys.readouterr()
        status = check(db, "--metric", "capacity_rps")
        out = capsys.readouterr().out
        if name == "lowered":
            assert status == 0 and "REGRESSION" not in out and out.count("NOT COMPARABLE") == 2, out
            assert "raise capacity.max_rate past it" in out
        else:
            assert status == 1 and out.count("REGRESSION") == 2, out
