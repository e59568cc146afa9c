"""lorabench history: the store keeps each run once, two writers lose nothing, and a step
planted in a series comes out as a change point at its run, with the stacks either side."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from lorabench.analysis.history.changes import change_points, on_scale
from lorabench.cli.main import main
from tests.helpers import ROOT, make_row

CASES = ({"batch_size": 2}, {"batch_size": 8})


def write_runs(folder, count, *, step_at=None, factor=1.2, seed=0, new_version=True):
    """``count`` runs of two cases with two builds each; from run ``step_at`` on, vLLM is
    0.33.0 (where ``new_version``) and ttft_ms is ``factor`` times higher. Noise: 2 % CV."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        stepped = step_at is not None and i >= step_at
        rows = [
            asdict(
                make_row(
                    run_id=f"run-{i:03d}",
                    timestamp=f"2026-11-{1 + i // 24:02d}T{i % 24:02d}:00:00Z",
                    vllm_version="0.33.0" if stepped and new_version else "0.32.0",
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


def test_a_results_folder_or_its_glob_adds_its_runs_and_skips_the_files_beside_them(tmp_path, capsys):
    """docs/history.md's ``history add ... results/*.csv``: the glob matches each run's
    samples and digests files too, which refused the whole command."""
    results = tmp_path / "results"
    results.mkdir()
    for path in write_runs(results, 2):
        path.with_name(f"{path.stem}.samples.csv").write_text("round,request\n0,0\n")
        write_digests(path, "d0")
    db = tmp_path / "h.db"
    assert main(["history", "add", "--db", str(db), *map(str, sorted(results.glob("*.csv")))]) == 0
    out = capsys.readouterr().out
    assert "skipped 4 samples and digests file(s)" in out and out.count("added: run ") == 2, out
    assert main(["history", "add", "--db", str(db), str(results)]) == 0
    assert capsys.readouterr().out.count("already stored: run ") == 2
    (tmp_path / "empty").mkdir()
    assert main(["history", "add", "--db", str(db), str(tmp_path / "empty")]) == 2
    assert "empty: no result files there" in capsys.readouterr().err
    samples = sorted(results.glob("*.samples.csv"))
    assert main(["history", "add", "--db", str(db), *map(str, samples)]) == 2, "only files beside result files"
    assert "no result files there" in capsys.readouterr().err


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
        (["add", "--db", "{tmp}/h.db", "{tmp}"], "other.csv: not a lorabench result file: missing columns"),
        (["add", "--db", "{tmp}/no/such/h.db", "{tmp}/run000.csv"], "no folder"),
        (["report", "--db", "{tmp}/h.db", "--out", "{tmp}/run000.csv"], "is a file: name a folder"),
        (["show", "--db", "{tmp}/h.db", "--order", "{tmp}/binary.txt"], "not a text file of stack ids"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    write_runs(tmp_path, 1)
    main(["history", "add", "--db", str(tmp_path / "h.db"), str(tmp_path / "run000.csv")])
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "order.txt").write_text("0123456789ab\n")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00\x81")
    capsys.readouterr()
    assert main(["history", *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_a_reader_changes_no_database(tmp_path, capsys):
    """history check, show and report open the store read-only: another program's database
    named by mistake is refused and left as it was."""
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (a)")
    before = other.read_bytes()
    for action in ("check", "show"):
        assert main(["history", action, "--db", str(other)]) == 2
        assert "not a lorabench history database (it has no runs, rows and digests tables)" in capsys.readouterr().err
    (run,) = write_runs(tmp_path, 1)
    assert main(["history", "add", "--db", str(other), str(run)]) == 2, "nor does a writer add its tables there"
    assert "not a lorabench history database (it holds other tables (t) and no runs)" in capsys.readouterr().err
    assert other.read_bytes() == before and not other.with_name("other.sqlite-wal").exists()


def test_a_bad_build_number_and_a_row_still_being_written(tmp_path, capsys):
    """A build that is no number, or a row without its time, is bad input naming the file; a last row cut short (its
    session still writing) is left out, and the run grows when its file is added again."""
    (path,) = write_runs(tmp_path, 1)
    rows = pd.read_csv(path)
    bad = tmp_path / "bad.csv"
    rows.assign(build="zz").to_csv(bad, index=False)
    db = tmp_path / "h.db"
    assert main(["history", "add", "--db", str(db), str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: column 'build' has bad value 'zz'" in err and len(err.strip().splitlines()) == 1, err
    rows.assign(timestamp="").to_csv(bad, index=False)  # a blank time put the run first in every series
    assert main(["history", "add", "--db", str(db), str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: column 'timestamp' has bad value '': the ISO time" in err and len(err.strip().splitlines()) == 1
    whole = path.read_text()
    path.write_text(whole[: whole.rindex(",", 0, len(whole) - 40)])  # the last row torn mid-write
    assert main(["history", "add", "--db", str(db), str(path)]) == 0
    assert main(["history", "add", "--db", str(db), str(path.with_name("whole.csv"))]) == 2  # no such file yet
    path.with_name("whole.csv").write_text(whole)
    capsys.readouterr()
    assert main(["history", "add", "--db", str(db), str(path.with_name("whole.csv"))]) == 0
    assert "grew: run run-000" in capsys.readouterr().out
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM rows").fetchone() == (len(rows),)


def check(db, *args):
    """The gate on a store of past nights: their age is no finding here (its own tests set one)."""
    age = [] if "--max-age" in args else ["--max-age", "off"]
    return main(["history", "check", "--db", str(db), *age, *args])


def keep_configs(paths, step_at, before, after):
    """Each run's config copy in its logs folder, as a session keeps it (with the run's id):
    ``after`` from run ``step_at`` on, ``before`` until then."""
    for i, path in enumerate(paths):
        logs = path.with_suffix(".logs")
        logs.mkdir()
        config = {"//": f"night {i}", "results_dir": f"results/{i}", **(after if i >= step_at else before)}
        (logs / "config.json").write_text(json.dumps(config))
        (logs / "config.run").write_text(f"run-{i:03d}\n")


@pytest.mark.parametrize(
    "after, says",
    [
        # rounds is not in the case key: without the settings the step was "the harness drifted"
        ({"matrix": {"rounds": 3}, "engine": {"max_num_seqs": 16}}, "settings: matrix.rounds: 10 -> 3"),
        ({"matrix": {"rounds": 10}, "engine": {"max_num_seqs": 64}}, "settings: engine.max_num_seqs: 16 -> 64"),
        (
            {"matrix": {"rounds": 10}, "engine": {"max_num_seqs": 16}},
            "the same stack and settings (the host or the harness drifted)",
        ),
        (None, "the same stack (the host, the harness or settings not kept drifted)"),
        # Credentials hidden as a bug bundle hides them: the line names the change, never the token.
        (
            {"matrix": {"rounds": 10}, "engine": {"max_num_seqs": 16}, "env": {"HF_TOKEN": "hf_" + "b" * 34}},
            'settings: env.HF_TOKEN: - -> "(redacted)"',
        ),
        # Nothing that can move these cases: another scenario's section, a comment inside a
        # list, a configuration added beside theirs (their own max_loras is in their key).
        (
            {"matrix": {"rounds": 10}, "engine": {"max_num_seqs": 16, "max_loras": [2, 8]}}
            | {"capacity": {"slo_ttft_ms": 900}, "online": {"suites": [{"//": "tonight's note", "rate": [1]}]}},
            "the same stack and settings (the host or the harness drifted)",
        ),
    ],
)
def test_a_regression_with_the_same_stack_names_the_settings_that_changed_with_it(tmp_path, capsys, after, says):
    paths = write_runs(tmp_path, 12, step_at=7, new_version=False)
    before = {"matrix": {"rounds": 10}, "engine": {"max_num_seqs": 16}}
    if after is not None and "capacity" in after:  # the sections the runs before had too
        before |= {"engine": {"max_num_seqs": 16, "max_loras": [2]}, "capacity": {"slo_ttft_ms": 500}}
        before |= {"online": {"suites": [{"//": "last night's note", "rate": [1]}]}}
    if after is not None:
        keep_configs(paths, 7, before, after)
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    capsys.readouterr()
    assert check(db) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("REGRESSION")]
    assert len(failed) == 2 and all(line.endswith(f"since run run-007: {says}") for line in failed), failed
    assert b"hf_bbb" not in db.read_bytes(), "no credential is stored"


def test_a_cases_settings_are_what_can_move_it_its_own_section_kept():
    from lorabench.analysis.compare.settings import for_case

    flat = {
        "model": '"/models/v2/Qwen"',  # the model column keeps the folder's name only
        "engine.max_num_seqs": "16",
        "engine.max_loras": "[2, 8]",  # a case's own max_loras is in its key
        "matrix.rounds": "10",
        "working_set.sizes": "[1, 2, 4]",
        "online.warmup_s": "1",
        "capacity.probe_duration_s": "4",
        "capacity.max_rate": "40",  # not in what cases are matched on: searches under others are one case
    }
    assert for_case(flat, "capacity") == {
        k: flat[k]
        for k in ("model", "engine.max_num_seqs", "matrix.rounds", "capacity.probe_duration_s", "capacity.max_rate")
    }
    assert set(for_case(flat, "online")) == {"model", "engine.max_num_seqs", "matrix.rounds", "online.warmup_s"}


def test_a_runs_settings_are_its_own_not_a_later_runs_kept_in_the_same_folder(tmp_path, capsys):
    """A fixed output file holds several runs and one logs folder, the newest run's config in
    it: the older runs' settings are unknown, not the newest's. A store written before
    settings were kept learns them when the run is added again."""
    fixed = tmp_path / "fixed.csv"
    frames = [pd.read_csv(p) for p in write_runs(tmp_path, 3)]
    pd.concat(frames).to_csv(fixed, index=False)
    keep_configs([fixed], 0, {}, {"matrix": {"rounds": 3}})
    (fixed.with_suffix(".logs") / "config.run").write_text("run-002\n")
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), str(fixed)])
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT run_id, settings FROM settings").fetchall() == [
            ("run-002", '{"matrix.rounds": "3"}')
        ]
        conn.execute("DELETE FROM settings")  # as a store written before settings were kept
    main(["history", "add", "--db", str(db), str(fixed)])
    assert "already stored" in capsys.readouterr().out
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT run_id FROM settings").fetchall() == [("run-002",)]
    # The one run of a file, its config kept for another run (a run that began in the same second):
    (tmp_path / "run000.logs").mkdir()
    (tmp_path / "run000.logs" / "config.json").write_text("{}")
    (tmp_path / "run000.logs" / "config.run").write_text("run-999\n")
    from lorabench.analysis.history.runs import read_runs

    assert read_runs(tmp_path / "run000.csv")[0].settings is None


def test_a_store_from_before_settings_were_kept_still_reads_and_gates(tmp_path, capsys):
    """Its runs' settings are unknown, not an error: the gate says so, as for runs that kept none."""
    paths = write_runs(tmp_path, 12, step_at=7, new_version=False)
    keep_configs(paths, 7, {"matrix": {"rounds": 10}}, {"matrix": {"rounds": 3}})
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE settings")
    capsys.readouterr()
    assert check(db) == 1
    assert "since run run-007: the same stack (the host, the harness or settings not kept" in capsys.readouterr().out


def test_the_gate_fails_on_a_regression_naming_its_run_and_what_changed_in_the_stack(tmp_path, capsys):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 12, step_at=7))])
    capsys.readouterr()
    assert check(db) == 1
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("REGRESSION")]
    assert len(failed) == 2 and all(" ttft_ms: " in line for line in failed), out  # both cases, ttft only
    assert all(line.endswith("since run run-007: vllm_version 0.32.0 -> 0.33.0") for line in failed), out
    assert "history check: 2 regressed beyond 5% (or the metric's own) in 12 series of the newest run (run-011)" in out


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


