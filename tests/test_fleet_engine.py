"""The local fleet on the real CPU engine: two one-core devices, each worker a real pytest
process building real vLLM engines pinned to its core."""

import os

import pandas as pd
import psutil
import pytest

from tests.helpers import ROOT, default_config, result_files

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two one-core devices need two cores"),
]
CORES = sorted(os.sched_getaffinity(0))[:2]


def _workers_left(folder) -> list[str]:
    """Processes still running a worker of this fleet (their command names its folder)."""
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or ())
        if str(folder) in cmdline and "--bench-fleet-worker" in cmdline:
            left.append(f"{proc.pid}: {cmdline}")
    return left


def test_a_fleet_of_two_cores_runs_both_configurations_and_checks_its_interference(pytester, tmp_path):
    """The issue's own selection of the default config, one build each: both LoRA
    configurations at once, one on each core; then the interference check on one of them."""
    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
    path = default_config(tmp_path)
    devices = f"--bench-devices={CORES[0]},{CORES[1]}"
    selection = ["--bench-config", str(path), "--bench-builds", "1", "--bench-fleet", "local", devices]
    fleet = pytester.runpytest_subprocess(*selection, "-k", "identical and bs4", timeout=600)
    fleet.assert_outcomes(passed=2)
    (csv,) = result_files(tmp_path / "results")
    rows = pd.read_csv(csv)
    engines = ["loras2-rank16-cpu12-build0", "loras8-rank16-cpu12-build0"]
    assert sorted(rows["engine_id"]) == engines
    assert rows["run_id"].nunique() == 1 and (rows["e2e_ms"] > 0).all() and (rows["digest_mismatches"] == 0).all()
    assert sorted(rows["fleet_devices"]) == [f"cpu {CORES[0]}", f"cpu {CORES[1]}"]
    # Each engine saw one core: vLLM's CPU backend read the worker's affinity.
    assert (rows["device_count"] == 1).all()
    assert dict(zip(rows["engine_id"], rows["fleet_neighbours"])) == dict(zip(engines, engines[::-1]))
    assert not _workers_left(csv.with_suffix(".logs"))

    pairs = ["--bench-fleet-check", "--bench-fleet-check-pairs", "2"]
    check = pytester.runpytest_subprocess(*selection, "-k", "identical and bs4 and loras2", *pairs, timeout=900)
    assert check.ret == 0, check.stdout.str()
    check.stdout.fnmatch_lines(
        [
            "fleet check: loras2-rank16-cpu12-build0 beside 1 other worker / alone, e2e_ms: *x (95% *, 2 pairs)",
            "fleet check: *",
        ]
    )
    assert not _workers_left(tmp_path)
