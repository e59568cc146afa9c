"""The runs a report draws: each result file read as one run, with the files beside it
(samples; online replays' timelines and per-adapter usage)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lorabench.analysis.compare.load import PASSED, beside, load_run
from lorabench.results import records, schema


@dataclass
class ReportRun:
    """One result file's latest run: its rows, the records beside them and a label that names its commit."""

    label: str
    path: Path
    rows: pd.DataFrame
    samples: pd.DataFrame
    timeline: pd.DataFrame
    adapters: pd.DataFrame
    probes: pd.DataFrame

    def scenario(self, name: str) -> pd.DataFrame:
        return self.rows[self.rows["scenario"] == name]


def engine_of(engine_id: pd.Series) -> pd.Series:
    """``loras8-rank16-cpu12-build1`` -> ``loras8-rank16-cpu12``: the configuration, as test ids name it."""
    return engine_id.astype(str).str.replace(r"-build\d+$", "", regex=True)


def case_keys(frame: pd.DataFrame) -> pd.Series:
    """Each line's case, as one string over the columns that key samples to their row
    (``records.SAMPLE_KEY``), read alike from any of the files: a column with blanks reads
    as floats in one file and as integers in another, so whole numbers are written bare."""
    key = pd.Series("", index=frame.index)
    for column in records.SAMPLE_KEY:
        # A column a file lacks, or leaves blank, reads as what files written before it existed
        # meant (schema.OLDER_FILES): rows loaded for compare have it filled so, samples may not.
        older = schema.OLDER_FILES.get(column, "")
        cells = frame[column].map(_cell) if column in frame else pd.Series("", index=frame.index)
        key = key + "|" + cells.where(cells != "", older)
    return key


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def _beside(paths: Sequence[Path], kind: str, run_ids: set[str]) -> pd.DataFrame:
    path_for = records.samples_path_for if kind == "samples" else lambda p: records.replays_path_for(p, kind)
    frame = beside(list(paths), path_for, run_ids)
    if not frame.empty:
        frame["engine"] = engine_of(frame["engine_id"])
    return frame


def load_runs(paths: Sequence[Path]) -> list[ReportRun]:
    """Read every file (``CompareError`` on one that is missing or not a result file)."""
    runs = []
    for path in paths:
        run = load_run(path)
        # Each search's own capacity, a bound or a measurement: compare blanks the bounds for
        # its t-test, but a page that read them as missing would rank an unbounded search last.
        rows = run.all_rows.copy()
        if PASSED in rows:
            rows["capacity_rps"] = rows.pop(PASSED)
        rows["engine"] = engine_of(rows["engine_id"])
        run_ids = set(rows["run_id"]) if "run_id" in rows else set()
        files = {kind: _beside(run.paths, kind, run_ids) for kind in ("samples", "timeline", "adapters", "probes")}
        runs.append(ReportRun(run.commit.split(" ")[0][:8], Path(path), rows, **files))
    labels = [r.label for r in runs]
    for i, run in enumerate(runs):
        if labels.count(run.label) > 1:
            run.label = f"{run.label} #{labels[: i + 1].count(run.label)}"
    return runs
