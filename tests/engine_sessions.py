"""Benchmark sessions on real engines that several tests read, each run once per test session.

A session on real engines costs an interpreter that imports vLLM and a build per engine
configuration (10-20 s each on a 2-core CPU), or a ``vllm serve`` start (30-60 s). Tests that
only read what a session wrote share one: a session-scoped fixture runs it once and hands out
its output, its result rows and what was left running after it; each test asserts its own
part. Tests of the build itself (a build that fails, a run interrupted mid-build) keep their
own sessions. The fixtures are imported into ``tests/conftest.py``, so that every test file
shares one run of each.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import psutil
import pytest

from lorabench.load import builtin
from lorabench.targets.http.serve import port_free
from tests.helpers import ROOT, generate_adapters, result_files, write_tiny_config


@dataclass
class BenchSession:
    """One finished benchmark session: pytest's result, its result file and rows, and the
    processes and port state right after it ended (later tests may start processes)."""

    folder: Path
    result: pytest.RunResult
    csv: Path
    rows: pd.DataFrame
    children_before: set[int]
    children_after: set[int]
    vllm_left: list[str]
    ports_free: dict[int, bool]

    def passed(self, module: str) -> int:
        """How many cases of the bench module ``module`` passed (the session runs with -rp)."""
        return sum(line.startswith(f"PASSED {module}.py::") for line in self.result.outlines)

    def failed(self, but: str | None = None) -> list[str]:
        """The short summary's failed and erroring cases (-rfE), but those of the bench module
        ``but`` (one whose case fails on a finding, which its own test reads)."""
        lines = [line for line in self.result.outlines if line.startswith(("FAILED ", "ERROR "))]
        return [line for line in lines if but is None or f" {but}.py::" not in line]


def run_bench(folder: Path, *args: str, timeout: float) -> pytest.RunResult:
    """pytest on the bench modules in ``folder``, in an interpreter of its own, as
    ``pytester.runpytest_subprocess`` runs it (a session-scoped fixture cannot use pytester):
    HOME in the folder, the user's model cache, no xdist worker's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_") and k != "PYTEST_ADDOPTS"}
    env.update(HOME=str(folder), LORABENCH_CACHE_DIR=str(builtin.cache_dir()), PY_COLORS="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "pytest", f"--basetemp={folder / 'basetemp'}", "-rfEp", *args]
    started = time.perf_counter()
    # A session of its own, so that a run past its timeout is killed with its engine processes.
    with subprocess.Popen(
        command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\nrun_bench: killed after {timeout} s"
    print(out, err, sep="\n")  # shown when a test reading the session fails
    return pytest.RunResult(proc.returncode, out.splitlines(), err.splitlines(), time.perf_counter() - started)


def bench_session(folder: Path, modules: tuple[str, ...], *args: str, timeout: float) -> BenchSession:
    """Copy the bench ``modules`` into ``folder`` and run them with ``args``; the session."""
    for name in modules:
        (folder / f"{name}.py").write_text((ROOT / "bench" / f"{name}.py").read_text())
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = run_bench(folder, *args, timeout=timeout)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    vllm_left = [
        " ".join(p.info["cmdline"])
        for p in psutil.process_iter(["cmdline"])
        if "vllm.entrypoints" in " ".join(p.info["cmdline"] or [])
    ]
    files = result_files(folder / "results")
    csv = files[0] if len(files) == 1 else folder / "no-single-result-file.csv"
    rows = pd.read_csv(csv) if csv.is_file() else pd.DataFrame()
    endpoints = rows["endpoint"].dropna() if "endpoint" in rows else pd.Series(dtype=str)
    ports = {int(e.rsplit(":", 1)[1]): False for e in endpoints if e.startswith("http")}
    return BenchSession(folder, result, csv, rows, before, after, vllm_left, {port: port_free(port) for port in ports})


# The serve session's blocks: a batch case, a trace, the residency tiers, a working set and
# churn, all on one vllm serve, and the isolation canaries on one with prefix caching (each
# test file says what it checks of its part).
SERVE_ONLINE = {"suites": [{"num_adapters": [2], "rate": [4], "duration": 2.0, "output_range": [16, 32]}]}
SERVE_CHURN_SUITE = {"name": "ch", "num_adapters": [2], "rate": [4], "duration": 3, "input_range": [8, 32]}
SERVE_CHURN = {"rate": [4], "adapters": 2, "suites": [{**SERVE_CHURN_SUITE, "output_range": [2, 4]}]}
SERVE_MODULES = (
    "test_multilora",
    "test_multilora_online",
    "test_multilora_residency",
    "test_multilora_working_set",
    "test_multilora_churn",
    "test_isolation",
)


@pytest.fixture(scope="session")
def serve_session(tmp_path_factory: pytest.TempPathFactory) -> BenchSession:
    """Every scenario that runs through ``vllm serve``, in one session on one server, started
    and stopped by lorabench (tests/test_http_serve.py, test_http_residency_engine.py and
    test_churn_engine.py read it)."""
    folder = tmp_path_factory.mktemp("serve")
    config = write_tiny_config(
        folder,
        # 160 tokens: the canaries' prompts are a KV block (128 on the CPU) and 8 more.
        engine={"max_loras": 2, "max_lora_rank": 16, "max_cpu_loras": 4, "max_model_len": 160},
        matrix={"workloads": ["distinct"]},
        online=SERVE_ONLINE,
        residency={"requests": 2},
        working_set={"sizes": [3], "cycles": 1, "min_requests": 2, "output_len": 4},
        churn=SERVE_CHURN,
    )
    args = ("--bench-config", str(config), "--bench-target", "serve", "-p", "no:cacheprovider")
    return bench_session(folder, SERVE_MODULES, *args, timeout=900)


def fast_base(path: Path, speedup: float = 20) -> Path:
    """Two builds of a made-up run of the compare tests' small matrix, far faster than this machine."""
    rows = pd.read_csv(ROOT / "tests" / "data" / "default-run.csv")
    base_rows = rows[
        (rows.workload == "identical") & (rows.batch_size == 4) & (rows.max_loras == 2) & (rows.build < 2)
    ].copy()
    assert sorted(base_rows["build"]) == [0, 1]
    for column, value in {
        "batch_size": 2,
        "input_len": 16,
        "output_len": 4,
        "max_loras": 1,
        "max_cpu_loras": 4,
    }.items():
        base_rows[column] = value
    fast = [
        c
        for c in base_rows.columns
        if c.split("_p")[0] in ("ttft_ms", "prefill_ms", "decode_ms", "e2e_ms", "request_e2e_ms")
    ]
    base_rows[fast] /= speedup
    base_rows["output_tokens_per_s"] *= speedup
    base_rows["run_id"] = f"fast-{speedup}"
    base_rows.to_csv(path, index=False)
    return path


@pytest.fixture(scope="session")
def compare_session(tmp_path_factory: pytest.TempPathFactory) -> BenchSession:
    """A real run of two builds of one configuration, compared in its session with a made-up
    base far faster than this machine (``base.csv`` in its folder), with --bench-compare-fail
    (tests/test_plugin.py reads it, and compares it again against a noise floor), and added
    to the history in ``history.db`` (tests/test_history.py)."""
    folder = tmp_path_factory.mktemp("compare")
    path = write_tiny_config(
        folder, engine={"max_loras": 1}, matrix={"workloads": ["identical"], "input_len": 16, "rounds": 2}
    )
    base = fast_base(folder / "base.csv")
    args = ("--bench-config", str(path), "-k", "multilora", "-p", "no:cacheprovider", "--bench-builds", "2")
    compare = ("--bench-compare", str(base), "--bench-compare-fail", "--bench-history", str(folder / "history.db"))
    return bench_session(folder, ("test_no_lora", "test_multilora"), *args, *compare, timeout=900)


# The in-process replay session's blocks: two synthetic traces and churn on one build.
ONLINE_WARMUP_S = 1
SMOKE_SUITE = {
    "name": "smoke",
    "num_adapters": [4],
    "alpha": [0.3],
    "rate": [4],
    "duration": 5,
    "input_range": [8, 32],
    "output_range": [4, 12],
}
TIMELINE_SUITE = {"name": "tl", "num_adapters": [4], "rate": [6], "duration": 3, "input_range": [8, 32]}
CHURN_SUITE = {"name": "ch", "num_adapters": [2], "rate": [5], "duration": 4, "input_range": [8, 32]}
CHURN = {"rate": [4], "adapters": 2, "warmup_s": 0.5, "suites": [{**CHURN_SUITE, "output_range": [4, 12]}]}


@pytest.fixture(scope="session")
def replay_session(tmp_path_factory: pytest.TempPathFactory) -> BenchSession:
    """Trace replays on one in-process engine, adapters made with ``lorabench adapters
    generate``, and a report: the ``smoke`` trace (tests/test_plugin.py), the ``tl`` trace's
    timeline (test_timeline.py) and a churn case (test_churn_engine.py)."""
    folder = tmp_path_factory.mktemp("replay")
    config = write_tiny_config(
        folder,
        adapters=str(generate_adapters(folder / "loras", 4, "8,16")),
        engine={"max_loras": 2, "max_cpu_loras": 4, "max_num_seqs": 32},
        online={
            "warmup_s": ONLINE_WARMUP_S,
            "suites": [SMOKE_SUITE, {**TIMELINE_SUITE, "output_range": [4, 12]}],
        },
        churn=CHURN,
    )
    args = ("--bench-config", str(config), "-p", "no:cacheprovider", "--bench-report", str(folder / "report"))
    return bench_session(folder, ("test_multilora_online", "test_multilora_churn"), *args, timeout=900)
