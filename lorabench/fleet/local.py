"""The local fleet: one pytest worker at a time on each slot of this node's devices
(``lorabench.fleet.devices``), each running the session's selection restricted to one
engine configuration x build (``lorabench.fleet.tasks``). A task whose worker died is
given to another slot where there is one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from lorabench.fleet.devices import Slot
from lorabench.fleet.tasks import LOG_FILE, STOP_WAIT_S, TASK_FILE, Attempt, Callbacks, Fleet, Task, worker_argv


class LocalFleet(Fleet):
    def __init__(
        self,
        slots: Sequence[Slot],
        tasks: Sequence[Task],
        command: Sequence[str],
        cwd: Path,
        folder: Path,
        on: Callbacks,
    ) -> None:
        super().__init__(tasks, command, cwd, folder, on)
        self.slots = list(slots)
        self.node = socket.gethostname()

    def start_what_can(self) -> None:
        busy = {a.where for a in self.running}
        for slot in self.slots:
            task = None if slot.label in busy else self._next_for(slot)
            if task is not None:
                self.queue.remove(task)
                self.started(self._spawn(task, slot))

    def _next_for(self, slot: Slot) -> Task | None:
        """The first queued task, but not one whose worker died on this slot while another slot could take it."""
        return next((t for t in self.queue if t.died_on != slot.label or len(self.slots) == 1), None)

    def _spawn(self, task: Task, slot: Slot) -> Attempt:
        folder = task.folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / TASK_FILE).write_text(json.dumps(task.spec(self.columns, slot.label)), encoding="utf-8")
        with open(folder / LOG_FILE, "wb") as log:
            process = subprocess.Popen(
                worker_argv(self.command, folder),
                cwd=self.cwd,
                env={**os.environ, **slot.env(), **dict(task.env)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group: a Ctrl-C at the terminal reaches the driver, which stops the
                # workers in order, and what a worker leaves behind can be found and ended.
                start_new_session=True,
            )
        return Attempt(task, slot.label, folder, process, time.time(), node=self.node)

    def poll(self) -> list[Attempt]:
        ended = [a for a in self.running if a.handle.poll() is not None]
        for attempt in ended:
            attempt.code, attempt.ended = attempt.handle.returncode, time.time()
            _end_group(attempt.handle)  # an engine core a killed worker left running would hold its slot
        return ended

    def stop_all(self) -> list[Attempt]:
        for attempt in self.running:
            _signal(attempt.handle, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        for attempt in self.running:
            try:
                attempt.handle.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                _end_group(attempt.handle)
                attempt.handle.wait()
            attempt.code, attempt.ended = attempt.handle.returncode, time.time()
            _end_group(attempt.handle)
        return list(self.running)


def _signal(process: subprocess.Popen, sig: int) -> None:
    try:
        process.send_signal(sig)
    except ProcessLookupError:
        pass


def _end_group(process: subprocess.Popen) -> None:
    """SIGKILL whatever is left of a worker's process group (the worker leads it)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
