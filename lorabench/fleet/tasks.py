"""What a fleet runs, whatever runs it: tasks (one engine configuration x build each),
their workers' attempts, what the driver is told, and the rules every fleet keeps.

A worker is the same ``pytest`` command the user ran, in the same folder, with
``--bench-fleet-worker FOLDER``: it runs only the cases ``FOLDER/task.json`` lists, into
its own result file there, and appends each test report to ``FOLDER/reports.jsonl`` as it
happens (``lorabench.pytest_plugin.fleet_worker``), which the driver reads for live
progress. A worker that ends leaving cases unfinished (killed, out of memory, a crash, a
node lost) has its finished rows kept and the rest retried once, elsewhere where the
fleet can choose; what fails twice is reported failed.
"""

from __future__ import annotations

import csv
import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

TASK_FILE, REPORTS_FILE, LOG_FILE, ROWS_FILE = "task.json", "reports.jsonl", "pytest.log", "rows.csv"
ATTEMPTS = 2  # a configuration whose worker dies is retried once
POLL_S = 0.2
STATUS_EVERY_S = 30.0
STOP_WAIT_S = 60.0  # how long stopped workers may take to end their case and shut their engine down
# A worker that exits 1 with cases left stopped itself after a failure (-x, --maxfail): not retried.
STOPPED_ITSELF = 1


@dataclass(frozen=True)
class Task:
    """One engine configuration x build: the node ids of its cases, in the session's order."""

    engine_id: str
    nodeids: tuple[str, ...]
    attempt: int = 1
    died_on: str = ""  # where its last worker died
    copy: int = 0  # the interference check runs copies of one task side by side
    env: tuple[tuple[str, str], ...] = ()  # more environment for its worker

    @property
    def name(self) -> str:
        return self.engine_id + (f"~{self.copy}" if self.copy else "")

    def spec(self, columns: dict[str, Any], where: str) -> dict[str, Any]:
        """``task.json``: what its worker runs, the run's own columns (its id, host, commit)
        for every row, and how its rows name where they ran."""
        return {"nodeids": self.nodeids, "slot": where, "columns": columns}

    def folder(self, parent: Path) -> Path:
        """Where its worker's files are: one folder per attempt."""
        return parent / f"{self.name}.{self.attempt}"


@dataclass
class Attempt:
    """One worker running a task: ``where`` names its devices, ``node`` its machine."""

    task: Task
    where: str
    folder: Path
    handle: Any  # what the fleet runs it with: a process, a Ray task
    started: float  # on the node's clock (time.time)
    node: str = ""
    ended: float | None = None
    code: int | None = None  # the worker's exit status; None: it never said (its node was lost)
    offset: int = 0  # how far reports.jsonl has been read
    finished: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)
    # Each case's test call, (start, stop) on the node's clock: when its row was measured.
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def unfinished(self) -> tuple[str, ...]:
        return tuple(n for n in self.task.nodeids if n not in self.finished)

    def beside(self, other: Attempt, start: float, stop: float) -> bool:
        """Whether ``other`` ran on this one's node at some time between ``start`` and ``stop``."""
        return (
            other is not self
            and bool(self.node)
            and other.node == self.node
            and other.started < stop
            and start < (other.ended or time.time())
        )

    def neighbours(self, attempts: Sequence[Attempt], nodeid: str) -> str:
        """The configurations that ran on this node while the case ``nodeid`` was measured
        (while the whole attempt ran, for a case whose call never reported)."""
        start, stop = self.windows.get(nodeid, (self.started, self.ended or time.time()))
        return " ".join(sorted({a.task.engine_id for a in attempts if self.beside(a, start, stop)}))

    def rows_written(self) -> set[str]:
        """The cases whose rows are in the worker's result file: finished, whatever the worker
        managed to report before it died (a row is written before its case's teardown)."""
        try:
            with open(self.folder / ROWS_FILE, encoding="utf-8", newline="") as f:
                return {row["test_id"] for row in csv.DictReader(f) if row.get("test_id")}
        except (OSError, KeyError, csv.Error):
            return set()


class Halted(Exception):
    """The session stopped the fleet (pytest's -x or --maxfail): the workers are stopped as
    by Ctrl-C, their finished rows kept, and no case left is retried or reported lost."""


@dataclass
class Callbacks:
    """What the driver does with what the workers say: a report (pytest's serialized form),
    a line of progress, an attempt that ended (its rows to merge), cases that failed twice."""

    report: Callable[[dict[str, Any]], None]
    say: Callable[[str], None]
    ended: Callable[[Attempt, bool], None]  # the attempt, and whether it is its task's last
    lost: Callable[[Task, str], None]


