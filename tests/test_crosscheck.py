"""scripts/crosscheck_vllm_latency.py's statistics and the switch that turns lorabench's CPU binding off.

No engine: the binding is checked on stand-in processes with os.sched_setaffinity replaced.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import psutil
import pytest

from lorabench import processes


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
