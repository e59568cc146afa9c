"""The local fleet: one pytest worker at a time on each slot of this node's devices, each
running the session's selection restricted to one engine configuration x build.

A worker is the same ``pytest`` command the user ran, in the same folder, with
``--bench-fleet-worker FOLDER``: it runs only the cases ``FOLDER/task.json`` lists, into
its own result file there, and appends each test report to ``FOLDER/reports.jsonl`` as it
happens (``lorabench.fleet.worker``), which the driver reads for live progress. A worker
that exits leaving cases unfinished (killed, out of memory, a crash) has its finished
rows kept and the rest retried once on another slot; what fails twice is reported failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lorabench.fleet.devices import Slot

TASK_FILE, REPORTS_FILE, LOG_FILE, ROWS_FILE = "task.json", "reports.jsonl", "pytest.log", "rows.csv"
ATTEMPTS = 2  # a configuration whose worker dies is retried once, elsewhere where it can be
POLL_S = 0.2
STATUS_EVERY_S = 30.0


@dataclass(frozen=True)
class Task:
    """One engine configuration x build: the node ids of its cases, in the session's order."""

    engine_id: str
    nodeids: tuple[str, ...]
    attempt: int = 1
    died_on: str = ""  # the slot its last worker died on
    copy: int = 0  # the interference check runs copies of one task side by side
    env: tuple[tuple[str, str], ...] = ()  # more environment for its worker

    @property
    def name(self) -> str:
        return self.engine_id + (f"~{self.copy}" if self.copy else "")


@dataclass
class Attempt:
    """One worker process running a task on a slot."""

    task: Task
    slot: Slot
    folder: Path
    process: subprocess.Popen
    started: float
    ended: float | None = None
    offset: int = 0  # how far reports.jsonl has been read
    finished: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def unfinished(self) -> tuple[str, ...]:
        return tuple(n for n in self.task.nodeids if n not in self.finished)

    def overlaps(self, other: Attempt, now: float) -> bool:
        return self.started < (other.ended or now) and other.started < (self.ended or now)


@dataclass
class Callbacks:
    """What the driver does with what the workers say: a report (pytest's serialized form),
    a line of progress, an attempt that ended (its rows to merge), cases that failed twice."""

    report: Callable[[dict[str, Any]], None]
    say: Callable[[str], None]
    ended: Callable[[Attempt, list[str]], None]
    lost: Callable[[Task, str], None]