def test_a_series_too_short_to_show_a_change_is_said_so_not_passed_in_silence(tmp_path, capsys):
    """A level needs 3 runs and a step 2 nights to fail: 4 runs with one odd night are too
    short to judge (and the night is watched); a second such night fails."""
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 4, step_at=3, factor=3.0))])
    assert check(db, "--metric", "ttft_ms") == 0, "one night is not two"
    out = capsys.readouterr().out
    assert "in 2 series of the newest run (run-003) (2 of them under 5 runs: too short to judge)" in out
    assert out.count("WATCH") == 2, out
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 5, step_at=3, factor=3.0))])
    assert check(db, "--metric", "ttft_ms") == 1 and "too short" not in capsys.readouterr().out


def test_a_store_two_hosts_add_to_judges_each_hosts_newest_run(tmp_path, capsys):
    """Nights alternate between two hosts: each host's newest run is judged against its own
    series, none of the other host's cases is MISSING, and a step on one host is named."""
    paths = write_runs(tmp_path, 16, step_at=8, factor=1.3, seed=3)
    for i, path in enumerate(paths):
        rows = pd.read_csv(path).assign(hostname=f"host{i % 2}")
        if i % 2:  # host1 never stepped: its ttft_ms back to the base level
            rows = rows.assign(ttft_ms=rows["ttft_ms"] / (1.3 if i >= 8 else 1.0), vllm_version="0.32.0")
        rows.to_csv(path, index=False)
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    capsys.readouterr()
    assert check(db, "--metric", "ttft_ms") == 1
    out = capsys.readouterr().out
    assert "MISSING" not in out and "(run-014, run-015)" in out, out
    failed = [line for line in out.splitlines() if line.startswith("REGRESSION")]
    assert len(failed) == 2 and all(" on host0 " in line and "threshold 5 %" in line for line in failed), out


