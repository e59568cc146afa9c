"""The local fleet (``--bench-fleet local``): one run out of parallel workers, on the stand-in.

The workers are real pytest processes, each pinned to its own core; what they run is the
stand-in engine on a virtual clock, so these tests check what the fleet merges, keeps and
retries, not how fast it is (tests/test_fleet_engine.py runs the real engine)."""

import fnmatch
import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest

from lorabench.analysis.compare.load import keyed
from lorabench.fleet.check import ROLE_ENV, verdict
from lorabench.fleet.devices import (
    CPUS_ENV,
    DeviceError,
    Slot,
    chosen_devices,
    default_devices,
    parse_devices,
    slots,
)
from lorabench.fleet.local import LocalFleet
from lorabench.fleet.tasks import Attempt, Callbacks, Task, worker_command
from lorabench.pytest_plugin.fleet_check import run_check
from lorabench.results.records import digests_path_for, samples_path_for
from lorabench.targets.standin import write_config
from tests.helpers import ROOT, result_files

CORES = sorted(os.sched_getaffinity(0))
TWO_CORES = pytest.mark.skipif(len(CORES) < 2, reason="a fleet of two one-core devices needs two cores")

# Kills a fleet worker (never the driver, never a sequential session) at its second case:
# the configurations named "once" on their first worker only, those named "always" every time,
# those named "teardown" once, as its first case is torn down: after its row, before its report.
KILLER = """
import os, signal
from pathlib import Path
import pytest
from lorabench.targets.standin import StandIn

DIE = {die!r}
SEEN = []


def pytest_lorabench_backend(config):
    return StandIn(virtual_clock=True, altered={{0: ["a0"]}})


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item):
    if not item.config.getoption("bench_fleet_worker"):
        return
    engine = item.callspec.params["engine"].id
    marker = Path(item.config.rootpath) / f"killed-{{engine}}"
    if DIE.get(engine) == "teardown" and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not item.config.getoption("bench_fleet_worker"):
        return
    engine = item.callspec.params["engine"].id
    SEEN.append(engine)
    marker = Path(item.config.rootpath) / f"killed-{{engine}}"
    if SEEN.count(engine) == 2 and DIE.get(engine) in ("always", "once" if not marker.exists() else None):
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
"""


def _fleet_dir(pytester, die=None, **sections):
    for name in ("test_no_lora.py", "test_multilora.py"):
        pytester.makepyfile(**{name[:-3]: (ROOT / "bench" / name).read_text()})
    pytester.makeconftest(KILLER.format(die=die or {}))
    matrix = {"builds": 2, "batch_sizes": [2, 4], "workloads": ["distinct", "identical"], **sections.pop("matrix", {})}
    engine = sections.pop("engine", {"max_loras": [1, 2]})
    return write_config(pytester.path, engine=engine, matrix=matrix, **sections)


def _fleet(pytester, config, *more):
    devices = f"--bench-devices={CORES[0]},{CORES[1]}"
    return pytester.runpytest("--bench-config", str(config), "--bench-fleet", "local", devices, *more)


def _rows(folder):
    (csv,) = result_files(folder)
    return csv, pd.read_csv(csv)


