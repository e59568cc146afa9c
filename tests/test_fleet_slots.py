"""What a fleet's verdicts cover: builds of one configuration on slots of one size (unequal
NUMA nodes are not averaged as replicates), and an interference check that names the
configuration its verdict is of and those it did not measure. Stand-ins and fake slots only."""

from __future__ import annotations

import pandas as pd
import pytest

import lorabench.fleet.devices as devices
from lorabench.fleet.check import Verdict, coverage, lines
from lorabench.fleet.devices import Slot, equal_slots
from lorabench.pytest_plugin.fleet_driver import fleet_slots
from tests.helpers import result_files
from tests.test_fleet import CORES, TWO_CORES, _fleet_dir


class _Config:
    """What ``fleet_slots`` reads of a pytest config: ``--bench-devices``, or nothing."""

    def __init__(self, named: str | None) -> None:
        self.named = named
        self.inipath = None

    def getoption(self, name: str):  # noqa: ANN201
        return self.named if name == "bench_devices" else None

    def getini(self, name: str) -> str:
        return ""


def _numa(monkeypatch, tmp_path, nodes: dict[int, str], allowed: set[int]) -> None:
    monkeypatch.setattr(devices, "NODES", tmp_path)
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: set(allowed))
    for number, cpulist in nodes.items():
        (tmp_path / f"node{number}").mkdir()
        (tmp_path / f"node{number}" / "cpulist").write_text(cpulist + "\n")


def test_unequal_numa_nodes_keep_the_equal_slots_and_the_run_says_which_idle(tmp_path, monkeypatch):
    """A process allowed cores 0-16 of a host whose second node it barely reaches: its NUMA
    nodes are 16 cores and 1. A configuration's two builds on them were averaged as replicates."""
    _numa(monkeypatch, tmp_path, {0: "0-15", 1: "16-31"}, set(range(17)))
    kept, said = fleet_slots(_Config(None), "cpu", 1)
    assert [s.label for s in kept] == ["cpu 0-15"]
    assert said == [
        "fleet: left idle cpu 16: 1 core, against 16 on each of cpu 0-15: builds of one configuration run on "
        "slots of one size, not averaged across engines of another (name equal sets with --bench-devices)"
    ]


def test_equal_numa_nodes_are_all_kept_and_nothing_is_said(tmp_path, monkeypatch):
    _numa(monkeypatch, tmp_path, {0: "0-3", 1: "4-7"}, set(range(8)))
    kept, said = fleet_slots(_Config(None), "cpu", 1)
    assert [s.label for s in kept] == ["cpu 0-3", "cpu 4-7"] and said == []


def test_named_sets_of_unequal_size_are_refused_before_any_engine(monkeypatch, capsys):
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: set(range(17)))
    with pytest.raises(pytest.exit.Exception) as stopped:
        fleet_slots(_Config("0-15,16"), "cpu", 1)
    assert stopped.value.returncode == 2
    assert capsys.readouterr().err.splitlines() == [
        "lorabench: --bench-devices 0-15,16: sets of unequal size (cpu 0-15: 16, cpu 16: 1 cores): a "
        "configuration's builds on them would be averaged as replicates; name sets of one size, such as "
        "0-7,8-15 (docs/fleet.md#devices)"
    ]


def _cpu(*sizes: int) -> list[Slot]:
    start, out = 0, []
    for size in sizes:
        out.append(Slot("cpu", (tuple(range(start, start + size)),)))
        start += size
    return out


@pytest.mark.parametrize(
    "sizes, kept",
    [
        ((8, 8, 4), [8, 8]),  # the most cores
        ((8, 4, 4, 4), [4, 4, 4]),  # 12 cores on three slots against 8 on one
        ((8, 4, 4), [8]),  # a tie: the larger slots, each engine nearer a sequential run's
        ((4, 4), [4, 4]),
    ],
)
def test_the_equal_slots_kept_are_those_with_the_most_cores(sizes, kept):
    found = _cpu(*sizes)
    chosen, idle = equal_slots(found)
    assert [s.size for s in chosen] == kept
    assert sorted(chosen + idle, key=found.index) == found


def test_engines_of_two_devices_are_equal_by_each_devices_cores_not_their_sum():
    """Tensor parallel on the CPU: 2+6 cores is not 4+4, though both are 8."""
    a = Slot("cpu", ((0, 1), (2, 3, 4, 5, 6, 7)))
    b = Slot("cpu", ((8, 9, 10, 11), (12, 13, 14, 15)))
    c = Slot("cpu", ((16, 17, 18, 19), (20, 21, 22, 23)))
    assert equal_slots([a, b, c]) == ([b, c], [a])


