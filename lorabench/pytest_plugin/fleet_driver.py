"""The fleet's driver (``--bench-fleet local``): the session collects and checks as always,
then, instead of running its cases, hands each engine configuration x build to a worker on
a slot of this node's devices (``lorabench.fleet.local``), shows the workers' test reports
as its own, and adopts each worker's run into the session's (``lorabench.results.merge``):
one run, one run id, the keys a sequential run has, so ``compare`` and the history take it
as one. The end of the session (report, history, comparison) then works on that run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from lorabench.config.target import URL
from lorabench.fleet import ray_cluster
from lorabench.fleet.check import coverage
from lorabench.fleet.devices import DeviceError, Slot, chosen_devices, equal_slots, idle_line, slots, unequal
from lorabench.fleet.local import LocalFleet
from lorabench.fleet.merging import InOrder
from lorabench.fleet.tasks import LOG_FILE, Attempt, Callbacks, Fleet, Halted, Task, worker_command
from lorabench.pytest_plugin import options
from lorabench.pytest_plugin.bench_items import ENGINE_FIXTURE
from lorabench.pytest_plugin.fixtures import state_for_run
from lorabench.pytest_plugin.session import BenchState
from lorabench.pytest_plugin.terminal import say

# Provenance of the run, not of a worker: the same on every row, as in one session. On an
# accelerator the session's device count too (a worker sees its own slot's); on the CPU a
# worker's cores are what its engine had, so its count stays (docs/fleet.md#one-run).
RUN_COLUMNS = ("run_id", "git_commit", "git_dirty", "hostname")


def run_columns(provenance: dict[str, Any], device_type: str) -> dict[str, Any]:
    names = RUN_COLUMNS if device_type == "cpu" else (*RUN_COLUMNS, "device_count")
    return {name: provenance[name] for name in names}


def fleet_slots(config: pytest.Config, device_type: str, per_engine: int) -> tuple[list[Slot], list[str]]:
    """The slots of ``--bench-fleet local``, all of one size, and the line that says which were
    left idle for it; bad devices, and named sets of unequal size, are bad input (refused, exit 2)."""
    named = options.value(config, "bench_devices")
    try:
        found = slots(chosen_devices(named, device_type), device_type, per_engine)
    except DeviceError as exc:
        options.refuse([str(exc)])
    kept, idle = equal_slots(found)
    if idle and named:
        options.refuse([unequal(named, found)])
    return kept, [idle_line(kept, idle)] if idle else []


def fleet_tasks(items: Sequence[pytest.Item]) -> list[Task]:
    """One task per engine configuration x build, its cases in the session's order; a variant
    build's in its plain build's task (its canary reads the plain build's answers there)."""
    by_engine: dict[str, list[str]] = {}
    for item in items:
        spec = item.callspec.params[ENGINE_FIXTURE]
        by_engine.setdefault(replace(spec, engine_variant="").id, []).append(item.nodeid)
    return [Task(engine_id, tuple(nodeids)) for engine_id, nodeids in by_engine.items()]


# How a fleet is made: (its slots, the tasks, the worker command, its folder for the
# workers' folders, the callbacks) -> the fleet; the slots are the local fleet's, or none.
Maker = Callable[[Sequence[Slot], Sequence[Task], Sequence[str], Path, Path, Callbacks], Fleet]


def _local(
    slots: Sequence[Slot], tasks: Sequence[Task], command: Sequence[str], cwd: Path, folder: Path, on: Callbacks
) -> Fleet:
    return LocalFleet(slots, tasks, command, cwd, folder, on)


class FleetDriver:
    def __init__(
        self, config: pytest.Config, slots: Sequence[Slot], tasks: Sequence[Task], make: Maker, words: str
    ) -> None:
        self.config, self.slots, self.tasks, self.make, self.words = config, list(slots), list(tasks), make, words
        self.locations: dict[str, Any] = {}
        self.lost: list[str] = []
        self.notes: list[str] = []  # what the run says of its slots (those left idle), at its start and end

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if session.config.option.collectonly or not self.tasks:
            return None
        state = state_for_run(self.config)
        self.locations = {item.nodeid: item.location for item in session.items}
        # One folder per run: a fixed --bench-output keeps one logs folder across runs, and a
        # worker's folder reused by a later run had the earlier run's rows and reports merged again.
        folder = state.writer.log_dir / "fleet" / state.provenance["run_id"]
        invocation = self.config.invocation_params
        merged = InOrder(state.writer, self.tasks, self._lose)
        on = Callbacks(report=self._report, say=lambda line: say(self.config, line), ended=merged.end, lost=self._lose)

        def launch(slots: Sequence[Slot], tasks: Sequence[Task], folder: Path) -> Fleet:
            fleet = self.make(
                slots, tasks, worker_command(invocation.args, self.config.rootpath), invocation.dir, folder, on
            )
            fleet.columns = run_columns(state.provenance, state.platform.device_type)
            merged.attempts = fleet.attempts
            return fleet

        for note in self.notes:
            say(self.config, note)
        if options.value(self.config, "bench_fleet_check"):
            from lorabench.pytest_plugin.fleet_check import probe_of, run_check  # scipy: imported for the check only

            pairs = options.value(self.config, "bench_fleet_check_pairs")
            checked = state.writer.log_dir / "fleet-check" / folder.name
            found = run_check(self.slots, self.tasks, launch, checked, on.say, pairs)
            unchecked = coverage(probe_of(self.tasks).engine_id, [t.engine_id for t in self.tasks])
            state.fleet = [*self.notes, *found, *unchecked]
            return True
        alone = "; one worker: one build after another (on the CPU, --bench-devices 0,1 makes two)"
        say(
            self.config,
            f"fleet: {len(self.tasks)} engine builds on {self.words} (the first guess above is for one at a time)"
            + (alone if len(self.slots) == 1 else ""),
        )
        started = time.monotonic()
        fleet = launch(self.slots, self.tasks, folder)
        fleet.halt = lambda: bool(session.shouldfail or session.shouldstop)
        try:
            fleet.run()
        except Halted:
            say(self.config, f"fleet: stopped: {session.shouldfail or session.shouldstop}")
        finally:
            merged.flush(everything=True)
            state.fleet = self._summary(fleet.attempts, time.monotonic() - started, folder)
        if not fleet.halt():
            self._run_the_others(session)
        return True

    def _run_the_others(self, session: pytest.Session) -> None:
        """What the selection holds besides the fleet's cases (tests that build no engine,
        cases skipped for this device) runs here, as pytest would run it: left out, a failing
        test of the user's passed the session unseen."""
        ours = {nodeid for task in self.tasks for nodeid in task.nodeids}
        others = [item for item in session.items if item.nodeid not in ours]
        for item, nextitem in zip(others, [*others[1:], None]):
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail or session.shouldstop:
                break

    def _report(self, data: dict[str, Any]) -> None:
        hook = self.config.hook
        report = hook.pytest_report_from_serializable(config=self.config, data=data)
        if report.when == "setup":
            hook.pytest_runtest_logstart(nodeid=report.nodeid, location=report.location)
        hook.pytest_runtest_logreport(report=report)
        if report.when == "teardown":
            hook.pytest_runtest_logfinish(nodeid=report.nodeid, location=report.location)

    def _lose(self, task: Task, reason: str) -> None:
        """The cases of a task that failed on both attempts: each a failed test, saying why."""
        self.lost.append(f"fleet: {task.engine_id}: {len(task.nodeids)} cases not run: {reason}")
        hook = self.config.hook
        for nodeid in task.nodeids:
            location = self.locations.get(nodeid, (nodeid, None, nodeid))
            hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
            report = pytest.TestReport(nodeid, location, {}, "failed", f"{task.engine_id}: {reason}", "call")
            hook.pytest_runtest_logreport(report=report)
            hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)

    def _summary(self, attempts: Sequence[Attempt], wall_s: float, folder: Path) -> list[str]:
        busy = sum((a.ended or time.time()) - a.started for a in attempts)
        return [
            f"fleet: {len(self.tasks)} engine builds on {self.words} in {wall_s:.1f} s; "
            f"the workers ran {busy:.1f} s in all ({busy / wall_s if wall_s else 0:.2f} at once on average)",
            *self.notes,
            *self.lost,
            *(f"fleet: {a.where}: {note}" for a in attempts for note in _notes(a)),
            f"fleet workers' folders (task, reports, pytest output): {folder}",
        ]