@TWO_CORES
def test_a_fleet_writes_one_run_with_every_case_once_and_the_keys_of_a_sequential_run(pytester):
    """Two configurations (lora-off and one LoRA) of two builds each: two waves of two workers."""
    config = _fleet_dir(pytester, engine={"max_loras": 1})
    fleet = _fleet(pytester, config)
    assert fleet.ret == 0, fleet.stdout.str()
    fleet.stdout.fnmatch_lines(["*fleet: 4 engine builds on 2 workers*", "*16 passed*"])
    (pytester.path / "results").rename(pytester.path / "fleet-results")
    fleet_csv, rows = _rows(pytester.path / "fleet-results")
    sequential = pytester.runpytest("--bench-config", str(config))
    assert sequential.ret == 0, sequential.stdout.str()
    seq_csv, seq = _rows(pytester.path / "results")

    assert rows["run_id"].nunique() == 1 and len(rows) == len(seq) == 16

    def keys(frame):
        return sorted(keyed(frame)["_key"] + frame["build"].astype(str))

    assert keys(rows) == keys(seq)
    assert not rows.duplicated(["engine_id", "test_id"]).any()
    # Where each ran: both cores, each build on one; who ran beside it: a configuration of the other core.
    assert set(rows["fleet_devices"]) == {f"cpu {CORES[0]}", f"cpu {CORES[1]}"}
    assert (rows.groupby("engine_id")["fleet_devices"].nunique() == 1).all()
    beside = rows.dropna(subset=["fleet_neighbours"])
    assert len(beside) and all(e not in n.split() for e, n in zip(beside["engine_id"], beside["fleet_neighbours"]))
    assert seq["fleet_devices"].isna().all() and seq["fleet_neighbours"].isna().all()

    # Build 0's a0 answers otherwise: each row counts it as one session does, against the session's
    # first build (build 0 of the first configuration), whichever worker finished first.
    def mismatches(frame):
        return frame.set_index(["engine_id", "test_id"])["digest_mismatches"].sort_index()

    assert mismatches(rows).equals(mismatches(seq)) and mismatches(seq).sum() == 6
    assert list(rows["engine_id"].drop_duplicates()) == list(seq["engine_id"].drop_duplicates())
    assert len(pd.read_csv(samples_path_for(fleet_csv))) == len(pd.read_csv(samples_path_for(seq_csv)))
    digests = pd.read_csv(digests_path_for(fleet_csv))
    assert set(digests["run_id"]) == set(rows["run_id"]) and len(digests) == len(pd.read_csv(digests_path_for(seq_csv)))
    logs = fleet_csv.with_suffix(".logs")
    assert {p.stem for p in logs.glob("*.log")} == set(rows["engine_id"]) | {"lora-off-build0", "lora-off-build1"}


@TWO_CORES
def test_a_killed_worker_loses_no_finished_row_and_a_configuration_killed_twice_fails(pytester):
    """Three ways to die, in one fleet of four builds: killed at the second case once, every
    time, and once after the first case's row was written but before its report got out."""
    die = {
        "loras1-rank8-cpu4-build0": "once",
        "loras2-rank8-cpu4-build0": "always",
        "loras1-rank8-cpu4-build1": "teardown",
    }
    result = _fleet(pytester, _fleet_dir(pytester, die=die), "-k", "multilora")
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "*loras*-build0: its worker on cpu * was killed by SIGKILL after *; 3 unfinished cases queued again*",
            "*runs loras*-build0, again after its worker died on cpu **",
        ]
    )
    result.stdout.fnmatch_lines(["*loras1-rank8-cpu4-build1: its worker * SIGKILL*; 3 unfinished cases queued again*"])
    result.stdout.fnmatch_lines(["*fleet: loras2-rank8-cpu4-build0: 2 cases not run: its worker on cpu * was killed*"])
    result.assert_outcomes(passed=14, failed=2, deselected=12)  # the case killed after its row passed
    _, rows = _rows(pytester.path / "results")
    assert not rows.duplicated(["engine_id", "test_id"]).any()
    cases = rows.groupby("engine_id")["test_id"].agg(list)
    # Killed once, at a case or after a row: the first worker's row and the retry's three, each once.
    assert len(cases["loras1-rank8-cpu4-build0"]) == len(cases["loras1-rank8-cpu4-build1"]) == 4
    # Killed twice: one row from each worker before it died.
    assert len(cases["loras2-rank8-cpu4-build0"]) == 2 and len(cases["loras2-rank8-cpu4-build1"]) == 4


@TWO_CORES
def test_a_second_run_into_one_fixed_file_merges_its_own_rows_only(pytester):
    """A fixed --bench-output keeps one logs folder: the second run's workers must not find
    (and the driver merge again) the first run's rows and reports in their folders."""
    config = _fleet_dir(pytester, engine={"max_loras": 1}, matrix={"builds": 1, "batch_sizes": [2]})
    out = pytester.path / "out.csv"
    for _ in range(2):
        result = _fleet(pytester, config, "-k", "multilora", f"--bench-output={out}")
        result.assert_outcomes(passed=2, deselected=2)
    rows = pd.read_csv(out)
    assert rows["run_id"].nunique() == 2 and len(rows) == 4
    assert not rows.duplicated(["run_id", "engine_id", "test_id"]).any()