def _verdicts(ratio: float) -> list[Verdict]:
    return [Verdict("e2e_ms", ratio, ratio - 0.01, ratio + 0.01, 3)]


@pytest.mark.parametrize(
    "ratio, said",
    [
        (1.0, "fleet check: comparable for loras2-rank16-cpu4 only: within 5% of alone on every latency; its rows"),
        (1.3, "fleet check: NOT COMPARABLE for loras2-rank16-cpu4: beside its neighbours loras2-rank16-cpu4-build0"),
        (1.05, "fleet check: not shown either way for loras2-rank16-cpu4: an interval reaches past 5%"),
    ],
)
def test_the_checks_verdict_names_the_configuration_it_measured(ratio, said):
    assert lines("loras2-rank16-cpu4-build0", 1, _verdicts(ratio))[-1].startswith(said)


def test_the_configurations_the_check_did_not_measure_are_named_not_implied_comparable():
    ids = ["lora-off-build0", "lora-off-build1", "loras2-rank16-cpu4-build0", "loras2-rank16-cpu4-build1"]
    ids += ["loras8-rank16-cpu4-build0", "loras8-rank16-cpu4-build1"]
    assert coverage("loras2-rank16-cpu4-build0", ids) == [
        "fleet check: not checked: lora-off, loras8-rank16-cpu4 (2 of the 3 configurations selected): the verdict "
        "is loras2-rank16-cpu4's alone; check another with -k selecting its cases"
    ]
    assert coverage("loras2-rank16-cpu4-build0", ids[2:4]) == []  # its builds are the configuration checked


@TWO_CORES
@pytest.mark.engine  # no vLLM, but a whole check of two fleets of two workers: 20-35 s, and timing-bound
def test_a_check_of_a_grid_says_which_configurations_its_verdict_covers(pytester):
    """The stand-in feels no neighbours: the verdict may be comparable, and must then say of
    which configuration, and name the two the check never ran."""
    config = _fleet_dir(pytester, engine={"max_loras": [1, 2]}, matrix={"builds": 1, "batch_sizes": [2]})
    devices_arg = f"--bench-devices={CORES[0]},{CORES[1]}"
    result = pytester.runpytest(
        "--bench-config", str(config), "--bench-fleet", "local", devices_arg, "--bench-fleet-check",
        "--bench-fleet-check-pairs", "2", "-k", "multilora or no_lora",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    out = result.stdout.str()
    verdict = [line for line in out.splitlines() if line.startswith("fleet check: ") and " for loras1-" in line]
    assert len(verdict) == 1, out
    unchecked = [line for line in out.splitlines() if line.startswith("fleet check: not checked: ")]
    assert len(unchecked) == 1 and "lora-off" in unchecked[0] and "loras2-" in unchecked[0], out
    assert "(2 of the 3 configurations selected)" in unchecked[0] and "loras1-" not in unchecked[0].split(":")[2]


@TWO_CORES
def test_a_fleet_on_unequal_numa_nodes_runs_on_the_equal_ones_and_its_run_says_so(pytester, monkeypatch, tmp_path):
    """This host's two cores as one NUMA node, and a node of one core beside (made up: it is
    never run on). Both builds of the configuration run on the two cores, and the run's
    output says which slot idled and why, at the start and in the summary. One configuration
    (two workers, one after the other): its two builds are tasks enough to reach an idle slot
    that was kept, and a second configuration only doubled the run (4 s on a 2-core host)."""
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    _numa(monkeypatch, nodes, {0: f"{CORES[0]},{CORES[1]}", 1: "999"}, {CORES[0], CORES[1], 999})
    config = _fleet_dir(pytester, engine={"max_loras": 1}, matrix={"batch_sizes": [2], "workloads": ["distinct"]})
    result = pytester.runpytest("--bench-config", str(config), "--bench-fleet", "local", "-k", "multilora")
    assert result.ret == 0, result.stdout.str()
    said = [line for line in result.stdout.str().splitlines() if line.startswith("fleet: left idle cpu 999: 1 core")]
    assert len(said) == 2, result.stdout.str()  # at the start, and in the summary
    (csv,) = result_files(pytester.path / "results")
    rows = pd.read_csv(csv)
    assert set(rows["fleet_devices"]) == {Slot("cpu", ((CORES[0], CORES[1]),)).label}
    assert rows["build"].nunique() == 2


def test_a_host_of_an_odd_number_of_cores_is_halved_evenly(tmp_path, monkeypatch):
    """7 cores on one node: 0-2 and 3-6 were unequal, so only one slot ran; now 0-2 and 3-5."""
    _numa(monkeypatch, tmp_path, {0: "0-6"}, set(range(7)))
    assert devices.default_devices("cpu") == [(0, 1, 2), (3, 4, 5)]
