"""A fleet worker's session (``--bench-fleet-worker DIR``, started by the driver): the user's
selection narrowed to the cases of one task, its rows in a result file of its own in DIR
under the driver's run id, and every test report appended to DIR/reports.jsonl as pytest
serializes it for pytest-xdist, so the driver shows it as its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lorabench.fleet.devices import pin_from_env
from lorabench.fleet.tasks import REPORTS_FILE, ROWS_FILE, TASK_FILE


class FleetWorker:
    def __init__(self, config: pytest.Config, folder: Path) -> None:
        task = json.loads((folder / TASK_FILE).read_text(encoding="utf-8"))
        self.config, self.folder = config, folder
        self.nodeids: list[str] = list(task["nodeids"])
        # The run's own columns (lorabench.pytest_plugin.fleet_driver.run_columns), and where it ran.
        self.columns = {**task["columns"], "fleet_devices": task["slot"]}
        self.output = str(folder / ROWS_FILE)
        self._reports = open(folder / REPORTS_FILE, "a", encoding="utf-8")  # noqa: SIM115 - open for the session
        pin_from_env()

    @pytest.hookimpl(tryfirst=True)  # before the plugin resolves the run for what is left
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        wanted = set(self.nodeids)
        dropped = [i for i in items if i.nodeid not in wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        order = {nodeid: n for n, nodeid in enumerate(self.nodeids)}
        items[:] = sorted((i for i in items if i.nodeid in wanted), key=lambda i: order[i.nodeid])

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data: Any = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self._reports.write(json.dumps(data) + "\n")
        self._reports.flush()

    def pytest_unconfigure(self) -> None:
        self._reports.close()


def worker_of(config: pytest.Config) -> FleetWorker | None:
    """This session's worker, registered, when the driver started it (``--bench-fleet-worker``)."""
    folder = config.getoption("bench_fleet_worker", None)
    if not folder:
        return None
    worker = FleetWorker(config, Path(folder))
    config.pluginmanager.register(worker, "lorabench-fleet-worker")
    return worker