@TWO_CORES
def test_a_workers_session_takes_the_ini_files_devices_and_the_tests_beside_its_cases_run_in_the_driver(pytester):
    """``bench_devices`` in the ini file reaches each worker's session too, without the
    fleet's flags: the worker must not refuse it as an option given without a fleet (its
    cases would not pass). And a selection that holds tests building no engine runs them
    too, as a session without a fleet would: a failing one fails the session. One fleet of
    one worker for both: each was a fleet of its own, a worker's start (a second here) apiece."""
    config = _fleet_dir(pytester, engine={"max_loras": 1}, matrix={"builds": 1, "batch_sizes": [2]})
    pytester.makeini(f"[pytest]\nbench_devices = {CORES[0]},{CORES[1]}\n")
    pytester.makepyfile(test_plain="def test_passes():\n    pass\n\n\ndef test_fails():\n    assert False\n")
    result = pytester.runpytest("--bench-config", str(config), "--bench-fleet", "local", "-k", "multilora or plain")
    result.assert_outcomes(passed=3, failed=1, deselected=2)
    result.stdout.fnmatch_lines(["FAILED test_plain.py::test_fails*"])


@TWO_CORES
def test_with_x_the_first_failure_stops_the_fleet_and_reports_nothing_it_did_not_run(pytester):
    """-x: the first failed case (a planted one of build 0) stops the session, as without a
    fleet; the cases no worker ran are not reported failed."""
    config = _fleet_dir(pytester, engine={"max_loras": 1}, matrix={"batch_sizes": [2, 4]})
    conftest = pytester.path / "conftest.py"
    conftest.write_text(
        conftest.read_text()
        + "\n\ndef pytest_runtest_call(item):\n"
        + "    if item.config.getoption('bench_fleet_worker') and item.name.endswith('build0-distinct-bs2]'):\n"
        + "        raise AssertionError('planted')\n"
    )
    result = _fleet(pytester, config, "-k", "multilora", "-x")
    assert result.ret == 1
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 1 and outcomes.get("passed", 0) < 7, outcomes
    result.stdout.fnmatch_lines(["*cases not run: the session stopped", "fleet: stopped: stopping after 1 failures"])
    result.stdout.fnmatch_lines(["*_ test_multilora?loras1-rank8-cpu4-build0-distinct-bs2? _*", "E * planted"])
    assert "cases not run: its worker" not in result.stdout.str()


def test_devices_as_a_user_names_them():
    assert parse_devices("0,1,3", "npu") == [(0,), (1,), (3,)]
    assert parse_devices("0-3,4-7", "cpu") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    for bad, why in (("0-3", "not a device"), ("a", "not a device"), ("1,1", "named twice"), ("3-1", "names no")):
        with pytest.raises(DeviceError, match=why):
            parse_devices(bad, "cuda" if bad == "0-3" else "cpu")
    cpu = Slot("cpu", ((0, 1, 2, 3), (6, 8)))
    assert cpu.label == "cpu 0-3,6+8" and cpu.env() == {CPUS_ENV: "0,1,2,3,6,8"}
    assert Slot("npu", ((4,), (5,))).env() == {"ASCEND_RT_VISIBLE_DEVICES": "4,5"}
    assert Slot("cuda", ((2,),)).env() == {"CUDA_VISIBLE_DEVICES": "2"}


def test_named_accelerators_are_taken_where_no_tool_lists_them(monkeypatch):
    """A container without npu-smi: the devices named are used as named; unnamed, the
    refusal says to name them, which then works."""
    monkeypatch.setenv("PATH", "/nonexistent")
    assert chosen_devices("0,1", "npu") == [(0,), (1,)]
    with pytest.raises(DeviceError, match="cannot list the npu devices .*name them with --bench-devices 0,1"):
        chosen_devices(None, "npu")


