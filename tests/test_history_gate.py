"""The nightly gate's verdicts that users act on: a fresh step said every night until it is
confirmed, the change that made it named with its share, what can be acknowledged
(``history accept``), a store that stopped growing, and stores of an older layout."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from lorabench.analysis.cases import KEY_SEP, MATCH_KEY
from lorabench.analysis.history.changes import change_points
from lorabench.analysis.history.gate import regressions, watch
from lorabench.analysis.history.render import regression_line
from lorabench.analysis.history.series import Series
from lorabench.analysis.history.store import StoredRun
from lorabench.cli.main import main
from tests.test_history import check, write_runs


def _series(points, versions, name="multilora x", metric="decode_ms") -> Series:
    runs = [StoredRun(f"r{i:02d}", f"t{i:03d}", f"s{v}", {"vllm_version": v}) for i, v in enumerate(versions)]
    return Series(name, metric, runs, [np.array([p]) for p in points], change_points(np.array(points)))


def test_the_regression_names_each_step_that_made_it_with_its_share():
    """100 on 0.31, 103 on 0.32, 115 on 0.33 (1 % noise): 0.33 made it 12 % worse, and is named."""
    rng = np.random.default_rng(1)
    levels = [(100, "0.31"), (103, "0.32"), (115, "0.33")]
    points = [v * rng.normal(1, 0.01) for v, _ in levels for _ in range(10)]
    s = _series(points, [version for _, version in levels for _ in range(10)])
    (found,) = regressions([s], 0.05, {})
    line = regression_line(found, 1)
    assert "in 2 steps:" in line, line
    first, second = line.split("in 2 steps: ")[1].split("; ")
    assert "since run r10" in first and "vllm_version 0.31 -> 0.32" in first, line
    assert "since run r20" in second and "vllm_version 0.32 -> 0.33" in second, line
    assert 1 < float(first.split(" %")[0]) < 5 and abs(float(second.split(" %")[0]) - 11.7) < 1.5, line


def _family(nights_after: int, seed: int, series: int = 50, step: float = 0.10, noise: float = 0.03):
    """``series`` series of 27 nights at ``noise``, then ``nights_after`` nights; one in ten
    (case 0, case 10, ...) takes a ``step``."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(series):
        points = rng.lognormal(0, noise, 27 + nights_after) * 10
        if k % 10 == 0:
            points[27:] *= 1 + step
        out.append(_series(points, ["0.32"] * 27 + ["0.33"] * nights_after, name=f"case {k}"))
    return out


def test_a_fresh_step_is_said_every_night_until_it_fails_and_noise_alone_is_not():
    """A 10 % step at 3 % noise in 5 of 50 series: each named (WATCH or REGRESSION) from its
    first night in nearly every trial, and failing by its third; no other series fails.
    (scripts/bench_gate_power.py measures this at scale: docs/lab.)"""
    stepped = {f"case {k}" for k in range(0, 50, 10)}
    named, failed_by_3, false = 0, 0, 0
    trials = 8
    for seed in range(trials):
        for night in range(1, 4):
            family = _family(night, seed)
            failed = regressions(family, 0.05, {})
            said = {r.series.case for r in [*failed, *watch(family, 0.05, {}, failed)]}
            named += len(stepped & said)
            false += sum(r.series.case not in stepped for r in failed)
            if night == 3:
                failed_by_3 += len(stepped & {r.series.case for r in failed})
    assert named >= 0.85 * 3 * trials * len(stepped), named  # night 1 alone: about 0.8 (docs/lab)
    assert failed_by_3 >= 0.6 * trials * len(stepped), failed_by_3  # night 4: about 0.9
    assert false == 0


def test_one_odd_night_is_watched_and_a_second_fails():
    rng = np.random.default_rng(3)
    base = list(rng.lognormal(0, 0.02, 12) * 10)
    odd = _series([*base, 13.0], ["a"] * 13)
    assert regressions([odd], 0.05, {}) == [] and len(watch([odd], 0.05, {}, [])) == 1
    back = _series([*base, 13.0, 10.0], ["a"] * 14)  # the night after came back: refuted
    assert regressions([back], 0.05, {}) == [] and watch([back], 0.05, {}, []) == []
    twice = _series([*base, 13.0, 13.1], ["a"] * 14)
    (found,) = regressions([twice], 0.05, {})
    assert found.nights == 2 and found.change.position == 12


def _store(tmp_path, count, **kw):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, count, **kw))])
    return db


def test_an_accepted_change_is_the_new_baseline_and_said(tmp_path, capsys):
    db = _store(tmp_path, 14, step_at=8, factor=1.5, seed=2)
    assert check(db, "--metric", "ttft_ms") == 1
    assert main(["history", "accept", "--db", str(db), "-k", "multilora", "--reason", "vLLM 0.33 trades TTFT"]) == 0
    capsys.readouterr()
    assert check(db, "--metric", "ttft_ms") == 0
    out = capsys.readouterr().out
    assert "ACCEPTED -k 'multilora' * (accepted): from run run-013 on (vLLM 0.33 trades TTFT)" in out
    assert "REGRESSION" not in out