def test_the_newest_nights_far_off_their_level_are_judged_before_a_change_point_can_be(tmp_path, capsys):
    """12 nights at 2 % noise: the last one 3 times slower is watched (one odd night fails
    nothing), the last two fail; the same nights without the step say nothing."""
    for step, status, said in ((11, 0, "WATCH"), (10, 1, "REGRESSION"), (None, 0, None)):
        folder = tmp_path / str(step)
        folder.mkdir()
        paths = write_runs(folder, 12, step_at=step, factor=3.0, seed=6)
        db = folder / "h.db"
        main(["history", "add", "--db", str(db), *map(str, paths)])
        capsys.readouterr()
        assert check(db, "--metric", "ttft_ms") == status
        out = capsys.readouterr().out
        lines = [line for line in out.splitlines() if line.startswith(("WATCH", "REGRESSION"))]
        assert len(lines) == (2 if said else 0), out  # both cases
        if said:
            assert all(line.startswith(said) and f"since run run-{step:03d}" in line for line in lines), out
            assert all(f"the newest {12 - step} run" in line for line in lines), out


def test_a_retired_hosts_last_night_is_not_judged_again_every_night(tmp_path, capsys):
    """Host A's last run changed an adapter's output and regressed; host B goes on for 14
    nights more (runs 6 to 19, an hour apart from A's last by a day and more): only B is
    judged, and A is said to be stale."""
    paths = write_runs(tmp_path, 20, step_at=5, factor=1.5, seed=4)
    for i, path in enumerate(paths):
        rows = pd.read_csv(path).assign(hostname="hostA" if i < 6 else "hostB")
        if i >= 6:  # host B never stepped
            rows = rows.assign(ttft_ms=rows["ttft_ms"] / 1.5, vllm_version="0.32.0")
        rows.assign(timestamp=f"2026-11-{1 + i:02d}T02:00:00Z").to_csv(path, index=False)
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    capsys.readouterr()
    assert check(db, "--metric", "ttft_ms") == 0
    out = capsys.readouterr().out
    assert "STALE hostA (" in out and "run-005 is 14.0 days older" in out, out
    assert "REGRESSION" not in out and "(run-019)" in out, out