def test_engines_of_several_devices_take_them_in_groups_and_too_few_is_refused():
    eight = [(i,) for i in range(8)]
    assert [s.label for s in slots(eight, "npu", 2)] == ["npu 0,1", "npu 2,3", "npu 4,5", "npu 6,7"]
    assert len(slots(eight[:3], "npu", 2)) == 1  # the third device idles
    with pytest.raises(DeviceError, match="tensor_parallel_size x pipeline_parallel_size is 4.*fleet has 3"):
        slots(eight[:3], "npu", 4)


def test_the_cpu_default_is_each_numa_node_and_one_node_is_split_in_two(tmp_path, monkeypatch):
    import lorabench.fleet.devices as devices

    monkeypatch.setattr(devices, "NODES", tmp_path)
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: set(range(8)))
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / "cpulist").write_text("0-7\n")
    assert default_devices("cpu") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    (tmp_path / "node0" / "cpulist").write_text("0-3\n")
    (tmp_path / "node1").mkdir()
    (tmp_path / "node1" / "cpulist").write_text("4-7,12-15\n")
    assert default_devices("cpu") == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_a_worker_runs_the_users_command_without_the_fleets_options():
    fleet = ["--bench-fleet", "local", "--bench-devices=0,1", "--bench-fleet-check", "--bench-fleet-check-pairs", "2"]
    pytest_own = ["--basetemp", "/tmp/x", "--junitxml=j.xml", "--junit-xml", "k.xml", "--lf"]
    assert worker_command(["bench", "-k", "multilora", *fleet, *pytest_own, "-v"], Path("/r"))[3:] == [
        "bench", "-k", "multilora", "--lf", "-v", "--rootdir=/r"
    ]  # fmt: skip
    assert worker_command(["bench", "--rootdir", "/mine"], Path("/r"))[3:] == ["bench", "--rootdir", "/mine"]


LOCAL = ["--bench-fleet", "local"]


@pytest.mark.parametrize(
    "args, said",
    [
        ([*LOCAL, "--bench-devices", "97"], "--bench-devices 97: 97 not among the cores this process may run on (*)*"),
        ([*LOCAL, "--bench-devices", "zero"], "--bench-devices zero: 'zero' is not a device; name them as 0-3,4-7 (*"),
        (["--bench-fleet", "nowhere"], "--bench-fleet nowhere: expected local, auto or a Ray address such as *"),
        (["--bench-devices", "0"], "--bench-devices: only a fleet takes it; add --bench-fleet local (docs/fleet.md)"),
        (["--bench-fleet-check"], "--bench-fleet-check: only a fleet takes it; add --bench-fleet local*"),
        ([*LOCAL, "--bench-devices=0", "--bench-fleet-check"], "--bench-fleet-check: one worker (cpu 0) has no*"),
        (["--bench-fleet", "ray://head"], "--bench-fleet ray://head: 'ray://head' is not a Ray client address: *"),
        (
            ["--bench-fleet", "auto", "--bench-devices=0"],
            "--bench-devices: only --bench-fleet local takes it, not auto*",
        ),
        ([*LOCAL, "--bench-fleet-check-pairs", "2"], "--bench-fleet-check-pairs: only --bench-fleet-check takes it*"),
    ],
    ids=[
        "no-such-core",
        "not-a-device",
        "not-a-fleet",
        "devices-alone",
        "check-alone",
        "check-of-one",
        "ray-no-port",
        "devices-on-ray",
        "pairs-alone",
    ],  # fmt: skip
)
def test_bad_fleet_input_is_one_line_and_exit_2_before_any_engine(pytester, args, said):
    config = _fleet_dir(pytester)
    result = pytester.runpytest("--bench-config", str(config), *args)
    assert result.ret == 2
    result.stderr.fnmatch_lines([f"lorabench: {said}"])
    assert not (pytester.path / "results").exists()


