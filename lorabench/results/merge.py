"""One run from several: a fleet's workers each write a run of their own (one result file,
its samples, digests, replay records and engine logs), and the driver adopts each into the
session's run as its worker ends, so the result reads as a sequential run's would.

A worker's files stay where they are: merging copies, so a driver killed midway leaves
every finished row on disk, in the worker's folder if not yet in the run's file.
"""

from __future__ import annotations

import csv
import shutil
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lorabench.results.files import REPLAY_FILES, ResultsFileError, ResultWriter, append_rows
from lorabench.results.records import (
    DIGEST_COLUMNS,
    SAMPLE_COLUMNS,
    counted_by_rank,
    digests_path_for,
    replays_path_for,
    samples_path_for,
)
from lorabench.results.schema import COLUMNS, ResultRow

_HINTS = typing.get_type_hints(ResultRow)


def _read(path: Path, columns: tuple[str, ...] | list[str]) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is not None and tuple(reader.fieldnames) != tuple(columns):
            raise ResultsFileError(f"{path}: written by another lorabench (other columns); merge it with that version")
        # A row cut short by a worker killed while writing it is no row: its case was not finished.
        return [row for row in reader if None not in row.values() and None not in row]


def _typed(text: str, hint: Any) -> Any:
    """A CSV cell as the row's field holds it: blank is None, booleans and numbers as such."""
    if text == "":
        return None
    kind = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    if kind is bool:
        return text == "True"
    if kind is int:
        return int(float(text))
    if kind is float:
        return float(text)
    return text


def row_from_csv(values: Mapping[str, str]) -> ResultRow:
    """A result row read back from its CSV cells."""
    return ResultRow(**{name: _typed(values[name], hint) for name, hint in _HINTS.items()})


def _recheck_digests(rows: list[dict[str, str]], digests: list[dict[str, str]], reference: dict[str, str]) -> None:
    """Each row's ``digest_mismatches`` with its build's mismatches against the run's reference
    digests added, as one session counts them (``lorabench.measure.correctness.DigestBook``,
    ``scenarios.case``): a worker saw only its own build, so against itself it found none, and
    what its row says is the case's own (a residency probe's wrong answers). The reference is
    the first build adopted, which ``lorabench.fleet.merging`` makes the session's first."""
    for record in digests:
        reference.setdefault(record["adapter"], record["digest"])
    wrong: dict[str, int] = {}
    for record in digests:
        wrong[record["engine_id"]] = wrong.get(record["engine_id"], 0) + (
            record["digest"] != reference[record["adapter"]]
        )
    for row in rows:
        if row["digest_mismatches"] != "":
            row["digest_mismatches"] = str(int(float(row["digest_mismatches"])) + wrong.get(row["engine_id"], 0))


def adopt(
    writer: ResultWriter,
    worker_csv: Path,
    fill: Callable[[Mapping[str, str]], Mapping[str, Any]],
    reference: dict[str, str],
) -> None:
    """Append a worker run's records and then its rows to ``writer``'s run (``fill``: the
    columns the driver sets on a row, such as the neighbours it was measured beside), and
    copy its engine logs into the run's logs folder; a worker that wrote nothing adds nothing.
    ``reference``: the run's digest of each adapter so far (the first build's), kept up to date."""
    rows = _read(worker_csv, COLUMNS)
    run = writer.claim()
    samples = _read(samples_path_for(worker_csv), SAMPLE_COLUMNS)
    if samples:
        append_rows(samples_path_for(run), SAMPLE_COLUMNS, samples, exclusive=False)
    writer.by_rank += [
        (int(float(s["adapter_rank"])), float(s["ttft_ms"]), float(s["decode_ms"]))
        for s in samples
        if s["adapter_rank"] and counted_by_rank(s["finished"], s["arrival_s"], s.get("trace_warmup_s"))
    ]
    digests = _read(digests_path_for(worker_csv), DIGEST_COLUMNS)
    _recheck_digests(rows, digests, reference)
    if digests:
        append_rows(digests_path_for(run), DIGEST_COLUMNS, digests, exclusive=False)
    for kind, columns in REPLAY_FILES.items():
        records = _read(replays_path_for(worker_csv, kind), columns)
        if records:
            replays_path_for(run, kind).parent.mkdir(parents=True, exist_ok=True)
            append_rows(replays_path_for(run, kind), columns, records, exclusive=False)
    for logs in sorted(worker_csv.parent.glob("*.logs")):
        writer.log_dir.mkdir(parents=True, exist_ok=True)
        for log in logs.glob("*.log"):
            kept = writer.log_dir / log.name
            # A retried build's log beside its first worker's, not over it.
            shutil.copyfile(log, kept.with_name(f"{log.stem}.{worker_csv.parent.name}.log") if kept.exists() else kept)
    rows = [{**row, **{k: "" if v is None else str(v) for k, v in fill(row).items()}} for row in rows]
    append_rows(run, COLUMNS, rows, exclusive=False)
    writer.rows += [row_from_csv(row) for row in rows]
