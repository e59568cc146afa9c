"""Result files: one CSV row per case, and beside it the raw samples and, for online
replays, the engine timeline and per-adapter usage.

A row is appended, flushed and fsynced as soon as its case finishes, under an
exclusive lock, so an interrupted or killed run keeps every finished case and two
runs sharing a file never interleave a row. Unless the configuration names a fixed
file, each run gets a new file named by UTC time and commit, created exclusively.
"""

from __future__ import annotations

import csv
import fcntl
import io
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lorabench.results.records import (
    ADAPTER_COLUMNS,
    CANARY_COLUMNS,
    DIGEST_COLUMNS,
    ISOLATION_COLUMNS,
    PROBE_COLUMNS,
    SAMPLE_COLUMNS,
    SAMPLE_KEY,
    TIMELINE_COLUMNS,
    DigestRecord,
    Sample,
    counted_by_rank,
    digests_path_for,
    replays_path_for,
    samples_path_for,
)
from lorabench.results.schema import COLUMNS, ResultRow
from lorabench.results.stats import percentile


class ResultsFileError(RuntimeError):
    pass


# Records a case may keep beside its samples, by kind: each kind is its own file in the
# run's replays folder (records.replays_path_for), keyed like the samples.
REPLAY_FILES = {
    "timeline": TIMELINE_COLUMNS,
    "adapters": ADAPTER_COLUMNS,
    "probes": PROBE_COLUMNS,
    "isolation": ISOLATION_COLUMNS,
    "canary": CANARY_COLUMNS,
}
# The kind ``append_records`` takes for samples a case keeps before its row (a capacity
# search's, probe by probe): they go to the run's samples file.
SAMPLES = "samples"


def _csv_line(values: Iterable[Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue()


def append_rows(path: Path, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], exclusive: bool) -> None:
    """Append rows as one locked, synced write; the header goes first in an empty file."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_EXCL if exclusive else 0)
    fd = os.open(path, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = "".join(_csv_line("" if row[c] is None else row[c] for c in columns) for row in rows)
        if os.fstat(fd).st_size == 0:
            text = _csv_line(columns) + text
        else:
            with open(path, encoding="utf-8", newline="") as f:
                header = next(csv.reader(f), [])
            if tuple(header) != tuple(columns):
                raise ResultsFileError(
                    f"{path} has other columns than this lorabench writes: "
                    "choose another output file (or leave 'output' unset for a new file per run)"
                )
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


# In a run's logs folder: its config file, copied when the run starts, that file's path,
# and the run id it was copied for (a later run into the same folder copies its own over it).
CONFIG_COPY, CONFIG_SOURCE, CONFIG_RUN = "config.json", "config.source", "config.run"


class ResultWriter:
    """Writes one run's rows; the file is created when the first case finishes."""

    def __init__(self, results_dir: Path, fixed_path: Path | None, commit: str, dirty: bool) -> None:
        self.results_dir = results_dir
        self.fixed_path = fixed_path
        self._stem = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{commit[:8] or 'nogit'}{'-dirty' if dirty else ''}"
        self.path: Path | None = fixed_path
        self.rows: list[ResultRow] = []
        # (adapter rank, ttft_ms, decode_ms) of every LoRA request written, for the summary.
        self.by_rank: list[tuple[int, float, float]] = []

    @property
    def log_dir(self) -> Path:
        """Where this run's engine processes write their output, one file per build:
        ``<run>.logs`` beside the result file, where ``lorabench bundle`` looks. A fixed
        file (``--bench-output``) that later runs append to keeps one logs folder, the
        latest run's files written over those of the same names."""
        if self.fixed_path is not None:
            return self.fixed_path.with_suffix(".logs")
        return self.results_dir / f"{self._stem}.logs"

    def keep_config(self, config_file: Path, run_id: str) -> None:
        """A copy of the config file as the run read it, where it was, and the run's id, in
        the logs folder: ``lorabench bundle`` takes them; ``compare`` and the history read
        the settings of the run whose id it is."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(config_file, self.log_dir / CONFIG_COPY)
        (self.log_dir / CONFIG_SOURCE).write_text(f"{Path(config_file).resolve()}\n", encoding="utf-8")
        (self.log_dir / CONFIG_RUN).write_text(f"{run_id}\n", encoding="utf-8")

    @property
    def samples_path(self) -> Path | None:
        return samples_path_for(self.path) if self.path else None

    def _claim_new_file(self) -> Path:
        """Create this run's file, header only, under a name no other run holds."""
        self.results_dir.mkdir(parents=True, exist_ok=True)
        for n in range(1000):
            candidate = self.results_dir / (self._stem + (f"-{n}" if n else "") + ".csv")
            try:
                append_rows(candidate, COLUMNS, [], exclusive=True)
            except FileExistsError:
                continue
            return candidate
        raise ResultsFileError(f"could not create a new results file in {self.results_dir}")

    def claim(self) -> Path:
        """The run's result file, created (header only) if no row made it yet."""
        if self.path is None:
            self.path = self._claim_new_file()
        return self.path

    def append_digests(self, records: Sequence[DigestRecord]) -> None:
        """One engine build's adapter digests, beside the run's result file."""
        self.claim()
        append_rows(digests_path_for(self.path), DIGEST_COLUMNS, [asdict(r) for r in records], exclusive=False)

    def append_records(self, key: Mapping[str, Any], kind: str, records: Sequence[Any]) -> Path:
        """Make records of one kind (``REPLAY_FILES``, or ``SAMPLES``) durable under their case's key
        (``records.SAMPLE_KEY``); returns their file. A case may keep some before its row
        exists (``scenarios.Context.keep``), so that failing midway loses none of them."""
        self.claim()
        if kind == SAMPLES:
            self._append_samples(key, records)
            return samples_path_for(self.path)
        path = replays_path_for(self.path, kind)
        path.parent.mkdir(parents=True, exist_ok=True)
        append_rows(path, REPLAY_FILES[kind], [{**key, **asdict(r)} for r in records], exclusive=False)
        return path

    def _append_samples(self, key: Mapping[str, Any], samples: Sequence[Sample]) -> None:
        append_rows(self.samples_path, SAMPLE_COLUMNS, [{**key, **asdict(s)} for s in samples], exclusive=False)
        warmup_s = key.get("trace_warmup_s")
        self.by_rank += [
            (s.adapter_rank, s.ttft_ms, s.decode_ms)
            for s in samples
            if s.adapter_rank is not None and counted_by_rank(s.finished, s.arrival_s, warmup_s)
        ]

    def append(
        self, row: ResultRow, samples: Sequence[Sample], records: Mapping[str, Sequence[Any]] | None = None
    ) -> None:
        """Make one finished case durable: its samples and other records (``REPLAY_FILES``)
        first, then the row that summarizes them, so every row on disk has its records behind it."""
        self.claim().parent.mkdir(parents=True, exist_ok=True)
        values = asdict(row)
        key = {c: values[c] for c in SAMPLE_KEY}
        self._append_samples(key, samples)
        for kind, kept in (records or {}).items():
            if kept:
                self.append_records(key, kind, kept)
        append_rows(self.path, COLUMNS, [values], exclusive=False)
        self.rows.append(row)


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}" if value <= 1 else f"{value:.1f}"
    return str(value)


