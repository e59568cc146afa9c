"""A fleet's run in the history: each row under its own node's stack, not the first row's.

On a Ray fleet every row carries the session's host name, but its device and drivers are
its node's, and ``fleet_devices`` names the node (``node-a:1a2b3c4d npu 0``); on a CPU fleet
each row's ``device_count`` is its slot's cores. Fake rows, no engine."""

from __future__ import annotations

import json
import sqlite3

import pandas as pd

from lorabench.cli.main import main
from tests.test_history import check, write_runs

NODE_A = {"fleet_devices": "node-a:1a2b3c4d npu 0", "driver_version": "23.0", "device_name": "Ascend910B"}
NODE_B = {"fleet_devices": "node-b:5e6f7a8b npu 0", "driver_version": "24.1", "device_name": "Ascend910B"}
NODE_C = {"fleet_devices": "node-c:9c0d1e2f npu 0", "driver_version": "23.0", "device_name": "Ascend910_9392"}


def _place(paths, where, first_bs=8):
    """Each run's rows on the nodes ``where(run, batch_size)`` gives, all with the session's
    host name and device count; the ``first_bs`` case's rows first in the file (the row today's
    history took the run's stack from)."""
    for i, path in enumerate(paths):
        rows = pd.read_csv(path).assign(hostname="head", device_type="npu", device_count=8)
        rows = pd.concat([rows[rows["batch_size"] == first_bs], rows[rows["batch_size"] != first_bs]])
        for column in NODE_A:
            rows[column] = [where(i, bs)[column] for bs in rows["batch_size"]]
        rows.to_csv(path, index=False)


def _add(db, paths, capsys):
    assert main(["history", "add", "--db", str(db), *map(str, paths)]) == 0
    return capsys.readouterr().out


def test_a_case_whose_builds_moved_to_another_node_is_a_stack_change_the_gate_names(tmp_path, capsys):
    """bs2 moved from node-a to node-b (another driver) at run 7, and got 20 % slower there;
    bs8 stayed on node-a, level, and is each run's first row. The run's stack never changed:
    filed under it, the regression was 'the same stack'."""
    paths = write_runs(tmp_path, 12, step_at=7, factor=1.2, new_version=False)
    for i, path in enumerate(paths):
        if i >= 7:  # only bs2 stepped
            rows = pd.read_csv(path)
            rows.loc[rows["batch_size"] == 8, "ttft_ms"] /= 1.2
            rows.to_csv(path, index=False)
    _place(paths, lambda i, bs: NODE_B if bs == 2 and i >= 7 else NODE_A)
    db = tmp_path / "h.db"
    _add(db, paths, capsys)
    assert check(db, "--metric", "ttft_ms") == 1
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("REGRESSION")]
    assert len(failed) == 1 and " bs2 " in failed[0], out
    assert failed[0].endswith("since run run-007: driver_version 23.0 -> 24.1, node node-a -> node-b"), out
    assert "MISSING" not in out and " on head" not in out, out  # one machine: node-a and node-b are alike


def test_rows_of_two_kinds_of_node_are_two_machines_each_case_under_its_own(tmp_path, capsys):
    """bs8 ran on the 910_9392 node and bs2 on the 910B one, each run's first row bs8's; the
    last night bs2 went to the 910_9392 too. Filed under the first row, bs2 was one series of
    8 runs on a 910_9392 it never ran on until the last; it is 7 on the 910B and 1 on the
    other, and each machine is judged at its own newest run."""
    paths = write_runs(tmp_path, 8)
    _place(paths, lambda i, bs: NODE_C if bs == 8 or i == 7 else NODE_A)
    db = tmp_path / "h.db"
    _add(db, paths, capsys)
    assert main(["history", "show", "--db", str(db), "-k", "bs2", "--metric", "ttft_ms"]) == 0
    out = capsys.readouterr().out
    assert "bs2 in16 out4 on head (Ascend910B x8)  ttft_ms  (7 runs;" in out, out
    assert "bs2 in16 out4 on head (Ascend910_9392 x8)  ttft_ms  (1 runs;" in out, out
    assert check(db, "--metric", "ttft_ms") == 0
    out = capsys.readouterr().out
    assert "in 3 series of the newest run (run-007, run-006) (1 of them under 5 runs" in out, out