def test_a_host_name_that_changes_every_night_is_said_not_passed_in_silence(tmp_path, capsys):
    """A container's host name, new on the last night: its run starts a series of one. The
    gate cannot judge it, and says so, naming the fix."""
    paths = write_runs(tmp_path, 14, step_at=8, factor=1.5, seed=5)
    for i, path in enumerate(paths):
        pd.read_csv(path).assign(hostname=f"pod-{i}" if i == 13 else "node").to_csv(path, index=False)
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    capsys.readouterr()
    check(db, "--metric", "ttft_ms")
    out = capsys.readouterr().out
    assert "NEW MACHINE pod-13 (" in out and "set LORABENCH_HOSTNAME to one name" in out, out


def test_two_servers_through_their_urls_are_two_machines_and_a_serve_targets_port_no_stack(tmp_path, capsys):
    paths = write_runs(tmp_path, 4)
    for i, path in enumerate(paths):
        rows = pd.read_csv(path)
        if i < 2:  # two url servers measured from one client host
            rows = rows.assign(target="url", endpoint=f"http://10.0.0.{i}:8000")
        else:  # lorabench's own vllm serve, on a free port each run
            rows = rows.assign(target="serve", endpoint=f"http://127.0.0.1:{40000 + i}")
        rows.to_csv(path, index=False)
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    out = capsys.readouterr().out
    stacks = [line.split("(stack ")[1].split(",")[0] for line in out.splitlines()]
    assert stacks[2] == stacks[3] and len(set(stacks)) == 3, out  # the two serve runs: one stack
    assert main(["history", "show", "--db", str(db), "-k", "bs2", "--metric", "ttft_ms"]) == 0
    out = capsys.readouterr().out
    assert "via http://10.0.0.0:8000" in out and "via http://10.0.0.1:8000" in out and "127.0.0.1" not in out, out


def test_worse_is_said_as_compare_says_it():
    from lorabench.analysis.history.gate import worse_by

    assert worse_by("output_tokens_per_s", 10.0, 8.0) == pytest.approx(0.20)  # not 10/8 - 1 = 25 %
    assert worse_by("ttft_ms", 10.0, 12.0) == pytest.approx(0.20)
    assert worse_by("output_tokens_per_s", 10.0, 12.0) < 0 < worse_by("capacity_rps", 10.0, 9.0)
    # From 0 there is no ratio, but there is a direction: a throughput recovering from 0 is better.
    assert worse_by("output_tokens_per_s", 0.0, 66.8) == -np.inf and worse_by("ttft_ms", 0.0, 5.0) == np.inf
    assert worse_by("output_tokens_per_s", 0.0, 0.0) == 0


@pytest.mark.parametrize("order, status", [((0.0, 66.8), 0), ((66.8, 0.0), 1)], ids=["recovered", "collapsed"])
def test_a_throughput_that_recovers_from_0_passes_the_gate_and_one_that_falls_to_0_fails(
    tmp_path, capsys, order, status
):
    """Three nights on which nothing finished (throughput 0), then three healthy ones: the
    gate passes the recovery; the same nights the other way round fail it."""
    paths = []
    for i, level in enumerate(np.repeat(order, 3)):
        rows = [
            asdict(
                make_row(run_id=f"run-{i}", timestamp=f"2026-11-0{i + 1}T00:00:00Z", build=b, output_tokens_per_s=level)
            )
            for b in (0, 1)
        ]
        paths.append(tmp_path / f"run{i}.csv")
        pd.DataFrame(rows).to_csv(paths[-1], index=False)
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    assert check(db, "--metric", "output_tokens_per_s") == status
    main(["history", "show", "--db", str(db), "--metric", "output_tokens_per_s"])
    out = capsys.readouterr().out
    assert "nan" not in out and ("(from 0, p" in out) == (order[0] == 0), out


def with_history(tmp_path, history):
    """The repository's default config with a ``history`` section of its own."""
    config = json.loads((ROOT / "config" / "common.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "history": history}))
    return path


def test_the_configs_thresholds_are_the_gates_and_the_command_line_overrides_them(tmp_path, capsys):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 16, step_at=8, factor=1.04, seed=5))])
    strict = with_history(tmp_path, {"metrics_pct": {"ttft_ms": 3}})
    assert check(db, "--metric", "ttft_ms", "--config", str(strict)) == 1, capsys.readouterr().out
    assert "beyond 5%" in capsys.readouterr().out, "the overall threshold stays the default"
    assert check(db, "--metric", "ttft_ms", "--config", str(strict), "--threshold", "ttft_ms=5%") == 0
    lenient = with_history(tmp_path, {"threshold_pct": 2, "metrics_pct": {"ttft_ms": 6}})
    assert check(db, "--metric", "ttft_ms", "--config", str(lenient)) == 0, "the metric's own over the overall"
    overall = with_history(tmp_path, {"threshold_pct": 3})
    assert check(db, "--metric", "ttft_ms", "--config", str(overall)) == 1, (
        "the overall one, where none is the metric's"
    )


