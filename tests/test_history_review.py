"""What a reviewer's inputs showed the gate getting wrong, each held here: a fresh step blamed
on a run off it, a measured fall hidden behind a capped build, an acceptance that hid more than
it said, a migration that split cases, a newer store merged, and a page that disagreed."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pandas as pd

from lorabench.analysis.cases import KEY_SEP, MATCH_KEY
from lorabench.analysis.history.gate import regressions
from lorabench.analysis.history.render import regression_line
from lorabench.cli.main import main
from tests.test_history import check, write_runs
from tests.test_history_gate import _series


def test_a_fresh_step_with_its_change_point_is_named_at_it_not_a_run_off_it():
    """20 nights at 1 % noise, then 3 nights 8 % slower on a new vLLM: the block must start at
    the change point, and name the upgrade (it started a night early and said 'the same stack')."""
    rng = np.random.default_rng(0)
    points = [10 * rng.normal(1, 0.01) for _ in range(20)] + [10.8 * rng.normal(1, 0.01) for _ in range(3)]
    s = _series(points, ["0.32"] * 20 + ["0.33"] * 3)
    (found,) = regressions([s], 0.05, {})
    line = regression_line(found, 1)
    assert "vllm_version 0.32 -> 0.33" in line and "since run r20" in line, line


def _capacity(folder, nights, late):
    """Capacity searches bracketing 10 req/s for 8 nights, then ``late(rows, noise)``."""
    paths = write_runs(folder, nights, seed=3)
    for i, path in enumerate(paths):
        rows = pd.read_csv(path)
        noise = np.random.default_rng(i).normal(1, 0.01, len(rows))
        rows["search_stop"], rows["capacity_rps"], rows["capacity_over_rps"] = "bracketed", 10.0 * noise, 11.0
        rows["capacity_max_rate"] = 20.0
        (late(rows, noise) if i >= 8 else rows).to_csv(path, index=False)
    db = folder / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    return db


def test_a_build_that_measured_a_fall_beside_a_capped_one_is_a_regression(tmp_path, capsys):
    def late(rows, noise):
        measured = rows["build"] == 1  # build 0 capped at a lowered max_rate 8, build 1 measured 5
        rows["search_stop"] = np.where(measured, "bracketed", "above max_rate")
        rows["capacity_rps"] = np.where(measured, 5.0 * noise, 8.0)
        return rows.assign(capacity_max_rate=8.0)

    db = _capacity(tmp_path, 11, late)
    capsys.readouterr()
    assert check(db, "--metric", "capacity_rps") == 1
    out = capsys.readouterr().out
    assert out.count("REGRESSION") == 2 and "NOT COMPARABLE" not in out, out


def test_an_acceptance_keeps_a_capped_runs_bound_and_hides_no_blank(tmp_path, capsys):
    db = _capacity(tmp_path, 11, lambda rows, _: rows.assign(search_stop="above max_rate", capacity_rps=8.0))
    main(["history", "accept", "--db", str(db), "-k", "bs2", "--metric", "ttft_ms", "--reason", "r"])
    capsys.readouterr()
    assert check(db, "--metric", "capacity_rps") == 0
    assert capsys.readouterr().out.count("NOT COMPARABLE") == 2
    (tmp_path / "c").mkdir()
    collapsed = _capacity(tmp_path / "c", 11, lambda rows, _: rows.assign(search_stop="below min_rate"))
    main(["history", "accept", "--db", str(collapsed), "-k", "multilora", "--reason", "vLLM 0.33 trades TTFT"])
    capsys.readouterr()
    assert check(collapsed, "--metric", "capacity_rps") == 1  # a collapse since is still missing tonight
    assert capsys.readouterr().out.count("MISSING") == 2


def test_accept_says_what_it_matched_and_refuses_what_matches_nothing(tmp_path, capsys):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 6))])
    capsys.readouterr()
    assert main(["history", "accept", "--db", str(db), "-k", "bs2", "--reason", "r"]) == 0
    assert "accepted: 1 case(s) from run run-005 on (r): multilora loras2-rank16-cpu4 bs2" in capsys.readouterr().out
    for args in (["-k", "bs8 and ("], ["-k", "bs64"], ["-k", "bs2", "--metric", "ttfft_ms"]):
        assert main(["history", "accept", "--db", str(db), *args, "--reason", "r"]) == 2, args
        assert capsys.readouterr().err.count("\n") == 1
    assert check(db, "--metric", "ttft_ms") == 0  # nothing bad was kept


def _rekeyed(db, columns):
    conn = sqlite3.connect(db)
    for (key,) in conn.execute("SELECT DISTINCT case_key FROM rows").fetchall():
        values = dict(zip(MATCH_KEY, key.split(KEY_SEP)))
        new = KEY_SEP.join(values.get(c, "x") for c in columns)
        conn.execute("UPDATE rows SET case_key = ? WHERE case_key = ?", (new, key))
    conn.execute("UPDATE meta SET value = ? WHERE name = 'key_columns'", (json.dumps(columns),))
    conn.commit()
    conn.close()


def test_a_migrated_key_column_takes_the_value_files_from_before_it_are_read_with(tmp_path, capsys):
    """A store from before `target` was a key column, then runs added after the upgrade: one
    series per case, not an old one MISSING beside a new one too short to judge."""
    paths = write_runs(tmp_path, 14)
    for path in paths:
        pd.read_csv(path).assign(target="inprocess").to_csv(path, index=False)
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths[:10])])
    _rekeyed(db, [c for c in MATCH_KEY if c != "target"])
    main(["history", "add", "--db", str(db), *map(str, paths[10:])])
    capsys.readouterr()
    assert check(db, "--metric", "ttft_ms") == 0
    out = capsys.readouterr().out
    assert "MISSING" not in out and "in 2 series of the newest run (run-013);" in out, out


def test_a_store_whose_keys_hold_a_column_this_lorabench_lacks_is_refused_not_merged(tmp_path, capsys):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 6))])
    _rekeyed(db, [*MATCH_KEY, "a_newer_column"])
    capsys.readouterr()
    assert check(db) == 2
    assert "a_newer_column, which this lorabench does not know" in capsys.readouterr().err
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(DISTINCT case_key) FROM rows").fetchone() == (2,)


def test_the_pages_summary_is_the_gates(tmp_path, capsys):
    paths = write_runs(tmp_path, 8)
    rows = pd.read_csv(paths[-1])
    rows[rows["batch_size"] == 2].to_csv(paths[-1], index=False)  # bs8 crashed tonight
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    assert check(db, "--metric", "ttft_ms") == 1
    assert main(["history", "report", "--db", str(db), "--out", str(tmp_path / "p")]) == 0
    summary = (tmp_path / "p" / "index.html").read_text().split("<h2>Charts</h2>")[0]
    assert "<b>MISSING</b> multilora loras2-rank16-cpu4 bs8" in summary and "Nothing changed" not in summary