class Fleet:
    """The loop every fleet runs: start what it can, read the reports, end what ended."""

    def __init__(self, tasks: Sequence[Task], command: Sequence[str], cwd: Path, folder: Path, on: Callbacks) -> None:
        self.queue, self.command, self.cwd, self.folder, self.on = list(tasks), command, cwd, folder, on
        self.total = len(tasks)
        self.attempts: list[Attempt] = []
        self.running: list[Attempt] = []
        self.columns: dict[str, Any] = {}  # the run's own columns, the same on every worker's rows
        self.stopping = False  # stopped by Ctrl-C or SIGTERM: nothing is retried or reported lost
        # Whether the session is to stop now (pytest's -x or --maxfail reached, on the reports sent).
        self.halt: Callable[[], bool] = lambda: False

    def run(self) -> list[Attempt]:
        """Run every task; on Ctrl-C or SIGTERM the workers are stopped as a user's Ctrl-C
        stops a session (finished rows kept), their rows merged, and the interrupt goes on."""
        last_status = time.monotonic()
        try:
            while self.queue or self.running:
                self.start_what_can()
                time.sleep(POLL_S)
                for attempt in self.poll():
                    self.end(attempt)
                for attempt in self.running:
                    self.read_reports(attempt)
                if self.halt():
                    raise Halted
                if time.monotonic() - last_status >= STATUS_EVERY_S:
                    self.on.say(self.status())
                    last_status = time.monotonic()
        except BaseException:
            self.stopping = True
            for attempt in self.stop_all():
                self.end(attempt)
            raise
        return self.attempts

    def start_what_can(self) -> None:
        raise NotImplementedError

    def poll(self) -> list[Attempt]:
        """The attempts that ended since the last poll, ``code`` and ``ended`` set."""
        raise NotImplementedError

    def stop_all(self) -> list[Attempt]:
        """Stop every running worker; the attempts stopped."""
        raise NotImplementedError

    def started(self, attempt: Attempt) -> None:
        self.attempts.append(attempt)
        self.running.append(attempt)
        self.announce(attempt)

    def announce(self, attempt: Attempt) -> None:
        """Say that a worker began its task, and where."""
        done = self.total - len(self.queue) - len(self.running)
        again = f", again after its worker died on {attempt.task.died_on}" if attempt.task.attempt > 1 else ""
        self.on.say(f"fleet: {attempt.where} runs {attempt.task.engine_id}{again} ({done} of {self.total} done)")

    def read_reports(self, attempt: Attempt) -> None:
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
            if when == "call" and report.get("start") is not None:
                attempt.windows[report["nodeid"]] = (report["start"], report["stop"])
            if when == "call" or outcome != "passed":
                outcome = outcome if when == "call" or outcome == "skipped" else "error"
                attempt.counts[outcome] = attempt.counts.get(outcome, 0) + 1
            self.on.report(report)

    def end(self, attempt: Attempt) -> None:
        """Hand the attempt's rows to the driver; queue its unfinished cases again, once, or lose them."""
        self.read_reports(attempt)
        self.running.remove(attempt)
        attempt.ended = attempt.ended or time.time()
        attempt.finished |= attempt.rows_written()
        left = attempt.unfinished
        took = f"{attempt.ended - attempt.started:.1f} s"
        said = _last_line(attempt.folder / LOG_FILE)
        reason = f"its worker on {attempt.where} {exit_words(attempt.code)} after {took}{said}"
        stopped = self.stopping or self.halt()
        again = bool(left) and not stopped and attempt.task.attempt < ATTEMPTS and attempt.code != STOPPED_ITSELF
        self.on.ended(attempt, not again)
        if not left:
            counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(attempt.counts.items()))
            self.on.say(f"fleet: {attempt.where} finished {attempt.task.engine_id} in {took}: {counts or 'no cases'}")
        elif stopped:
            self.on.say(f"fleet: {attempt.task.engine_id}: {len(left)} cases not run: the session stopped")
        elif again:
            self.on.say(f"fleet: {attempt.task.engine_id}: {reason}; {len(left)} unfinished cases queued again")
            retry = replace(attempt.task, nodeids=left, attempt=attempt.task.attempt + 1, died_on=attempt.where)
            self.queue.insert(0, retry)
        else:
            self.on.lost(replace(attempt.task, nodeids=left), reason)

    def status(self) -> str:
        now = time.time()
        parts = [
            f"{a.where} {a.task.engine_id} {len(a.finished)}/{len(a.task.nodeids)} cases {now - a.started:.0f} s"
            for a in self.running
        ]
        return f"fleet: {'; '.join(parts) or 'idle'}; {len(self.queue)} queued"


def exit_words(code: int | None) -> str:
    if code is None:
        return "was lost with its node"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited {code}"


def _last_line(log: Path) -> str:
    """The worker log's last line that says something, and where the log is."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f" ({lines[-1][:200]}; log: {log})" if lines else ""


# Options a worker does not take from the session: the fleet's own (a worker runs its task,
# never a fleet of its own), pytest's --basetemp (which each session empties when it starts)
# and the JUnit file (the session writes it, with every worker's reports).
# So are pytest-benchmark's files, which every worker would write over the others'.
DROPPED = (
    "--bench-fleet",
    "--bench-devices",
    "--bench-fleet-worker",
    "--bench-fleet-check-pairs",
    "--basetemp",
    "--benchmark-json",
    "--benchmark-save",
)
DROPPED_FLAGS = ("--bench-fleet-check", "--benchmark-autosave")
JUNIT = ("--junitxml", "--junit-xml")


def worker_command(args: Sequence[str], rootdir: Path) -> list[str]:
    """The worker's command: this interpreter's pytest with the session's own arguments but
    those ``DROPPED`` (``worker_argv`` adds the task's folder), and the session's rootdir, so
    that its cases have the session's node ids wherever the worker's folder is."""
    kept: list[str] = []
    values = iter(args)
    for arg in values:
        name = arg.split("=", 1)[0]
        if name in (*DROPPED, *JUNIT) and "=" not in arg:
            next(values, None)  # its value, the next argument
        elif name not in (*DROPPED, *JUNIT, *DROPPED_FLAGS):
            kept.append(arg)
    given = any(arg.split("=", 1)[0] == "--rootdir" for arg in kept)
    return [sys.executable, "-m", "pytest", *kept, *([] if given else [f"--rootdir={rootdir}"])]


def worker_argv(command: Sequence[str], folder: Path) -> list[str]:
    """One worker's command line: its task's folder, and a pytest cache of its own there."""
    return [*command, f"--bench-fleet-worker={folder}", "-o", f"cache_dir={folder / 'cache'}"]