@pytest.mark.parametrize(
    "history, says",
    [
        ({"metrics_pct": {"ttft": 3}}, "'ttft' is not a compared column"),
        ({"metrics_pct": {"ttft_ms": -1}}, "give a percentage of 0 or more"),
        ({"threshold": 3}, "history.threshold"),
        ({"threshold_pct": float("inf")}, "history.threshold_pct"),  # Infinity in JSON: the gate switched off
    ],
)
def test_a_bad_history_section_is_one_line_and_exit_2(tmp_path, capsys, history, says):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 2))])
    capsys.readouterr()
    assert check(db, "--config", str(with_history(tmp_path, history))) == 2
    err = capsys.readouterr().err
    assert says in err and "config.json" in err and len(err.strip().splitlines()) == 1, err


def test_a_config_with_two_problems_gets_a_line_each_and_a_missing_one_names_the_option(tmp_path, capsys):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 2))])
    capsys.readouterr()
    assert check(db, "--config", str(with_history(tmp_path, {"threshold_pct": -1, "metrics_pct": {"x": 1}}))) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("lorabench history check: ") for line in lines), lines
    assert check(db, "--config", str(tmp_path / "nosuch.json")) == 2
    assert f"--config {tmp_path / 'nosuch.json'}: no such file" in capsys.readouterr().err


def test_the_split_is_the_one_ruptures_binary_segmentation_finds():
    """The l2 split is computed here (vectorized for the permutation test); ruptures'
    Binseg(model="l2") is the reference it must agree with."""
    ruptures = pytest.importorskip("ruptures")
    from lorabench.analysis.history.changes import MIN_SIZE, gains

    rng = np.random.default_rng(7)
    for n in (6, 7, 20, 60):
        for _ in range(25):
            values = rng.normal(100, 3, n)
            values[rng.integers(1, n) :] *= rng.choice([1.0, 1.05, 0.9])
            ours = MIN_SIZE + int(gains(values[np.newaxis])[0].argmax())
            theirs = ruptures.Binseg(model="l2", min_size=MIN_SIZE, jump=1).fit(values).predict(n_bkps=1)[0]
            assert ours == theirs, (n, values)


def test_a_change_point_gives_the_runs_it_may_lie_between_and_they_hold_the_step():
    """At 3 % noise a 5 % step is often found a run or two off: the range says so."""
    rng = np.random.default_rng(11)
    held, off_but_held, found_any = 0, 0, 0
    for i in range(60):
        at = int(rng.integers(6, 54))
        points = rng.normal(1.0, 0.03, 60)
        points[at:] *= 1.05
        changes = change_points(points, seed=i)
        if not changes:
            continue
        found_any += 1
        c = min(changes, key=lambda c: abs(c.position - at))
        assert c.first <= c.position <= c.last
        held += c.first <= at <= c.last
        off_but_held += c.position != at and c.first <= at <= c.last
    assert found_any >= 50 and held / found_any >= 0.9 and off_but_held >= 10, (found_any, held, off_but_held)


