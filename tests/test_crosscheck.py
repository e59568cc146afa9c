"""scripts/crosscheck_vllm_latency.py's statistics and the switch that turns lorabench's CPU binding off.

No engine: the binding is checked on stand-in processes with os.sched_setaffinity replaced,
the script's main on stand-in builds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import pytest

from lorabench.host import processes

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "crosscheck_vllm_latency.py"
T_975_2DF = 4.302652729749462  # Student's t, 97.5th percentile, 2 degrees of freedom


@pytest.fixture(scope="module")
def crosscheck():
    spec = importlib.util.spec_from_file_location("crosscheck_vllm_latency", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stand_in(cpus: set[int], tid: int) -> SimpleNamespace:
    """A process as keep_off_worker_cpus reads it: its affinity and its threads."""
    return SimpleNamespace(cpu_affinity=lambda: sorted(cpus), threads=lambda: [SimpleNamespace(id=tid)])


@pytest.fixture
def bound(monkeypatch):
    """The (thread, cpus) pairs keep_off_worker_cpus would bind, on four cores, nothing bound for real."""
    calls: list[tuple[int, set[int]]] = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, cpus: calls.append((tid, set(cpus))))
    return calls


ENGINE = [stand_in({2, 3}, tid=-2), stand_in({0, 1, 2, 3}, tid=-1)]  # a bound worker, the engine core


@pytest.mark.parametrize("value", [None, "on", "ON", "1"])
def test_binding_is_on_unless_switched_off(monkeypatch, bound, value):
    if value is None:
        monkeypatch.delenv(processes.CPU_BINDING, raising=False)
    else:
        monkeypatch.setenv(processes.CPU_BINDING, value)
    undo = processes.keep_off_worker_cpus(ENGINE)
    assert undo is not None
    mine = {t.id for t in psutil.Process().threads()}
    assert {tid for tid, _ in bound} == mine | {-1}  # this process and the engine core, not the worker
    assert all(cpus == {0, 1} for _, cpus in bound)


@pytest.mark.parametrize("value", ["off", "Off", "0", "false", "no"])
def test_off_binds_nothing(monkeypatch, bound, value):
    monkeypatch.setenv(processes.CPU_BINDING, value)
    assert processes.keep_off_worker_cpus(ENGINE) is None
    assert bound == []


def test_paired_interval_has_the_known_answer(crosscheck):
    # log ratios 0.1, 0.2, 0.3 over builds of very different speeds: mean 0.2, sd 0.1, 3 pairs
    bottom = [100.0, 200.0, 50.0]
    top = [b * math.exp(d) for b, d in zip(bottom, (0.1, 0.2, 0.3))]
    r = crosscheck.paired_ratio(top, bottom)
    half = T_975_2DF * 0.1 / math.sqrt(3)
    assert r["pairs"] == 3
    assert r["ratio"] == pytest.approx(math.exp(0.2))
    assert r["low"] == pytest.approx(math.exp(0.2 - half))
    assert r["high"] == pytest.approx(math.exp(0.2 + half))
    assert r["half_width_pct"] == pytest.approx(100 * (math.exp(half) - 1))


def test_a_planted_ratio_is_found_through_large_build_to_build_spread(crosscheck):
    rng = np.random.default_rng(0)
    vllm = 120.0 * np.exp(rng.normal(0.0, 0.25, 8))  # builds differ by some 25 %
    # Each pair's ratio 1.10 with 1 % noise, centred: drawn freely, 1 seed in 20 would
    # rightly leave 1.10 outside a 95 % interval (seed 0 does).
    noise = rng.normal(0.0, 0.01, 8)
    lorabench = vllm * 1.10 * np.exp(noise - noise.mean())
    r = crosscheck.paired_ratio(list(lorabench), list(vllm))
    assert r["low"] < 1.10 < r["high"]
    assert r["low"] > 1.0
    assert r["half_width_pct"] < 3
    # Unpaired (each lorabench build against another repeat's vLLM build) it could not tell.
    unpaired = crosscheck.paired_ratio(list(lorabench), list(np.roll(vllm, 1)))
    assert unpaired["low"] < 1.0 < unpaired["high"]


def test_one_pair_gives_a_ratio_without_interval(crosscheck):
    r = crosscheck.paired_ratio([110.0], [100.0])
    assert r["ratio"] == pytest.approx(1.1) and r["low"] is None and r["half_width_pct"] is None
    with pytest.raises(ValueError):
        crosscheck.paired_ratio([1.0, 2.0], [1.0])


def test_builds_alternate_and_pair_by_repeat(crosscheck):
    order, snapshots = [], []

    def run(name):
        return lambda i: order.append((name, i)) or {"name": name, "repeat": i}

    builds = crosscheck.alternate(
        {"a": run("a"), "b": run("b")}, 3, lambda ordered, by_name: snapshots.append(len(ordered))
    )
    assert order == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]
    assert [b["repeat"] for b in builds["a"]] == [0, 1, 2] and [b["name"] for b in builds["a"]] == ["a"] * 3
    assert [b["order"] for b in builds["b"]] == [1, 2, 5]
    assert snapshots == [1, 2, 3, 4, 5, 6]


def test_the_vllm_side_binds_right_after_its_build_as_engine_py_does(crosscheck, monkeypatch):
    log = []
    monkeypatch.setattr(processes, "children", lambda: log.append("children") or {1})
    monkeypatch.setattr(processes, "started_since", lambda before: log.append(("since", before)) or ["core"])
    monkeypatch.setattr(processes, "keep_off_worker_cpus", lambda procs: log.append(("bind", procs)) or print)

    class LLM:
        def __init__(self, model):
            log.append(("build", model))

    bound = crosscheck.bind_after_build(LLM)
    LLM("tiny")
    assert log == ["children", ("build", "tiny"), ("since", {1}), ("bind", ["core"])]
    assert bound == [True]


class StandIn:
    """Builds whose mean e2e is known: vLLM's 100 ms times a per-repeat factor, lorabench's
    1.2 times that with binding on, 1.1 with it off."""

    runs: list[tuple[str, str, int]] = []

    def __init__(self, args, config_path, folder):
        pass

    def vllm(self, binding, i):
        self.runs.append(("vllm", binding, i))
        return {"side": "vllm", "binding": binding, "repeat": i, "mean_ms": 100.0 * (1 + 0.3 * i)}

    def lorabench(self, binding, i):
        self.runs.append(("lorabench", binding, i))
        mean_ms = 100.0 * (1 + 0.3 * i) * (1.2 if binding == "on" else 1.1)
        return {"side": "lorabench", "binding": binding, "repeat": i, "mean_ms": mean_ms}


@pytest.mark.parametrize(
    ("options", "of", "ratio", "bindings"),
    [
        ({}, "lorabench/vllm", 1.2, {"on"}),
        ({"binding": "off"}, "lorabench/vllm", 1.1, {"off"}),
        ({"compare_binding": True}, "on/off", 1.2 / 1.1, {"on", "off"}),
    ],
)
def test_main_reports_and_records_the_ratio(crosscheck, monkeypatch, tmp_path, capsys, options, of, ratio, bindings):
    monkeypatch.setattr(crosscheck, "Sides", StandIn)
    StandIn.runs = []
    out = tmp_path / "crosscheck.json"
    parser = argparse.ArgumentParser()
    crosscheck.add_cli_args(parser)
    args = parser.parse_args(["--repeats", "3", "--out", str(out)])
    vars(args).update(options)
    assert crosscheck.main(args) == 0
    assert {binding for _, binding, _ in StandIn.runs} == bindings
    assert ("vllm" in {side for side, _, _ in StandIn.runs}) != bool(options.get("compare_binding"))
    recorded = json.loads(out.read_text())
    assert [b["order"] for b in recorded["builds"]] == list(range(6))
    summary = recorded["summary"]["ratio"]
    assert summary["of"] == of and summary["ratio"] == pytest.approx(ratio) and summary["pairs"] == 3
    assert summary["half_width_pct"] == pytest.approx(0.0, abs=1e-9)
    printed = capsys.readouterr().out
    assert f"ratio {of} {ratio:.3f}" in printed and recorded["cpu"] in printed
    assert printed.count("crosscheck: so far ratio") == 2  # after pairs 1 and 2, not 3