def test_a_missing_case_fails_until_accepted_or_retired(tmp_path, capsys):
    paths = write_runs(tmp_path, 8)
    for path in paths[5:]:  # bs8 gone from run 5 on
        rows = pd.read_csv(path)
        rows[rows["batch_size"] == 2].to_csv(path, index=False)
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    assert check(db, "--metric", "ttft_ms") == 1 and "MISSING" in capsys.readouterr().out
    main(["history", "accept", "--db", str(db), "-k", "bs8", "--reason", "a new baseline"])
    capsys.readouterr()
    assert check(db, "--metric", "ttft_ms") == 1, "accepting a level retires nothing"
    assert "MISSING multilora loras2-rank16-cpu4 bs8" in capsys.readouterr().out
    main(["history", "accept", "--db", str(db), "-k", "bs8", "--retire", "--reason", "bs8 dropped from the matrix"])
    capsys.readouterr()
    assert check(db, "--metric", "ttft_ms") == 0
    assert "RETIRED multilora loras2-rank16-cpu4 bs8 in16 out4: retired at run run-007" in capsys.readouterr().out


def test_a_case_missing_for_14_runs_is_retired_not_failed_forever(tmp_path, capsys):
    paths = write_runs(tmp_path, 20)
    for path in paths[5:]:
        rows = pd.read_csv(path)
        rows[rows["batch_size"] == 2].to_csv(path, index=False)
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    capsys.readouterr()
    assert check(db, "--metric", "ttft_ms") == 0
    assert "RETIRED multilora loras2-rank16-cpu4 bs8 in16 out4: missing from its machine's newest 15 runs" in (
        capsys.readouterr().out
    )


def _dated(tmp_path, hours_ago: float):
    paths = write_runs(tmp_path, 8)
    newest = datetime.now(timezone.utc) - timedelta(hours=hours_ago)
    for i, path in enumerate(paths):
        when = newest - timedelta(days=len(paths) - 1 - i)
        pd.read_csv(path).assign(timestamp=when.strftime("%Y-%m-%dT%H:%M:%SZ")).to_csv(path, index=False)
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    return db


@pytest.mark.parametrize(("hours_ago", "args", "status"), [(2, [], 0), (48, [], 1), (48, ["--max-age", "3d"], 0)])
def test_a_store_the_nightly_stopped_adding_to_fails(tmp_path, capsys, hours_ago, args, status):
    db = _dated(tmp_path, hours_ago)
    capsys.readouterr()
    assert main(["history", "check", "--db", str(db), "--metric", "ttft_ms", *args]) == status
    out = capsys.readouterr().out
    assert f"newest run: run-007, {hours_ago - 0.1:.0f}" in out or f"{hours_ago:.1f} hours old" in out, out
    assert ("STALE STORE" in out) == bool(status), out


def test_a_bad_max_age_is_one_line(tmp_path, capsys):
    db = _dated(tmp_path, 1)
    assert main(["history", "check", "--db", str(db), "--max-age", "soon"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def _rekey(db, columns):
    """The store as a lorabench whose case keys held ``columns`` would have written it."""
    with sqlite3.connect(db) as conn:
        for (key,) in conn.execute("SELECT DISTINCT case_key FROM rows").fetchall():
            values = dict(zip(MATCH_KEY, key.split(KEY_SEP)))
            conn.execute(
                "UPDATE rows SET case_key = ? WHERE case_key = ?", (KEY_SEP.join(values[c] for c in columns), key)
            )
        return conn


def test_a_store_whose_keys_held_fewer_columns_is_migrated_by_name(tmp_path, capsys):
    db = _store(tmp_path, 10, step_at=6, factor=1.5)
    gone = MATCH_KEY[3]
    conn = _rekey(db, [c for c in MATCH_KEY if c != gone])
    conn.execute(
        "UPDATE meta SET value = ? WHERE name = 'key_columns'",
        (str([c for c in MATCH_KEY if c != gone]).replace("'", '"'),),
    )
    conn.commit()
    conn.close()
    capsys.readouterr()
    assert check(db, "--metric", "ttft_ms") == 1  # read, not a KeyError's traceback
    assert capsys.readouterr().out.count("REGRESSION") == 2


def test_a_store_that_never_said_its_key_columns_and_differs_is_one_line(tmp_path, capsys):
    db = _store(tmp_path, 6)
    conn = _rekey(db, MATCH_KEY[:-2])
    conn.execute("DROP TABLE meta")
    conn.execute("PRAGMA user_version = 0")
    conn.commit()
    conn.close()
    capsys.readouterr()
    assert check(db) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not say which: add the runs' result files to a new store" in err


def test_a_damaged_store_is_one_line(tmp_path, capsys):
    db = _store(tmp_path, 6)
    data = bytearray(db.read_bytes())
    data[100:4000] = b"\xff" * 3900
    db.write_bytes(bytes(data))
    capsys.readouterr()
    assert check(db) == 2
    assert capsys.readouterr().err.count("\n") == 1
