"""Finished results survive interruptions, and failures stay inside their configuration.

The interruption tests run the real benchmark in a real subprocess on a real engine."""

import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import pandas as pd
import psutil
import pytest

from lorabench.results.schema import COLUMNS
from tests.helpers import ROOT, make_row, make_sample, result_files


def _read_rows(results):
    csvs = result_files(results)
    return (csvs[0], pd.read_csv(csvs[0])) if csvs else (None, None)


def _alive(procs):
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
@pytest.mark.engine
@pytest.mark.vllm_processes  # every process of vLLM's own layout gone after the kill
def test_interrupted_run_keeps_every_finished_row(tmp_path, tiny_config, sig):
    path = tiny_config(
        engine={"max_loras": 2},
        matrix={"batch_sizes": [2, 4], "workloads": ["distinct", "uniform", "identical"], "rounds": 2},
    )
    log = (tmp_path / "log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            str(ROOT / "bench" / "test_multilora.py"),
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            "--bench-config",
            str(path),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 300
    rows = None
    while time.monotonic() < deadline and proc.poll() is None:
        _, rows = _read_rows(tmp_path / "results")
        if rows is not None and len(rows) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    engine_procs = psutil.Process(proc.pid).children(recursive=True)
    assert any("EngineCore" in p.name() for p in engine_procs)
    proc.send_signal(sig)
    proc.wait(timeout=120)

    csv, rows = _read_rows(tmp_path / "results")
    assert 2 <= len(rows) < 6, "finished cases are on disk, the interrupted one is not"
    assert list(rows.columns) == list(COLUMNS)
    assert rows[["e2e_ms", "ttft_ms", "decode_ms", "peak_memory_mb"]].notna().all().all()
    samples = pd.read_csv(csv.with_name(csv.stem + ".samples.csv"))
    per_case = samples.groupby(["engine_id", "workload", "batch_size"]).size()
    for _, row in rows.iterrows():
        assert per_case[(row.engine_id, row.workload, row.batch_size)] == row.rounds * row.batch_size
    output = (tmp_path / "log").read_text()
    if sig == signal.SIGTERM:
        assert proc.returncode != 0 and "KeyboardInterrupt: received signal 15" in output
        assert "results: " in output, "the summary still prints"
    # No engine process outlives the run, even after kill -9.
    deadline = time.monotonic() + 60
    while _alive(engine_procs) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(engine_procs)


# One run's writer, in an interpreter that imports only the writer and its records (a
# spawned process imported this module: pandas, pytest and the helpers, 0.6 s each). It
# says when it is ready, then on "go" appends 50 cases of 3 samples, all four at once.
APPEND_MANY = """
import json, sys
from pathlib import Path
from lorabench.results.files import ResultWriter
from lorabench.results.records import Sample
from lorabench.results.schema import ResultRow

path, worker, row, sample = json.loads(sys.argv[1])
writer = ResultWriter(Path(path).parent, Path(path), "c", False)
print("ready", flush=True)
sys.stdin.readline()
for i in range(50):
    samples = [Sample(**{**sample, "request": r}) for r in range(3)]
    writer.append(ResultRow(**{**row, "test_id": f"{worker}-{i}"}), samples)
"""


def test_concurrent_runs_on_one_fixed_file_never_mix_rows(tmp_path):
    path = tmp_path / "shared.csv"
    row, sample = asdict(make_row()), asdict(make_sample())
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", APPEND_MANY, json.dumps([str(path), w, row, sample])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for w in range(4)
    ]
    assert [w.stdout.readline() for w in workers] == ["ready\n"] * 4
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.close()
    assert [w.wait(60) for w in workers] == [0] * 4
    rows = pd.read_csv(path)
    assert sorted(rows["test_id"]) == sorted(f"{w}-{i}" for w in range(4) for i in range(50))
    assert len(pd.read_csv(tmp_path / "shared.samples.csv")) == 4 * 50 * 3


FAILING_CONFTEST = '''
import psutil
import pytest

killed = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    """Kill loras2's engine core for real once its first case has passed."""
    if report.when == "call" and "loras2-" in report.nodeid and report.passed and not killed:
        for child in psutil.Process().children(recursive=True):
            if "EngineCore" in child.name():
                child.kill()
                # Dead before the next case starts: this process and the engine core share
                # a core, so the kill may otherwise land after the next request was sent.
                psutil.wait_procs([child], timeout=30)
                killed.append(child.pid)


@pytest.fixture(autouse=True, scope="session")
def _refuse_loras1():
    """Stands in for a configuration vLLM refuses to build."""
    from lorabench.targets import engine

    real_enter = engine.Engine.__enter__

    def enter(self):
        if self.spec.id.startswith("loras1-"):
            raise RuntimeError("Engine core initialization failed (simulated)")
        return real_enter(self)

    engine.Engine.__enter__ = enter
    yield
    engine.Engine.__enter__ = real_enter
'''


@pytest.mark.engine
@pytest.mark.vllm_processes  # a dead engine core's spawned worker is reaped too
def test_a_failed_or_dead_engine_fails_only_its_own_cases(pytester, tiny_config, tmp_path):
    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
    pytester.makeconftest(FAILING_CONFTEST)
    path = tiny_config(engine={"max_loras": [1, 2, 4]})
    result = pytester.runpytest_subprocess("--bench-config", str(path), "-p", "no:cacheprovider", timeout=400)
    result.assert_outcomes(passed=3, failed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*engine configuration loras1-rank16-cpu4-build0 failed to build: "
            "RuntimeError: Engine core initialization failed (simulated)*",
            "*engine loras2-rank16-cpu4-build0 died: *test_multilora*: EngineDied: engine process * is gone*",
            "engine builds: 2 (loras2-rank16-cpu4-build0 *, loras4-rank16-cpu4-build0 *)",
        ]
    )
    assert "Traceback" not in result.stdout.str()
    _, rows = _read_rows(tmp_path / "results")
    assert sorted(rows["engine_id"]) == [
        "loras2-rank16-cpu4-build0",
        "loras4-rank16-cpu4-build0",
        "loras4-rank16-cpu4-build0",
    ]