def test_an_engine_wider_than_the_fleet_is_refused(pytester):
    config = _fleet_dir(pytester)
    data = json.loads(config.read_text())
    data["engine"]["tensor_parallel_size"] = len(CORES) + 1
    config.write_text(json.dumps(data))
    result = pytester.runpytest("--bench-config", str(config), "--bench-fleet", "local", f"--bench-devices={CORES[0]}")
    assert result.ret == 2
    wide = len(CORES) + 1
    result.stderr.fnmatch_lines([f"lorabench: engine.tensor_parallel_size x pipeline_parallel_size is {wide}: *"])


class _FakeFleet:
    """A fleet that 'runs' its tasks by writing the probe's rows: ``e2e_ms`` 100 alone and
    ``100 * slowdown`` beside, times the host's drift at that moment. Every copy runs from
    t=0 to 10 on one node, the probe's cases measured at 1-2 and 3-4, but a copy ``gone``
    names, which ends at the time it gives."""

    def __init__(self, tasks, folder, slowdown, drift, order, gone=None):
        self.tasks, self.folder, self.slowdown, self.drift, self.order = tasks, folder, slowdown, drift, order
        self.on = Callbacks(report=None, say=None, ended=None, lost=None)
        self.gone, self.attempts = gone or {}, []

    def run(self):
        side = dict(self.tasks[0].env)[ROLE_ENV]
        self.order.append(side)
        factor = next(self.drift) * (self.slowdown if side == "beside" else 1.0)
        for task in self.tasks:
            folder = self.folder / f"{task.name}"
            folder.mkdir(parents=True)
            rows = pd.DataFrame({"test_id": ["a", "b"], "e2e_ms": [100 * factor, 50 * factor], "decode_ms_p50": None})
            rows.to_csv(folder / "rows.csv", index=False)
            ended = self.gone.get(task.copy, 10.0)
            attempt = Attempt(task, f"cpu {task.copy}", folder, None, 0.0, node="n", ended=ended)
            attempt.windows = {"a": (1.0, 2.0), "b": (3.0, 4.0)}
            self.attempts.append(attempt)
        for attempt in self.attempts:
            self.on.ended(attempt, True)


@pytest.mark.parametrize(
    "slowdown, drift, said",
    [
        (1.3, [1.0] * 6, "NOT COMPARABLE for e: beside its neighbours e-build0 ran 1.30x as long (e2e_ms)*"),
        (0.7, [1.0] * 6, "NOT COMPARABLE for e: beside its neighbours e-build0 ran 0.70x as long (e2e_ms)*"),
        (1.0, [1.0, 1.01, 0.99, 1.0, 1.02, 1.01], "comparable for e only: within 5% of alone on every latency*"),
        (1.0, [1.0, 1.3, 1.0, 0.8, 1.1, 1.0], "not shown either way for e: an interval reaches past 5%*"),
    ],
    ids=["interference", "faster-beside", "none", "noise"],
)
def test_the_check_alternates_alone_and_beside_and_judges_the_interval(tmp_path, slowdown, drift, said):
    tasks = [Task("lora-off-build0", ("n0",)), Task("e-build0", ("n1", "n2"))]
    four = [Slot("cpu", ((i,),)) for i in range(4)]
    order, drifts = [], iter(drift)

    def launch(slots, copies, folder):
        assert len(slots) == len(copies) and copies[0].engine_id == "e-build0"
        return _FakeFleet(copies, folder, slowdown, drifts, order)

    lines = run_check(four, tasks, launch, tmp_path, lambda line: None)
    assert order == ["alone", "beside", "beside", "alone", "alone", "beside"]
    ratio = f"{slowdown:.3f}x (95% interval {slowdown:.3f}-{slowdown:.3f}, 3 pairs)" if slowdown != 1 else ""
    assert lines[0].startswith(f"fleet check: e-build0 beside 3 other workers / alone, e2e_ms: {ratio}")
    assert fnmatch.fnmatch(lines[-1], f"fleet check: {said}"), lines
    assert len(lines) == 2  # decode_ms_p50 measured on neither side: no line


