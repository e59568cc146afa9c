"""The public traces' formats, read one row at a time.

Each format is a layout (CSV with a header row, or JSON lines) and the names of its
time, input-length and output-length columns, with the time's unit. Rows are streamed,
never loaded whole: a week of Azure traffic is hundreds of megabytes. Any row that
cannot be read stops the import with one line naming the file, the row, the column and
the fix (``TraceInputError``).
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

# Mooncake's published traces cut prompts into 512-token blocks, one hash id each (its README).
MOONCAKE_BLOCK_TOKENS = 512
# Hash ids are held as signed 64-bit numbers.
HASH_ID_LIMIT = 1 << 63
# Far above any model's context: a bigger count is a wrong column, not a request.
MAX_TOKENS = 1 << 31
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "datetime": None}
_DATETIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:\.(\d+))?\s*(Z|[+-]\d\d:?\d\d)?")
# The option of `lorabench trace import csv` that names each column.
OPTIONS = {
    "time": "--time-column",
    "input": "--input-column",
    "output": "--output-column",
    "label": "--label-column",
    "hash_ids": "--prefix-column",
}


class TraceInputError(ValueError):
    """Input an import cannot use; the message is one line: where, what, and the fix."""


@dataclass(frozen=True)
class Columns:
    """Where a format keeps what a trace needs; ``label`` (adapter labels) and ``hash_ids``
    (each request's block hash ids: ``lorabench.load.traces.prefixes``) are optional."""

    time: str
    input: str
    output: str
    time_unit: str = "s"
    label: str | None = None
    hash_ids: str | None = None

    def named(self) -> list[tuple[str, str]]:
        roles = [("time", self.time), ("input", self.input), ("output", self.output)]
        optional = [("label", self.label), ("hash_ids", self.hash_ids)]
        return roles + [(role, name) for role, name in optional if name is not None]


# Format name: (layout, columns). `csv` takes its columns from the command line.
FORMATS: dict[str, tuple[str, Columns | None]] = {
    "azure": ("csv", Columns("TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime")),
    "burstgpt": ("csv", Columns("Timestamp", "Request tokens", "Response tokens", "s")),
    "mooncake": ("jsonl", Columns("timestamp", "input_length", "output_length", "ms", hash_ids="hash_ids")),
    "csv": ("csv", None),
}

# (row number, seconds, input length, output length, label or None, hash ids or None)
Row = tuple[int, float, int, int, "str | None", "list[int] | None"]
_ID_SEPARATORS = re.compile(r"[\s,;]+")


def _datetime_seconds(text: str) -> tuple[int, float]:
    """Whole seconds since 0001-01-01 (UTC when an offset is given) and the fraction.

    Parsed here: Azure writes seven fractional digits, which ``datetime.fromisoformat``
    refuses before Python 3.11, and whole seconds as an integer keep the fraction exact."""
    m = _DATETIME.fullmatch(text.strip())
    if m is None:
        raise ValueError(text)
    year, month, day, hour, minute, second, fraction, offset = m.groups()
    if int(hour) > 23 or int(minute) > 59 or int(second) > 60:
        raise ValueError(text)
    whole = date(int(year), int(month), int(day)).toordinal() * 86400 + int(hour) * 3600 + int(minute) * 60
    whole += int(second)
    if offset and offset != "Z":
        digits = offset[1:].replace(":", "")
        whole -= (1 if offset[0] == "+" else -1) * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return whole, float("0." + fraction) if fraction else 0.0


class _Clock:
    """Seconds from a row's time value: a number in the unit, or a date-time counted from
    the first row's (so the numbers stay small and exact)."""

    def __init__(self, unit: str) -> None:
        self.factor = TIME_UNITS[unit]
        self.origin: int | None = None

    def seconds(self, text: str) -> float:
        if self.factor is not None:
            value = float(text) * self.factor
            if not math.isfinite(value):
                raise ValueError(text)
            return value
        whole, fraction = _datetime_seconds(text)
        if self.origin is None:
            self.origin = whole
        return (whole - self.origin) + fraction


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        number = float(text)
        if not number.is_integer():
            raise
        value = int(number)
    if not 0 <= value < MAX_TOKENS:
        raise ValueError(text)
    return value


def _time_hint(unit: str) -> str:
    if unit == "datetime":
        return "a date-time such as 2023-11-16 18:15:46.6805900"
    return f"a number of {unit} (for date-times pass --time-unit datetime)"


class _Rows:
    """Turns one file's rows of values (in the order of ``columns.named()``) into requests."""

    def __init__(self, path: Path, columns: Columns) -> None:
        self.path, self.columns = path, columns
        self.names = [name for _, name in columns.named()]
        self.clock = _Clock(columns.time_unit)

    def convert(self, number: int, values: list) -> Row:
        try:
            t = self.clock.seconds(str(values[0]))
        except (TypeError, ValueError):
            raise TraceInputError(
                f"{self.path}: row {number}, column {self.names[0]!r}: cannot read {values[0]!r} as a time: "
                f"expected {_time_hint(self.columns.time_unit)}; fix or remove the row"
            ) from None
        lengths = []
        for name, value in zip(self.names[1:3], values[1:3]):
            try:
                lengths.append(_count(str(value)))
            except (TypeError, ValueError, OverflowError):
                raise TraceInputError(
                    f"{self.path}: row {number}, column {name!r}: {value!r} is not a token count "
                    "(a whole number from 0 to 2^31): fix or remove the row"
                ) from None
        roles = dict(zip((role for role, _ in self.columns.named()), values))
        label = self._label(number, roles["label"]) if "label" in roles else None
        ids = self._hash_ids(number, roles["hash_ids"]) if "hash_ids" in roles else None
        return number, t, lengths[0], lengths[1], label, ids

    def _hash_ids(self, number: int, value: object) -> list[int]:
        """A row's block hash ids: a JSON list, or (in a CSV) whole numbers separated by
        spaces, commas or semicolons, brackets allowed; none at all is a prompt of its own."""
        items = value if isinstance(value, list) else _ID_SEPARATORS.split(str(value).strip().strip("[]").strip())
        try:
            ids = [int(i) if type(i) is int else int(str(i), 10) for i in items if i != ""]
        except ValueError:
            ids = None
        if ids is not None and any(not -HASH_ID_LIMIT <= i < HASH_ID_LIMIT for i in ids):
            raise TraceInputError(
                f"{self.path}: row {number}, column {self.columns.hash_ids!r}: an id of {str(value)[:60]!r} is "
                "outside -2^63 to 2^63 - 1: give ids as signed 64-bit numbers (or number the distinct ones)"
            )
        if ids is None or value is None or isinstance(value, bool):
            raise TraceInputError(
                f"{self.path}: row {number}, column {self.columns.hash_ids!r}: {value!r} is not a list of block "
                "hash ids (whole numbers, such as [1, 2, 3] or 1 2 3): fix or remove the row"
            )
        return ids

    def _label(self, number: int, value: object) -> str:
        """A row's label; an empty or null one is refused: it is no adapter's, and taken as
        one label it would put every unlabelled request on a single adapter."""
        if value is None or not str(value).strip():
            raise TraceInputError(
                f"{self.path}: row {number}, column {self.names[3]!r}: no label ({value!r}): "
                "fill it in or remove the row"
            )
        return str(value)


def _missing(path: Path, number: int, role: str, name: str, fmt: str, present: list[str]) -> TraceInputError:
    if fmt == "csv":
        fix = f"name one of the file's columns with {OPTIONS[role]}"
    elif role == "label":
        fix = "name one of the file's columns with --label-column"
    elif role == "hash_ids":
        fix = "fill it in, or pass --no-hash-ids to import the trace without shared prefixes"
    else:
        fix = (
            f"is the file in the {fmt} format? for another layout use `lorabench trace import csv` with {OPTIONS[role]}"
        )
    return TraceInputError(
        f"{path}: row {number}: no column {name!r} (it has {', '.join(map(repr, present)) or 'none'}): {fix}"
    )


def _csv_rows(path: Path, columns: Columns, fmt: str) -> Iterator[Row]:
    rows = _Rows(path, columns)
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        head = [h.strip() for h in next(reader, [])]
        indices = []
        for role, name in columns.named():
            if name not in head:
                raise _missing(path, 1, role, name, fmt, head)
            indices.append(head.index(name))
        width = max(indices) + 1
        for row in reader:
            number = reader.line_num
            if not row:
                continue
            if len(row) < width:
                name = columns.named()[[i >= len(row) for i in indices].index(True)][1]
                raise TraceInputError(
                    f"{path}: row {number}, column {name!r}: the row has {len(row)} fields, not {len(head)}: "
                    "fix or remove the row"
                )
            yield rows.convert(number, [row[i] for i in indices])


def _jsonl_rows(path: Path, columns: Columns, fmt: str) -> Iterator[Row]:
    rows = _Rows(path, columns)
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict):
                raise TraceInputError(f"{path}: row {number}: not a JSON object: fix or remove the line")
            try:
                values = [record[name] for name in rows.names]
            except KeyError as exc:
                role = {name: role for role, name in columns.named()}[exc.args[0]]
                raise _missing(path, number, role, exc.args[0], fmt, list(record)) from None
            yield rows.convert(number, values)


def read_rows(path: Path, fmt: str, columns: Columns) -> Iterator[Row]:
    """(row number, seconds, input length, output length, label or None, hash ids or None)
    for each row.

    Row numbers are the file's line numbers (a CSV's header is row 1)."""
    layout = FORMATS[fmt][0]
    try:
        yield from (_jsonl_rows if layout == "jsonl" else _csv_rows)(path, columns, fmt)
    except UnicodeDecodeError as exc:
        raise TraceInputError(f"{path}: not UTF-8 text ({exc.reason}): is it the {fmt} file, uncompressed?") from None
    except csv.Error as exc:
        raise TraceInputError(f"{path}: not a readable CSV file ({exc}): check the file and its format") from None
