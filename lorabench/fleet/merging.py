"""The fleet's run, written in the session's order: a task's rows join the run once it and
every task before it have ended, so the run's file reads as a sequential run's would, and
what depends on order does as well: the reference digests are the session's first build's,
as in one session (``lorabench.results.merge``). Until then a task's rows wait, safe, in
its worker's folder; whatever is left when the fleet stops joins the run then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from lorabench.fleet.tasks import ROWS_FILE, Attempt, Task
from lorabench.results.files import ResultsFileError, ResultWriter
from lorabench.results.merge import adopt
from lorabench.results.schema import FLEET_COLUMNS

DEVICES, NEIGHBOURS = FLEET_COLUMNS


class InOrder:
    def __init__(self, writer: ResultWriter, tasks: Sequence[Task], failed: Callable[[Task, str], None]) -> None:
        self.writer, self.order, self.failed = writer, [t.engine_id for t in tasks], failed
        self.attempts: Sequence[Attempt] = ()  # every attempt of the fleet, for the neighbours
        self.ended: dict[str, list[Attempt]] = {}
        self.done: set[str] = set()
        self.merged = 0  # how many of ``order`` have joined the run
        self.reference: dict[str, str] = {}  # the run's digest of each adapter (results.merge)

    def end(self, attempt: Attempt, last: bool) -> None:
        """An attempt ended (``last``: its task will not run again); merge what is due."""
        self.ended.setdefault(attempt.task.engine_id, []).append(attempt)
        if last:
            self.done.add(attempt.task.engine_id)
        self.flush()

    def flush(self, everything: bool = False) -> None:
        """Merge the ended tasks that follow the merged ones; ``everything``: all that ended."""
        while self.merged < len(self.order) and (everything or self.order[self.merged] in self.done):
            for attempt in self.ended.pop(self.order[self.merged], []):
                self._adopt(attempt)
            self.merged += 1

    def _adopt(self, attempt: Attempt) -> None:
        def fill(row: Mapping[str, str]) -> dict[str, str]:
            return {NEIGHBOURS: attempt.neighbours(self.attempts, row["test_id"])}

        try:
            adopt(self.writer, attempt.folder / ROWS_FILE, fill, self.reference)
        except (ResultsFileError, OSError, ValueError, TypeError) as exc:
            self.failed(attempt.task, f"its rows could not be merged from {attempt.folder / ROWS_FILE}: {exc}")