def test_a_case_measured_after_a_neighbour_ended_is_not_counted_as_beside(tmp_path):
    """Case b (its rows 1.3 times slower beside, as a) ran after copy 2 ended: only a is
    compared, and the check says why b is left out. With copy 2 gone before a too, no pair
    has a ratio: nothing is told, not "comparable"."""
    tasks, three, said = [Task("e-build0", ("a", "b"))], [Slot("cpu", ((i,),)) for i in range(3)], []

    def check(gone, slowdown):
        def launch(slots, copies, folder):
            return _FakeFleet(copies, folder, slowdown, iter([1.0] * 6), [], gone=gone)

        return run_check(three, tasks, launch, tmp_path / str(gone[2]), said.append, pairs=2)

    lines = check({2: 2.5}, 1.3)
    assert "e2e_ms: 1.300x" in lines[0] and "NOT COMPARABLE" in lines[-1]
    assert sum("1 case(s) of e-build0 measured while not every neighbour ran" in line for line in said) == 2
    said.clear()
    lines = check({2: 0.5}, 1.0)
    assert lines == ["fleet check: e-build0: no latency measured on both sides; nothing to tell"], lines


def test_an_interval_needs_two_pairs():
    assert verdict("e2e_ms", [1.2]) is None
    assert verdict("e2e_ms", [1.2, 1.2]).comparable is False


def test_a_local_worker_gets_its_slots_cores_and_its_tasks_environment_copy_0_on_the_first_slot(tmp_path):
    """The fleet's own plumbing, with a worker that only writes down what it was given."""
    tell = (
        "import json, os, sys; folder = sys.argv[1].split('=', 1)[1]; "
        "json.dump({k: os.environ.get(k) for k in ('LORABENCH_FLEET_CPUS', 'LORABENCH_FLEET_CHECK')}, "
        "open(os.path.join(folder, 'seen.json'), 'w'))"
    )
    two = [Slot("cpu", ((CORES[0],),)), Slot("cpu", ((CORES[-1],),))]
    copies = [Task("e-build0", ("n",), copy=k, env=((ROLE_ENV, "beside"),)) for k in range(2)]
    said, ended = [], []
    lost = []
    on = Callbacks(
        report=None, say=said.append, ended=lambda a, last: ended.append((a, last)), lost=lambda t, why: lost.append(t)
    )
    fleet = LocalFleet(two, copies, [sys.executable, "-c", tell], tmp_path, tmp_path / "fleet", on)
    attempts = fleet.run()
    seen = {a.task.copy: json.loads((a.folder / "seen.json").read_text()) for a in attempts if a.task.attempt == 1}
    assert seen == {
        0: {"LORABENCH_FLEET_CPUS": str(CORES[0]), "LORABENCH_FLEET_CHECK": "beside"},
        1: {"LORABENCH_FLEET_CPUS": str(CORES[-1]), "LORABENCH_FLEET_CHECK": "beside"},
    }
    # The worker ran no case: its task's case is queued again once, on the other slot, then lost.
    assert sorted((a.task.copy, a.task.attempt, last) for a, last in ended) == [
        (0, 1, False), (0, 2, True), (1, 1, False), (1, 2, True)
    ]  # fmt: skip
    assert [a.where for a in attempts if a.task.copy == 0] == [two[0].label, two[1].label] and len(lost) == 2


def test_what_a_workers_summary_says_of_its_build_reaches_the_sessions(tmp_path):
    from lorabench.pytest_plugin.fleet_driver import _notes

    (tmp_path / "pytest.log").write_text(
        "lorabench: 1 of 1 engine builds done\n"
        "peak memory of e-build0: device memory unreadable (npu-smi not found on PATH); process RSS instead\n"
        "the device memory of e-build0 was not released: 900 MiB still held\n"
    )
    attempt = Attempt(Task("e-build0", ("n",)), "npu 3", tmp_path, None, 0.0)
    assert _notes(attempt) == [
        "peak memory of e-build0: device memory unreadable (npu-smi not found on PATH); process RSS instead",
        "the device memory of e-build0 was not released: 900 MiB still held",
    ]