# What a worker's summary says of its build that a row does not: a peak memory figure that
# may be off, device memory an engine kept (the slot's next build shares the device with it).
NOTES = ("peak memory of ", "the device memory of ")


def _notes(attempt: Attempt) -> list[str]:
    try:
        text = (attempt.folder / LOG_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.startswith(NOTES)]


def start(config: pytest.Config, state: BenchState, items: Sequence[pytest.Item]) -> None:
    """Hand this session's cases to a fleet, or refuse what a fleet cannot run (exit 2)."""
    where = options.value(config, "bench_fleet")
    if state.target.kind == URL:
        options.refuse(
            [
                f"--bench-fleet {where}: the target is the server at {state.target.url}, one engine; a fleet builds "
                "engines on devices of its own (use --bench-target serve or inprocess)"
            ]
        )
    device_type, per_engine = state.platform.device_type, state.config.devices_per_engine
    if where == options.LOCAL:
        found, notes = fleet_slots(config, device_type, per_engine)
        if options.value(config, "bench_fleet_check") and len(found) < 2:
            alone = f"--bench-fleet-check: one worker ({found[0].label}) has no neighbours; name two devices or more"
            options.refuse([alone, *notes])
        words = f"{len(found)} workers: {', '.join(s.label for s in found)}"
        driver = FleetDriver(config, found, fleet_tasks(items), _local, words)
        driver.notes = notes
    else:
        driver = FleetDriver(
            config,
            [],
            fleet_tasks(items),
            _on_ray(config, where, device_type, per_engine),
            f"the Ray cluster ({where})",
        )
    config.pluginmanager.register(driver, "lorabench-fleet-driver")


def _on_ray(config: pytest.Config, where: str, device_type: str, per_engine: int) -> Maker:
    """The Ray cluster at ``where``, joined and checked; what it cannot run is bad input."""
    if options.value(config, "bench_fleet_check"):
        options.refuse(["--bench-fleet-check measures one node's interference: run it there, with --bench-fleet local"])
    try:
        ray = ray_cluster.connect(where)
        ray_cluster.check_fits(ray, where, device_type, per_engine)
    except ray_cluster.RayInputError as exc:
        options.refuse([str(exc)])
    asks = ray_cluster.demand(device_type, per_engine)

    def make(slots, tasks, command, cwd, folder, on):  # noqa: ANN001, ANN202 - a Maker
        return ray_cluster.RayFleet(ray, asks, tasks, command, cwd, folder, on)

    return make