def test_the_dashboard_is_one_offline_page_with_each_build_the_change_and_the_stack_change(tmp_path, capsys):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 12, step_at=7))])
    assert main(["history", "report", "--db", str(db), "--out", str(tmp_path / "page"), "--metric", "ttft_ms"]) == 0
    assert f"report: {tmp_path / 'page' / 'index.html'}" in capsys.readouterr().out
    page = (tmp_path / "page" / "index.html").read_text()
    assert sorted(p.name for p in (tmp_path / "page").iterdir()) == ["index.html"]  # its figures are in it
    assert "http" not in page.replace("http-equiv", "")  # nothing fetched from a network
    assert page.count("<figure ") == 2 and page.count("<circle ") == 2 * 12 * 2  # 2 cases, 12 runs, 2 builds
    assert page.count("change at run 7:") == 2 and page.count("vllm_version 0.32.0 → 0.33.0") == 2
    # A change found at its run for certain: the band it may lie in is the line, not a run wide.
    band = re.search(r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"[^>]*><title>change somewhere in runs 7-7', page)
    line = re.search(r'<line x1="([\d.]+)"[^>]*><title>change at run 7:', page)
    left, width, at = float(band[1]), float(band[2]), float(line[1])
    assert left <= at <= left + width and width <= 2.0, (left, width, at)
    assert 'data-scenario="multilora"' in page and '<select id="config"' in page


def test_the_dashboard_marks_where_the_settings_changed(tmp_path, capsys):
    paths = write_runs(tmp_path, 12, step_at=7, new_version=False)
    keep_configs(paths, 7, {"matrix": {"rounds": 10}}, {"matrix": {"rounds": 3}})
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    assert main(["history", "report", "--db", str(db), "--out", str(tmp_path / "page"), "--metric", "ttft_ms"]) == 0
    page = (tmp_path / "page" / "index.html").read_text()
    assert page.count("matrix.rounds: 10 → 3") == 2 and "night" not in page and "results_dir" not in page


def write_digests(csv_path, digest):
    rows = pd.read_csv(csv_path)
    records = [
        {
            "run_id": rows["run_id"][0],
            "model": "builtin:tiny-llama",
            "device_type": "cpu",
            "engine_id": e,
            "build": b,
            "adapter": a,
            "adapter_rank": 8,
            "digest": digest if a == "a1" else "same",
            "base_digest": "b",
        }
        for b, e in ((0, "loras2-rank16-cpu4-build0"), (1, "loras2-rank16-cpu4-build1"))
        for a in ("a0", "a1")
    ]
    pd.DataFrame(records).to_csv(csv_path.with_name(csv_path.stem + ".digests.csv"), index=False)


def test_the_gate_fails_the_night_an_adapters_output_changed(tmp_path, capsys):
    db = tmp_path / "h.db"
    paths = write_runs(tmp_path, 6)
    for i, path in enumerate(paths):
        write_digests(path, "d-new" if i == 5 else "d-old")
    main(["history", "add", "--db", str(db), *map(str, paths[:5])])
    assert check(db) == 0
    main(["history", "add", "--db", str(db), str(paths[5])])
    capsys.readouterr()
    assert check(db) == 1
    out = capsys.readouterr().out
    assert "OUTPUT CHANGED builtin:tiny-llama (cpu) adapter a1: greedy output d-old -> d-new between run run-004" in out
    assert "adapter a0" not in out and "1 adapter output(s) changed" in out


def test_six_runs_can_show_a_change_though_a_permutation_test_of_them_could_not():
    """3 and 3 runs have 20 orders: a permutation p-value is never under 0.05. Student's
    pooled t-test decides short series, and it is not fooled by their noise."""
    rng = np.random.default_rng(2)
    found, false = 0, 0
    for i in range(100):
        stepped = rng.normal(1.0, 0.03, 6)
        stepped[3:] *= 1.3
        found += [c.position for c in change_points(stepped, seed=i)] == [3]
        false += len(change_points(rng.normal(1.0, 0.03, 6), seed=i))
    assert found >= 80 and false <= 2, (found, false)  # 95 % and 0.2 % in 500 of each


def series_of(levels, runs_each=6, noise=0.005, seed=0):
    """A ttft_ms series through the levels given, ``runs_each`` runs at each."""
    from lorabench.analysis.history.series import Series
    from lorabench.analysis.history.store import StoredRun

    rng = np.random.default_rng(seed)
    points = np.concatenate([rng.normal(level, noise * level, runs_each) for level in levels])
    runs = [StoredRun(f"run-{i}", f"t{i:03d}", f"s{i}", {"vllm_version": str(i)}) for i in range(len(points))]
    return Series("multilora x", "ttft_ms", runs, [np.array([p]) for p in points], change_points(points))


@pytest.mark.parametrize(
    "levels, fails",
    [
        ([100, 115, 110], True),  # a recovery that leaves it 10 % worse than it was
        ([100, 104, 108.5], True),  # two steps under 5 % that add up to 8.5 %
        ([100, 103], False),  # a real change, but under 5 %
    ],
)
def test_the_gate_compares_the_newest_level_with_every_level_before_it(levels, fails):
    from lorabench.analysis.history.gate import regressions

    s = series_of(levels)
    assert len(s.changes) == len(levels) - 1, s.changes
    assert bool(regressions([s], 0.05, {})) == fails


@pytest.mark.parametrize("n", range(6, 17))
def test_a_20_percent_regression_on_the_last_3_runs_is_a_change_point_at_any_length(n):
    rng = np.random.default_rng(n)
    hits = 0
    for i in range(20):
        points = rng.normal(1.0, 0.03, n)
        points[n - 3 :] *= 1.2
        hits += any(c.position == n - 3 for c in change_points(points, seed=i))
    assert hits >= 16, hits


def test_a_case_missing_from_the_newest_run_fails_the_gate_and_old_series_are_not_judged(tmp_path, capsys):
    db = tmp_path / "h.db"
    paths = write_runs(tmp_path, 10, step_at=5)
    last = pd.read_csv(paths[-1])
    last[last["batch_size"] == 2].to_csv(paths[-1], index=False)  # bs8 crashed tonight
    main(["history", "add", "--db", str(db), *map(str, paths)])
    capsys.readouterr()
    assert check(db, "--metric", "ttft_ms") == 1
    out = capsys.readouterr().out
    assert "MISSING multilora loras2-rank16-cpu4 bs8 in16 out4: measured before, not in the newest run run-009" in out
    assert "REGRESSION" in out and " bs8 " not in out.split("MISSING")[0] + out.split("MISSING")[1].split("\n", 1)[1]


def test_two_machines_are_two_series_not_one_that_jumps(tmp_path, capsys):
    db = tmp_path / "h.db"
    paths = write_runs(tmp_path, 12)
    for i, path in enumerate(paths):  # two hosts alternate, the second 30 % slower
        rows = pd.read_csv(path)
        rows["hostname"] = f"host{i % 2}"
        rows["ttft_ms"] *= 1.3 if i % 2 else 1.0
        rows.to_csv(path, index=False)
    main(["history", "add", "--db", str(db), *map(str, paths)])
    capsys.readouterr()
    assert main(["history", "show", "--db", str(db), "-k", "bs2", "--metric", "ttft_ms"]) == 0
    out = capsys.readouterr().out
    assert out.count("(6 runs;") == 2 and " on host0 " in out and " on host1 " in out and "change at" not in out


def test_a_run_added_while_its_session_was_still_writing_is_completed_not_frozen(tmp_path, capsys):
    db = tmp_path / "h.db"
    (path,) = write_runs(tmp_path, 1)
    whole = pd.read_csv(path)
    whole.iloc[:2].to_csv(path, index=False)  # two of its four rows written so far
    main(["history", "add", "--db", str(db), str(path)])
    whole.to_csv(path, index=False)  # the session finished
    main(["history", "add", "--db", str(db), str(path)])
    whole.iloc[:1].to_csv(path, index=False)  # a file cut short later loses nothing stored
    main(["history", "add", "--db", str(db), str(path)])
    said = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    assert said == ["added", "grew", "already stored"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM rows").fetchone() == (4,)
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (1,)


def test_cases_the_name_alone_would_not_tell_apart_are_named_by_what_differs(tmp_path, capsys):
    db = tmp_path / "h.db"
    paths = write_runs(tmp_path, 2)
    for path in paths:
        rows = pd.read_csv(path)
        other = rows[rows["batch_size"] == 2].assign(model="my-llama", ttft_ms=99.0)
        pd.concat([rows, other]).to_csv(path, index=False)
    main(["history", "add", "--db", str(db), *map(str, paths)])
    capsys.readouterr()
    assert main(["history", "show", "--db", str(db), "-k", "bs2", "--metric", "ttft_ms"]) == 0
    out = capsys.readouterr().out
    assert "bs2 in16 out4 [model=builtin:tiny-llama]  ttft_ms" in out and "[model=my-llama]  ttft_ms" in out


def test_a_capacity_that_is_only_a_bound_is_no_point_and_the_gate_says_it_is_blank(tmp_path, capsys):
    """A search stopped at its range's end found a bound: storing it as a capacity would make
    a collapse look like a level, and its absence must not pass the gate silently."""
    db = tmp_path / "h.db"
    paths = write_runs(tmp_path, 8)
    for i, path in enumerate(paths):
        rows = pd.read_csv(path)
        rows["capacity_rps"] = 0.5 if i == 7 else 4.0
        rows["search_stop"] = "below min_rate" if i == 7 else "bracketed"
        rows.to_csv(path, index=False)
    main(["history", "add", "--db", str(db), *map(str, paths)])
    capsys.readouterr()
    assert check(db, "--metric", "capacity_rps", "--metric", "ttft_ms") == 1
    out = capsys.readouterr().out
    blank = [line for line in out.splitlines() if line.startswith("NOT MEASURED")]
    assert len(blank) == 2 and all(" capacity_rps: " in line and "newest run run-007" in line for line in blank), out
    assert "REGRESSION" not in out and "2 figure(s) blank in it" in out
    assert main(["history", "show", "--db", str(db), "-k", "bs2", "--metric", "capacity_rps"]) == 0
    assert "(7 runs;" in capsys.readouterr().out  # the bound is not the 8th point


def test_a_churn_ratio_left_blank_for_want_of_a_request_during_a_load_is_not_a_failure(tmp_path, capsys):
    """A churn build whose trace sent no request while an adapter loaded has no
    ttft_load_ratio (docs/compare.md): a night like that is not NOT MEASURED; a blank
    load_ms_p50 (no load timed) still is."""
    db = tmp_path / "h.db"
    paths = write_runs(tmp_path, 8)
    for i, path in enumerate(paths):
        rows = pd.read_csv(path).assign(ttft_load_ratio=None if i == 7 else 1.5, load_ms_p50=None if i == 7 else 9.0)
        rows.to_csv(path, index=False)
    main(["history", "add", "--db", str(db), *map(str, paths)])
    capsys.readouterr()
    assert check(db, "--metric", "ttft_ms", "--metric", "ttft_load_ratio") == 0
    assert "NOT MEASURED" not in capsys.readouterr().out
    assert check(db, "--metric", "ttft_ms", "--metric", "ttft_load_ratio", "--metric", "load_ms_p50") == 1
    blank = [line for line in capsys.readouterr().out.splitlines() if line.startswith("NOT MEASURED")]
    assert len(blank) == 2 and all(" load_ms_p50: " in line for line in blank), blank


def test_a_capacity_past_the_top_of_its_range_is_no_regression_and_a_fall_from_it_is(tmp_path, capsys):
    """A search that passed its max_rate found a capacity of at least that: an improvement
    that must not fail the gate; a series that falls from there to a bracketed capacity does."""

    def gate(name, above):
        (tmp_path / name).mkdir()
        paths = write_runs(tmp_path / name, 9, seed=4)
        for i, path in enumerate(paths):
            rows = pd.read_csv(path)
            noise = np.random.default_rng(i).normal(1, 0.02, len(rows))
            rows["capacity_rps"] = 8.0 if above(i) else 4.0 * noise
            rows["search_stop"] = "above max_rate" if above(i) else "bracketed"
            rows.to_csv(path, index=False)
        db = tmp_path / name / "h.db"
        main(["history", "add", "--db", str(db), *map(str, paths)])
        capsys.readouterr()
        return check(db, "--metric", "capacity_rps"), capsys.readouterr().out

    status, out = gate("rose", lambda i: i >= 5)
    assert status == 0 and "NOT MEASURED" not in out, out
    status, out = gate("fell", lambda i: i < 5)
    assert status == 1 and out.count("REGRESSION") == 2 and "since run run-005" in out, out


@pytest.mark.engine
def test_a_real_runs_rows_go_into_the_history_and_the_gate_reads_them(compare_session, tmp_path, capsys):
    """The real CPU engine's run, added by --bench-history at its session's end (the compare
    session of tests/engine_sessions.py); then a series around it: its made-up fast base as
    five earlier nights, and two copies of the real run (new ids, later) as the nights after."""
    db = compare_session.folder / "history.db"
    compare_session.result.stdout.fnmatch_lines(["*= lorabench history =*", f"added: run * to {db}"])
    with sqlite3.connect(db) as conn:
        ((run_id, stack),) = conn.execute("SELECT run_id, stack FROM runs").fetchall()
    real = pd.read_csv(compare_session.csv)
    assert run_id == real["run_id"].iloc[0]
    stack = json.loads(stack)
    assert stack["vllm_version"] == real["vllm_version"].iloc[0] and stack["cpu_model"] != "unknown"
    # Its settings, from the config the session kept with its run id: what the gate names.
    with sqlite3.connect(db) as conn:
        ((kept_for, settings),) = conn.execute("SELECT run_id, settings FROM settings").fetchall()
    assert kept_for == run_id and json.loads(settings)["matrix.rounds"] == "2", settings
    copy = tmp_path / "history.db"
    copy.write_bytes(db.read_bytes())
    host = ["hostname", "device_name", "device_count", "cpu_model"]  # the made-up base's is another machine
    base = pd.read_csv(compare_session.folder / "base.csv").assign(**{c: real[c].iloc[0] for c in host})
    nights = []
    for night in range(5):
        path = tmp_path / f"base{night}.csv"
        base.assign(run_id=f"base-{night}", timestamp=f"2000-01-0{night + 1}T00:00:00Z").to_csv(path, index=False)
        nights.append(path)
    for night in range(2):
        path = tmp_path / f"again{night}.csv"
        real.assign(run_id=f"again-{night}", timestamp=f"2999-01-0{night + 1}T00:00:00Z").to_csv(path, index=False)
        nights.append(path)
    assert main(["history", "add", "--db", str(copy), *map(str, nights)]) == 0
    capsys.readouterr()
    assert check(copy, "-k", "multilora", "--metric", "e2e_ms") == 1
    out = capsys.readouterr().out
    assert "multilora loras1-rank16-cpu4 bs2 in16 out4 e2e_ms" in out and f"since run {run_id}" in out, out
    lenient = with_history(tmp_path, {"metrics_pct": {"e2e_ms": 1e6}})  # the config's threshold, on real rows
    check(copy, "-k", "multilora", "--metric", "e2e_ms", "--config", str(lenient))
    assert "REGRESSION" not in capsys.readouterr().out


def test_two_exact_levels_are_one_change_at_one_run():
    """Copies of one run (no noise at all): the unexplained variance rounds to just under 0."""
    found = change_points(np.array([31.88438819734057] * 4 + [13.562357016817128] * 3))
    assert [(c.position, c.first, c.last) for c in found] == [(4, 4, 4)] and found[0].p_value < 1e-12


def test_a_doubling_with_a_noisier_slower_level_is_a_change_and_fails_the_gate():
    """decode_ms of six real A/B turns as nights (the lab log, 2026-11-28): the busy level
    jitters as much more as it is slower. On raw values with a pooled variance the split has
    p 0.027 and the gate passed it; latencies are tested on their logs (p 0.006)."""
    series = np.array([31.035, 31.746, 33.577, 65.180, 65.096, 106.214])
    (change,) = change_points(series)
    assert (change.position, change.before, change.after) == (3, 31.746, 65.180) and change.p_value < 0.01
    # A blank night is left out before the scale is chosen, so it cannot turn the logs off.
    (blank,) = change_points(np.insert(series, 1, np.nan))
    assert (blank.position, blank.p_value) == (4, change.p_value)
    counts = np.array([0.0, 0.0, 1.0, 3.0, 4.0, 3.0])  # a count can be 0: read as it is
    assert (on_scale(counts) == counts).all() and np.allclose(on_scale(series), np.log(series))