def test_a_cpu_fleets_builds_on_slots_of_unequal_cores_are_two_machines_not_replicates(tmp_path, capsys):
    """Build 0 of every configuration on a 16-core slot, build 1 on a 1-core one (a fleet
    before slots were kept equal): averaged, each point was the median of two engines."""
    paths = write_runs(tmp_path, 6)
    for path in paths:
        rows = pd.read_csv(path).assign(hostname="host", fleet_devices="cpu 0-15")
        slow = rows["build"] == 1
        rows["device_count"] = slow.map({True: 1, False: 16})
        rows.loc[slow, ["fleet_devices", "ttft_ms"]] = ["cpu 16", rows.loc[slow, "ttft_ms"] * 8]
        rows.to_csv(path, index=False)
    db = tmp_path / "h.db"
    _add(db, paths, capsys)
    assert main(["history", "show", "--db", str(db), "-k", "bs2", "--metric", "ttft_ms"]) == 0
    out = capsys.readouterr().out
    assert " on host (" in out and out.count("(6 runs;") == 2 and out.count("(1 builds)") == 12, out
    fast = out.split(" on host (")[1:]
    assert sorted(part.split(")")[0].split(" x")[1] for part in fast) == ["1", "16"], out


def test_a_run_of_one_stack_is_stored_as_before_and_one_of_several_keeps_each_rows(tmp_path, capsys):
    """The store's layout is unchanged: a run of one stack has no per-row stacks (its stack id
    is the one it always had); a fleet's run of two nodes keeps both, each row naming its own."""
    (tmp_path / "plain").mkdir()
    plain = write_runs(tmp_path / "plain", 1)
    fleet = write_runs(tmp_path, 1)
    _place(fleet, lambda i, bs: NODE_B if bs == 2 else NODE_A)
    db = tmp_path / "h.db"
    _add(db, plain, capsys)
    with sqlite3.connect(db) as conn:
        ((stack,),) = conn.execute("SELECT stack FROM runs").fetchall()
        metrics = [json.loads(m) for (m,) in conn.execute("SELECT metrics FROM rows")]
    assert "row_stacks" not in json.loads(stack) and all("row_stack" not in m for m in metrics)
    db2 = tmp_path / "h2.db"
    _add(db2, fleet, capsys)
    with sqlite3.connect(db2) as conn:
        ((stack,),) = conn.execute("SELECT stack FROM runs").fetchall()
        rows = conn.execute("SELECT case_key, metrics FROM rows").fetchall()
    stacks = json.loads(json.loads(stack)["row_stacks"])
    assert [s["node"] for s in stacks] == ["node-a", "node-b"]  # the first row's (bs8) first
    assert {json.loads(m)["row_stack"] for _, m in rows} == {0, 1}


def test_an_order_file_of_the_stack_ids_show_prints_orders_a_fleets_runs(tmp_path, capsys):
    """bs2's node had another driver each night (bs8's, each run's first row, did not): the
    ids ``show`` prints for bs2 are its rows' stacks, and an order file of them, newest first,
    puts its runs in that order."""
    paths = write_runs(tmp_path, 4)
    _place(paths, lambda i, bs: {**NODE_B, "driver_version": f"24.{i}"} if bs == 2 else NODE_A)
    db = tmp_path / "h.db"
    _add(db, paths, capsys)
    show = ["history", "show", "--db", str(db), "-k", "bs2", "--metric", "ttft_ms"]
    assert main(show) == 0
    runs = [line.split() for line in capsys.readouterr().out.splitlines() if "  stack " in line]
    assert len({run[3] for run in runs}) == 4, runs  # run: index, time, "stack", id, ...
    order = tmp_path / "order.txt"
    order.write_text("".join(f"{run[3]}\n" for run in reversed(runs)))
    assert main([*show, "--order", str(order)]) == 0
    again = [line.split() for line in capsys.readouterr().out.splitlines() if "  stack " in line]
    assert [run[1] for run in again] == [run[1] for run in reversed(runs)]
