"""lorabench history: the store keeps each run once, two writers lose nothing, and a step
planted in a series comes out as a change point at its run, with the stacks either side."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from lorabench.analysis.history.changes import change_points
from lorabench.cli.main import main
from tests.helpers import ROOT, make_row

CASES = ({"batch_size": 2}, {"batch_size": 8})


def write_runs(folder, count, *, step_at=None, factor=1.2, seed=0):
    """``count`` runs of two cases with two builds each; from run ``step_at`` on, vLLM is
    0.33.0 and ttft_ms is ``factor`` times higher. Noise: 2 % CV."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        stepped = step_at is not None and i >= step_at
        rows = [
            asdict(
                make_row(
                    run_id=f"run-{i:03d}",
                    timestamp=f"2026-11-{1 + i // 24:02d}T{i % 24:02d}:00:00Z",
                    vllm_version="0.33.0" if stepped else "0.32.0",
                    build=build,
                    engine_id=f"loras2-rank16-cpu4-build{build}",
                    ttft_ms=10.0 * (factor if stepped else 1.0) * rng.normal(1, 0.02),
                    **case,
                )
            )
            for case in CASES
            for build in (0, 1)
        ]
        paths.append(folder / f"run{i:03d}.csv")
        pd.DataFrame(rows).to_csv(paths[-1], index=False)
    return paths


def test_a_run_added_twice_is_stored_once(tmp_path, capsys):
    db = tmp_path / "h.db"
    paths = write_runs(tmp_path, 3)
    assert main(["history", "add", "--db", str(db), *map(str, paths)]) == 0
    assert capsys.readouterr().out.count("added: run") == 3
    assert main(["history", "add", "--db", str(db), str(paths[1])]) == 0
    assert "already stored: run run-001" in capsys.readouterr().out
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (3,)
        assert conn.execute("SELECT count(*) FROM rows").fetchone() == (3 * 4,)


def test_two_writers_at_once_lose_nothing(tmp_path):
    db = tmp_path / "h.db"
    paths = write_runs(tmp_path, 16)
    command = [sys.executable, "-m", "lorabench", "history", "add", "--db", str(db)]
    writers = [subprocess.Popen([*command, *map(str, paths[i::2])], cwd=ROOT) for i in (0, 1)]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (16,)
        assert conn.execute("SELECT count(*) FROM rows").fetchone() == (16 * 4,)


def test_a_planted_step_is_a_change_point_at_its_run_with_the_stacks_either_side(tmp_path, capsys):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 12, step_at=7))])
    capsys.readouterr()
    assert main(["history", "show", "--db", str(db), "-k", "bs2", "--metric", "ttft_ms", "--metric", "decode_ms"]) == 0
    out = capsys.readouterr().out
    assert out.count("(12 runs;") == 2, out  # one case, two metrics; builds are not points
    changes = [line for line in out.splitlines() if "change at run" in line]
    assert len(changes) == 1 and "change at run 7:" in changes[0], out
    assert "+20." in changes[0] or "+19." in changes[0] or "+21." in changes[0], changes[0]


def test_no_step_no_change_point(tmp_path, capsys):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 12))])
    assert main(["history", "show", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "change at run" not in out and out.count("(12 runs;") == 2 * 3


def test_change_points_locate_each_of_two_steps_and_report_the_medians():
    rng = np.random.default_rng(3)
    points = np.r_[rng.normal(100, 1, 15), rng.normal(110, 1, 15), rng.normal(95, 1, 15)]
    found = change_points(points)
    assert [c.position for c in found] == [15, 30]
    assert found[0].before == pytest.approx(100, abs=1) and found[0].after == pytest.approx(110, abs=1)
    assert found[1].after == pytest.approx(95, abs=1) and all(c.p_value <= 0.01 for c in found)


def test_an_order_file_reorders_the_runs_by_stack(tmp_path, capsys):
    db = tmp_path / "h.db"
    # Built out of order: the slow 0.33.0 runs carry the earlier times.
    paths = write_runs(tmp_path, 12, step_at=6)
    for path in paths:
        rows = pd.read_csv(path)
        hour = int(rows.loc[0, "run_id"][-3:])
        rows["timestamp"] = f"2026-11-01T{(hour + 6) % 12:02d}:00:00Z"
        rows.to_csv(path, index=False)
    main(["history", "add", "--db", str(db), *map(str, paths)])
    stacks = {}
    for line in capsys.readouterr().out.splitlines():
        run, stack = line.split("run ")[1].split(" (stack ")
        stacks[run] = stack.split(",")[0]
    order = tmp_path / "order.txt"
    order.write_text(f"{stacks['run-000']} vllm 0.32.0\n{stacks['run-011']} vllm 0.33.0\n")
    show = ["history", "show", "--db", str(db), "-k", "bs8", "--metric", "ttft_ms"]
    assert main(show) == 0
    by_time = capsys.readouterr().out
    assert main([*show, "--order", str(order)]) == 0
    by_order = capsys.readouterr().out
    assert "change at run 6:" in by_time and "-1" in by_time.split("change at run 6:")[1][:30]
    assert "change at run 6:" in by_order and "+" in by_order.split("change at run 6:")[1].split("(")[1][:2]


@pytest.mark.parametrize(
    "args, says",
    [
        (["show", "--db", "{tmp}/missing.db"], "no such history database"),
        (["add", "--db", "{tmp}/h.db", "{tmp}/nothing.csv"], "no such file"),
        (["add", "--db", "{tmp}/h.db", "{tmp}/other.csv"], "not a lorabench result file"),
        (["show", "--db", "{tmp}/h.db", "--metric", "speed"], "--metric speed: not a compared column"),
        (["show", "--db", "{tmp}/h.db", "-k", "bs2 and ("], "-k 'bs2 and ('"),
        (["show", "--db", "{tmp}/h.db", "--order", "{tmp}/order.txt"], "does not list stack"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    write_runs(tmp_path, 1)
    main(["history", "add", "--db", str(tmp_path / "h.db"), str(tmp_path / "run000.csv")])
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "order.txt").write_text("0123456789ab\n")
    capsys.readouterr()
    assert main(["history", *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def check(db, *args):
    return main(["history", "check", "--db", str(db), *args])


def test_the_gate_fails_on_a_regression_naming_its_run_and_what_changed_in_the_stack(tmp_path, capsys):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 12, step_at=7))])
    capsys.readouterr()
    assert check(db) == 1
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("REGRESSION")]
    assert len(failed) == 2 and all(" ttft_ms: " in line for line in failed), out  # both cases, ttft only
    assert all("from run run-007:" in line and "(vllm_version 0.32.0 -> 0.33.0)" in line for line in failed), out
    assert "history check: 2 regressed beyond 5%" in out


@pytest.mark.parametrize(
    "factor, args, status",
    [
        (1.0, [], 0),  # no step
        (0.8, [], 0),  # 20 % faster: a change point, not a regression
        (1.04, [], 0),  # 4 % slower: below the default 5 %
        (1.04, ["--threshold", "ttft_ms=3%"], 1),  # ... above a 3 % set for ttft_ms
    ],
)
def test_the_gate_passes_what_is_not_a_regression_beyond_its_threshold(tmp_path, capsys, factor, args, status):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 16, step_at=8, factor=factor, seed=5))])
    assert check(db, "--metric", "ttft_ms", *args) == status, capsys.readouterr().out