class LocalFleet:
    def __init__(
        self,
        slots: Sequence[Slot],
        tasks: Sequence[Task],
        command: Sequence[str],
        cwd: Path,
        folder: Path,
        on: Callbacks,
    ) -> None:
        self.slots, self.queue, self.command, self.cwd, self.folder, self.on = (
            list(slots),
            list(tasks),
            command,
            cwd,
            folder,
            on,
        )
        self.total = len(tasks)
        self.attempts: list[Attempt] = []
        self.running: dict[str, Attempt] = {}  # by slot label
        self.run_id = ""  # the run every worker's rows belong to

    def run(self) -> list[Attempt]:
        """Run every task; on Ctrl-C or SIGTERM the workers are stopped as a user's Ctrl-C
        stops a session (finished rows kept), their rows merged, and the interrupt goes on."""
        last_status = time.monotonic()
        try:
            while self.queue or self.running:
                self._start_free_slots()
                time.sleep(POLL_S)
                for attempt in list(self.running.values()):
                    self._read_reports(attempt)
                    if attempt.process.poll() is not None:
                        self._end(attempt)
                if time.monotonic() - last_status >= STATUS_EVERY_S:
                    self.on.say(self.status())
                    last_status = time.monotonic()
        except BaseException:
            self._stop_all()
            raise
        return self.attempts

    def _start_free_slots(self) -> None:
        for slot in self.slots:
            if slot.label in self.running:
                continue
            task = self._next_for(slot)
            if task is None:
                continue
            self.queue.remove(task)
            self.running[slot.label] = attempt = self._spawn(task, slot)
            self.attempts.append(attempt)
            done = self.total - len(self.queue) - len(self.running)
            again = f", again after its worker died on {task.died_on}" if task.attempt > 1 else ""
            self.on.say(f"fleet: {slot.label} runs {task.engine_id}{again} ({done} of {self.total} done)")

    def _next_for(self, slot: Slot) -> Task | None:
        """The first queued task, but not one whose worker died on this slot while another slot could take it."""
        for task in self.queue:
            if task.died_on != slot.label or len(self.slots) == 1:
                return task
        return None

    def _spawn(self, task: Task, slot: Slot) -> Attempt:
        folder = self.folder / f"{task.name}.{task.attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / TASK_FILE).write_text(
            json.dumps({"nodeids": task.nodeids, "slot": slot.label, "run_id": self.run_id}), encoding="utf-8"
        )
        env = {**os.environ, **slot.env(), **dict(task.env)}
        with open(folder / LOG_FILE, "wb") as log:
            process = subprocess.Popen(
                [*self.command, "--bench-fleet-worker", str(folder), "-o", f"cache_dir={folder / 'cache'}"],
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C at the terminal reaches the driver, which stops them in order
            )
        return Attempt(task, slot, folder, process, time.monotonic())

    def _read_reports(self, attempt: Attempt) -> None:
        path = attempt.folder / REPORTS_FILE
        if not path.is_file():
            return
        with open(path, "rb") as f:
            f.seek(attempt.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        attempt.offset += len(complete)
        for line in complete.splitlines():
            report = json.loads(line)
            when, outcome = report.get("when"), report.get("outcome")
            if when == "teardown":  # pytest tears every test down, whatever its setup and call did
                attempt.finished.add(report["nodeid"])
            if when == "call" or outcome != "passed":
                outcome = outcome if when == "call" or outcome == "skipped" else "error"
                attempt.counts[outcome] = attempt.counts.get(outcome, 0) + 1
            self.on.report(report)

    def _end(self, attempt: Attempt) -> None:
        self._read_reports(attempt)
        attempt.ended = time.monotonic()
        del self.running[attempt.slot.label]
        neighbours = sorted(
            {a.task.engine_id for a in self.attempts if a is not attempt and a.overlaps(attempt, attempt.ended)}
        )
        self.on.ended(attempt, neighbours)
        code = attempt.process.returncode
        took = f"{attempt.ended - attempt.started:.1f} s"
        left = attempt.unfinished
        if not left:
            counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(attempt.counts.items()))
            self.on.say(
                f"fleet: {attempt.slot.label} finished {attempt.task.engine_id} in {took}: {counts or 'no cases'}"
            )
            return
        said = _last_line(attempt.folder / LOG_FILE)
        reason = f"its worker on {attempt.slot.label} {_exit_words(code)} after {took}{said}"
        if attempt.task.attempt < ATTEMPTS:
            self.on.say(f"fleet: {attempt.task.engine_id}: {reason}; {len(left)} unfinished cases queued again")
            self.queue.insert(
                0, replace(attempt.task, nodeids=left, attempt=attempt.task.attempt + 1, died_on=attempt.slot.label)
            )
        else:
            self.on.lost(replace(attempt.task, nodeids=left), reason)

    def _stop_all(self) -> None:
        for attempt in self.running.values():
            _signal(attempt.process, signal.SIGTERM)
        deadline = time.monotonic() + 60
        for attempt in list(self.running.values()):
            try:
                attempt.process.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                _signal(attempt.process, signal.SIGKILL)
                attempt.process.wait()
            self._end(attempt)

    def status(self) -> str:
        now = time.monotonic()
        parts = [
            f"{label} {a.task.engine_id} {len(a.finished)}/{len(a.task.nodeids)} cases {now - a.started:.0f} s"
            for label, a in self.running.items()
        ]
        return f"fleet: {'; '.join(parts) or 'idle'}; {len(self.queue)} queued"


def _signal(process: subprocess.Popen, sig: int) -> None:
    try:
        process.send_signal(sig)
    except ProcessLookupError:
        pass


def _exit_words(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited {code}"


def _last_line(log: Path) -> str:
    """The worker log's last line that says something, as ``: line``."""
    try:
        lines = [
            line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()
        ]
    except OSError:
        return ""
    return f" ({lines[-1][:200]}; log: {log})" if lines else ""


# Options a worker does not take from the session: the fleet's own (a worker runs its task,
# never a fleet of its own), pytest's --basetemp (which each session empties when it starts)
# and the JUnit file (the session writes it, with every worker's reports).
DROPPED = ("--bench-fleet", "--bench-devices", "--bench-fleet-worker", "--bench-fleet-check-pairs", "--basetemp")
DROPPED_FLAGS = ("--bench-fleet-check",)
JUNIT = ("--junitxml", "--junit-xml")


def worker_command(args: Sequence[str]) -> list[str]:
    """The worker's command: this interpreter's pytest with the session's own arguments but
    those ``DROPPED`` (``_spawn`` adds the task's folder, and a pytest cache of its own there)."""
    kept: list[str] = []
    values = iter(args)
    for arg in values:
        name = arg.split("=", 1)[0]
        if name in (*DROPPED, *JUNIT) and "=" not in arg:
            next(values, None)  # its value, the next argument
        elif name not in (*DROPPED, *JUNIT, *DROPPED_FLAGS):
            kept.append(arg)
    return [sys.executable, "-m", "pytest", *kept]
