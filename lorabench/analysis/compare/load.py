"""Reading result files into runs: one side of a comparison, one or several runs pooled.

Cases are matched on their key (``lorabench.results.schema.CASE_KEY``, less ``capacity_max_rate``:
``MATCH_KEY``), never on file order or test id; a file that holds several runs (a fixed
output) is read as its latest run.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lorabench.analysis.cases import CORE_METRICS, KEY_SEP, MATCH_KEY, METRICS, REQUIRED_KEY
from lorabench.analysis.compare import CompareError
from lorabench.results.records import counted_by_rank, digests_path_for, result_files, samples_path_for
from lorabench.results.schema import CASE_KEY, ENGINE_KEY, OLDER_FILES
from lorabench.results.search_stops import BRACKETED

PASSED = "_capacity_passed"  # every build's capacity_rps as the file has it, bound or not


def _norm(value: Any) -> str:
    """One spelling per key value, whatever dtype pandas chose for the column."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


@dataclass
class Run:
    """One side of a comparison: one result file, or several runs of the same code pooled."""

    paths: list[Path]
    rows: pd.DataFrame  # one row per case, indexed by the normalized case key; metrics averaged over builds
    all_rows: pd.DataFrame  # every build's row, with the run (``_run``) and engine (``_engine``) it came from
    # Each adapter's greedy output digests (``<run>.digests.csv``), where the files have them.
    digests: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def label(self) -> str:
        return ", ".join(map(str, self.paths))

    def provenance(self, column: str) -> str:
        values = sorted({_norm(v) for v in self.all_rows[column]}) if column in self.all_rows else []
        return ", ".join(values)

    @property
    def commit(self) -> str:
        commit = ", ".join(c[:12] for c in self.provenance("git_commit").split(", ")) or "unknown"
        dirty = self.all_rows["git_dirty"].astype(str).str.lower().eq("true").any()
        runs = f" ({len(self.paths)} runs)" if len(self.paths) > 1 else ""
        return commit + (" (dirty)" if dirty else "") + runs


@functools.lru_cache(maxsize=1 << 14)  # a file's keys repeat from run to run, and in a simulation
def _joined(values: tuple[Any, ...]) -> str:
    return KEY_SEP.join(map(_norm, values))


def keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the optional key columns older files lack (empty), each row's case key
    and its engine configuration, added in one step: each column added alone copied the
    frame's columns again."""
    missing = [column for column in CASE_KEY if column not in frame]
    # Plain values, column by column: a third of itertuples's time.
    values = {
        c: frame[c].to_numpy(dtype=object) if c in frame else [OLDER_FILES.get(c, "")] * len(frame)
        for c in (*CASE_KEY, *ENGINE_KEY)
    }
    added: dict[str, Any] = {c: OLDER_FILES.get(c, "") for c in missing}
    added["_key"] = [_joined(row) for row in zip(*(values[c] for c in MATCH_KEY))]
    # The engine configuration a row ran on, as recorded (older files built online
    # cases on engines of their own, named "...-online-buildN"); builds of one are the
    # independent draws of the noise.
    if "engine_id" in frame:
        added["_engine"] = frame["engine_id"].astype(str).str.replace(r"-build\d+$", "", regex=True).to_numpy()
    else:
        added["_engine"] = [KEY_SEP.join(map(_norm, row)) for row in zip(*(values[c] for c in ENGINE_KEY))]
    return pd.concat([frame, pd.DataFrame(added, index=frame.index)], axis=1)


def read_result_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise CompareError(f"{path}: no such file")
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise CompareError(f"{path}: not a CSV file ({' '.join(str(exc).split())})") from None


