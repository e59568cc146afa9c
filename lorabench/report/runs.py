"""The runs a report draws: each result file read as one run, with its samples beside it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lorabench.compare.load import beside, load_run
from lorabench.schema import samples_path_for


@dataclass
class ReportRun:
    """One result file's latest run: its rows, samples and a label that names its commit."""

    label: str
    path: Path
    rows: pd.DataFrame
    samples: pd.DataFrame

    def scenario(self, name: str) -> pd.DataFrame:
        return self.rows[self.rows["scenario"] == name]


def engine_of(engine_id: pd.Series) -> pd.Series:
    """``loras8-rank16-cpu12-build1`` -> ``loras8-rank16-cpu12``: the configuration, as test ids name it."""
    return engine_id.astype(str).str.replace(r"-build\d+$", "", regex=True)


def load_runs(paths: Sequence[Path]) -> list[ReportRun]:
    """Read every file (``CompareError`` on one that is missing or not a result file)."""
    runs = []
    for path in paths:
        run = load_run(path)
        rows = run.all_rows.copy()
        rows["engine"] = engine_of(rows["engine_id"])
        run_ids = set(rows["run_id"]) if "run_id" in rows else set()
        samples = beside(run.paths, samples_path_for, run_ids)
        if not samples.empty:
            samples["engine"] = engine_of(samples["engine_id"])
        runs.append(ReportRun(run.commit.split(" ")[0][:8], Path(path), rows, samples))
    labels = [r.label for r in runs]
    for i, run in enumerate(runs):
        if labels.count(run.label) > 1:
            run.label = f"{run.label} #{labels[: i + 1].count(run.label)}"
    return runs