SUMMARY_COLUMNS = (
    ("engine_id", "engine"),
    ("scenario", "scenario"),
    ("workload", "workload"),
    ("tier", "tier"),
    ("working_set", "ws"),
    ("batch_size", "bs"),
    ("ttft_ms_p50", "ttft p50 ms"),
    ("prefill_ms_p50", "prefill p50 ms"),
    ("decode_ms_p50", "decode p50 ms"),
    ("e2e_ms", "e2e ms"),
    ("e2e_ms_ci_pct", "± e2e %"),
    ("output_tokens_per_s", "out tok/s"),
    ("prefix_hit_rate", "prefix hit"),
    ("prefix_hit_rate_predicted", "predicted"),
    ("lora_overhead", "x no-LoRA"),
    ("load_share", "disk share"),
    ("tier_extra_ttft_ms", "tier +ms"),
    ("adapter_load_ms", "load ms"),
    ("kv_cache_tokens", "kv tokens"),
    ("peak_memory_mb", "peak MiB"),
    ("slo_attainment", "slo met"),
    ("capacity_rps", "capacity rps"),
    ("capacity_over_rps", "over rps"),
    ("send_lag_ms_p99", "lag p99 ms"),
    ("client_fell_behind", "client behind"),
    ("canary_verdict", "canary"),
    ("digest_mismatches", "wrong out"),
)


def format_summary(rows: Sequence[ResultRow]) -> str:
    """A plain fixed-width table of the session's cases, one line each."""
    # A column no case of the session fills says nothing: it is left out; so are the prefix
    # cache's where no case cached (their 0 says nothing either).
    caching = any(r.enable_prefix_caching for r in rows)
    shown = [
        (key, title)
        for key, title in SUMMARY_COLUMNS
        if any(_fmt(getattr(r, key)) for r in rows) and (caching or not key.startswith("prefix_"))
    ]
    header = [title for _, title in shown]
    body = [[_fmt(getattr(row, key)) for key, _ in shown] for row in rows]
    widths = [max(len(cell) for cell in column) for column in zip(header, *body)]
    lines = [
        "  ".join(cell.rjust(w) if i > 2 else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths)))
        for r in [header, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_rank_summary(by_rank: Sequence[tuple[int, float, float]]) -> str:
    """Median TTFT and decode of the session's LoRA requests, per adapter rank."""
    parts = []
    for rank in sorted({r for r, _, _ in by_rank}):
        ttft = [t for r, t, _ in by_rank if r == rank]
        decode = [d for r, _, d in by_rank if r == rank]
        parts.append(
            f"rank {rank}: ttft p50 {percentile(ttft, 50):.1f} ms, decode p50 {percentile(decode, 50):.2f} ms "
            f"({len(ttft)} requests)"
        )
    return "by adapter rank: " + "; ".join(parts)