def bracketed_only(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (every build's, keyed) with the capacity blanked in every case where a search
    of this side did not bracket its SLO edge: stopped by a limit or by the end of its range,
    a capacity is a bound, not a measurement, and such a case is judged on its bounds
    (``compare.capacity``), which read the rate as passed from ``PASSED``."""
    if "search_stop" not in rows or "capacity_rps" not in rows:
        return rows
    unbracketed = rows["search_stop"].notna() & (rows["search_stop"] != BRACKETED)
    bounded = unbracketed.groupby(rows["_key"]).transform("any").to_numpy(dtype=bool)
    kept = pd.DataFrame({PASSED: rows["capacity_rps"]}, index=rows.index)
    return pd.concat([rows.assign(capacity_rps=rows["capacity_rps"].where(~bounded, np.nan)), kept], axis=1)


def _load_one(path: Path, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rows of a result file's latest run, one per case and build (a fixed file can hold
    several runs); ``rows``: the file's rows, where they are read already (left as they are)."""
    rows = read_result_csv(path) if rows is None else rows
    missing = [c for c in (*REQUIRED_KEY, *CORE_METRICS, "timestamp") if c not in rows.columns]
    if missing:
        raise CompareError(f"{path}: not a lorabench result file: missing columns {', '.join(missing)}")
    if rows.empty:
        raise CompareError(f"{path}: has no result rows")
    # Metrics measured only by newer versions: nothing to compare.
    rows = keyed(rows.assign(**{metric: np.nan for metric in METRICS if metric not in rows}))
    # Which rows stay is decided on the columns that decide it, by position in the order
    # sort_values("timestamp") gives, and the rows are taken once: each step taking every
    # column was most of a file's load.
    subset = ["_key", "build"] if "build" in rows else ["_key"]
    kept = rows[[*subset, *(["run_id"] if "run_id" in rows else []), "timestamp"]].reset_index(drop=True)
    kept = kept.iloc[kept["timestamp"].sort_values().index]
    if "run_id" in kept and kept["run_id"].notna().all():
        kept = kept[kept["run_id"] == kept["run_id"].iloc[-1]]
    else:  # written before runs had an id: one build per case
        kept = kept.drop_duplicates("_key", keep="last")
    rows = rows.iloc[kept.drop_duplicates(subset, keep="last").index]
    return rows if "build" in rows else rows.assign(build=0)


def _with_run(rows: pd.DataFrame, run: int) -> pd.DataFrame:
    """``rows`` with the pooled run's index as ``_run``, joined as one more frame: inserting a
    column into a wide file's frame (a block per column added) is what pandas warns about."""
    return pd.concat([rows, pd.DataFrame({"_run": run}, index=rows.index)], axis=1)


def split_paths(text: str) -> list[Path]:
    """``A.csv,B.csv``: several runs of the same code, pooled as one side."""
    return [Path(part) for part in text.split(",") if part]


def load_noise_runs(text: str) -> Run:
    """``--noise-from``: a folder of runs of one commit, or ``A.csv,B.csv``; at least 2 runs."""
    paths = result_files(Path(text)) if Path(text).is_dir() else split_paths(text)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise CompareError(f"--noise-from {text}: no such file or folder: {', '.join(missing)}")
    if len(paths) < 2:
        raise CompareError(
            f"--noise-from {text}: {len(paths)} result file there; the spread between runs needs at least 2 "
            "runs of one commit"
        )
    return load_run(paths)


def load_run(paths: Path | Sequence[Path], rows: Sequence[pd.DataFrame] | None = None) -> Run:
    """Read one result file, or several runs of the same code to pool as one side.

    Each case's value is the mean over its builds (of every pooled run); the test sees
    every build, so pooling runs adds builds and with them power.

    ``rows``: each file's rows in memory, as ``pd.read_csv`` gives them, read instead of
    the files; a simulation of many runs skips writing and parsing each one.
    """
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    tables = [None] * len(paths) if rows is None else list(rows)
    if len(tables) != len(paths):
        raise ValueError(f"{len(tables)} tables of rows for {len(paths)} paths")
    frames = [_with_run(_load_one(p, table), i) for i, (p, table) in enumerate(zip(paths, tables))]
    all_rows = bracketed_only(pd.concat(frames, ignore_index=True))
    columns = [c for c in all_rows.columns if c != "_key"]
    # Metrics averaged, the rest as last recorded: two aggregations, not one a column (a third of the time).
    grouped = all_rows.groupby("_key")
    means = grouped[[c for c in columns if c in METRICS]].mean()
    aggregated = pd.concat([means, grouped[[c for c in columns if c not in METRICS]].last()], axis=1)[columns]
    run_ids = set(all_rows["run_id"]) if "run_id" in all_rows else set()
    return Run(paths, aggregated, all_rows, beside(paths, digests_path_for, run_ids))


def beside(paths: list[Path], path_for: Callable[[Path], Path], run_ids: set[str]) -> pd.DataFrame:
    """The rows of the files beside ``paths`` (digests, samples) that belong to the runs read."""
    text = {"digest": str, "base_digest": str, "run_id": str}
    frames = [pd.read_csv(path_for(p), dtype=text) for p in paths if path_for(p).is_file()]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    frame = pd.concat(frames, ignore_index=True)
    return frame[frame["run_id"].isin(run_ids)] if "run_id" in frame and run_ids else frame


def rank_medians(run: Run) -> pd.DataFrame:
    """Median TTFT and decode per engine configuration and adapter rank, over the LoRA
    requests in the samples files beside the run's result files (``counted_by_rank``'s)."""
    run_ids = set(run.all_rows["run_id"]) if "run_id" in run.all_rows else set()
    samples = beside(run.paths, samples_path_for, run_ids)
    if samples.empty or "adapter_rank" not in samples:
        return pd.DataFrame()
    columns = [
        samples.get(c, pd.Series(None, index=samples.index)) for c in ("finished", "arrival_s", "trace_warmup_s")
    ]
    counted = [counted_by_rank(*values) for values in zip(*columns)]
    samples = samples[samples["adapter_rank"].notna() & pd.Series(counted, index=samples.index, dtype=bool)].copy()
    samples["engine"] = samples["engine_id"].astype(str).str.replace(r"-build\d+$", "", regex=True)
    samples["adapter_rank"] = samples["adapter_rank"].astype(int)
    return samples.groupby(["scenario", "engine", "adapter_rank"])[["ttft_ms", "decode_ms"]].median()


def find_runs(results_dir: Path, commit_prefix: str, *, all_runs: bool = False) -> list[Path]:
    """The newest run (or every run) in ``results_dir`` whose commit starts with ``commit_prefix``."""
    if not Path(results_dir).is_dir():
        raise CompareError(f"--results-dir {results_dir}: no such folder; give the folder the runs were written to")
    found: list[tuple[str, Path]] = []
    for csv in result_files(results_dir):
        try:
            head = pd.read_csv(csv, usecols=["git_commit", "timestamp"], dtype=str)
        except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
            continue
        if not head.empty and head["git_commit"].fillna("").str.startswith(commit_prefix).any():
            found.append((head["timestamp"].max(), csv))
    if not found:
        raise CompareError(f"{results_dir}: no result file of a commit starting with {commit_prefix!r}")
    found.sort()
    return [p for _, p in found] if all_runs else [found[-1][1]]
