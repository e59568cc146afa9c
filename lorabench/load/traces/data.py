"""A trace file read into arrays, whichever version wrote it.

Version 1 (``lorabench-trace/1``, ``lorabench trace generate``) is synthetic: its header
holds the generator's parameters. Version 2 (``lorabench-trace/2``, ``lorabench trace
import``) is imported: its header names the source file, its sha256 and every transform
applied with the rows it touched, and says the trace's duration. Both list the adapters
and share the request lines, so one reader serves both. Requests are held as arrays, not
objects: a week of Azure traffic is millions of them.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lorabench.load.traces.files import write_whole
from lorabench.load.traces.prefixes import HashIds
from lorabench.load.traces.synthetic import FORMAT as SYNTHETIC_FORMAT
from lorabench.load.traces.synthetic import TraceRequest

IMPORTED_FORMAT = "lorabench-trace/2"
# The header field of a trace with hash ids: the prompt tokens each id stands for.
BLOCK_KEY = "hash_block_tokens"
# Arrival times are written to the microsecond, as `trace generate` writes them.
TIME_DECIMALS = 6
_CHUNK = 1 << 16


@dataclass(frozen=True, eq=False)
class TraceData:
    """Requests in arrival order; request ``k`` goes to ``adapters[adapter[k]]``."""

    header: dict[str, Any]
    adapters: list[str]
    arrival_s: np.ndarray
    adapter: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    # The span the trace covers, from 0: its mean rate is len(self) / duration_s.
    duration_s: float
    # Each request's block hash ids, where the source had them (Mooncake's ``hash_ids``; a
    # CSV's prefix column): its header then says the tokens a block stands for.
    hash_ids: HashIds | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def block_tokens(self) -> int:
        """The prompt tokens one hash id stands for; 0 for a trace without ids."""
        return int(self.header.get(BLOCK_KEY, 0)) if self.hash_ids is not None else 0

    @property
    def rate(self) -> float:
        return len(self) / self.duration_s if self.duration_s > 0 else float("nan")

    def select(self, keep: np.ndarray | slice) -> TraceData:
        """The requests ``keep`` picks (a mask, indices or a slice), everything else unchanged."""
        return replace(
            self,
            arrival_s=self.arrival_s[keep],
            adapter=self.adapter[keep],
            input_len=self.input_len[keep],
            output_len=self.output_len[keep],
            hash_ids=self.hash_ids.take(keep) if self.hash_ids is not None else None,
        )

    def requests(self) -> list[TraceRequest]:
        names = self.adapters
        columns = (self.arrival_s, self.adapter, self.input_len, self.output_len)
        rows = zip(*(c.tolist() for c in columns))
        if self.hash_ids is None:
            return [TraceRequest(t, names[a], i, o) for t, a, i, o in rows]
        block = self.block_tokens
        return [TraceRequest(t, names[a], i, o, ids, block) for (t, a, i, o), ids in zip(rows, self.hash_ids.rows())]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _header_fields(header: Any) -> tuple[list[str], float]:
    if not isinstance(header, dict):
        raise ValueError("the first line is not a JSON object")
    if header.get("format") == SYNTHETIC_FORMAT:
        return list(header["adapters"]), float(header["params"]["duration"])
    if header.get("format") == IMPORTED_FORMAT:
        return list(header["adapters"]), float(header["duration_s"])
    raise ValueError(f"format {header.get('format')!r} is neither {SYNTHETIC_FORMAT} nor {IMPORTED_FORMAT}")


def _check_count(path: Path, header: dict[str, Any], found: int) -> None:
    """A file whose request lines are not as many as its header says was cut short or
    changed after it was written. Synthetic files written before the count was added
    have none, and are read as they are."""
    expected = header.get("requests")
    if expected is None or expected == found:
        return
    again = "generate" if header.get("format") == SYNTHETIC_FORMAT else "import"
    raise ValueError(
        f"{path}: the header says {expected} requests and the file holds {found}: it was cut short or changed "
        f"after it was written; write it again with `lorabench trace {again}`"
    )


def _id_list(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(type(i) is int and -(1 << 63) <= i < 1 << 63 for i in value):
        raise TypeError(f"hash_ids {str(value)[:40]!r} is not a list of signed 64-bit whole numbers")
    return value


def _block_tokens(header: dict[str, Any]) -> bool:
    """Whether the trace has hash ids; the tokens one stands for must be a whole number above 0."""
    if BLOCK_KEY not in header:
        return False
    value = header[BLOCK_KEY]
    if type(value) is not int or value < 1:
        raise ValueError(f"{BLOCK_KEY} {value!r} is not a number of tokens above 0")
    return True


def _check_figures(duration: float, lines: array, arrival: array, inputs: array, outputs: array) -> None:
    """Figures no replay can use, the first one named by its line: an edited file, or one
    another tool wrote (a backwards or NaN arrival, a length of 0 tokens crashed ``trace
    stats`` or went to the engine)."""
    if not (np.isfinite(duration) and duration > 0):
        raise ValueError(f"the header's duration {duration!r} is not a number of seconds above 0")
    times = np.frombuffer(arrival, dtype=np.float64)
    checks = (
        ("arrival_s", times, ~np.isfinite(times) | (times < 0), "is not a time of 0 s or later"),
        ("arrival_s", times, np.diff(times, prepend=0.0) < 0, "is earlier than the request above it"),
        ("input_len", np.frombuffer(inputs, dtype=np.int64), None, "is not a number of tokens above 0"),
        ("output_len", np.frombuffer(outputs, dtype=np.int64), None, "is not a number of tokens above 0"),
    )
    for field, values, bad, why in checks:
        bad = values < 1 if bad is None else bad
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"line {lines[i]}: {field} {values[i].item()!r} {why}")


def header_adapters(path: Path) -> list[str]:
    """The adapters a trace file's header names, its requests unread (a check that needs
    only them need not read millions of lines); raises what ``load`` raises, unexplained."""
    with Path(path).open(encoding="utf-8") as f:
        return _header_fields(json.loads(f.readline()))[0]


def load(path: Path) -> TraceData:
    """Read a trace file of either version; a bad line is named by its number."""
    path = Path(path)
    arrival, adapter, inputs, outputs, lines = array("d"), array("i"), array("q"), array("q"), array("q")
    ids: list[list[int]] = []
    number = 1
    try:
        with path.open(encoding="utf-8") as f:
            header = json.loads(f.readline())
            adapters, duration = _header_fields(header)
            index = {name: i for i, name in enumerate(adapters)}
            hashed = _block_tokens(header)
            for line in f:
                number += 1
                if line.strip():
                    r = json.loads(line)
                    lines.append(number)
                    if (
                        type(r["arrival_s"]) is bool
                        or type(r["input_len"]) is not int
                        or type(r["output_len"]) is not int
                    ):
                        raise TypeError("arrival_s is not a number, or a length not a whole number of tokens")
                    arrival.append(r["arrival_s"])
                    adapter.append(index[r["adapter"]])
                    inputs.append(r["input_len"])
                    outputs.append(r["output_len"])
                    if hashed:
                        ids.append(_id_list(r["hash_ids"]))
        hash_ids = HashIds.from_lists(ids) if hashed else None
        number = 1  # the figures' own checks name their line
        _check_figures(duration, lines, arrival, inputs, outputs)
    except (OSError, KeyError, TypeError, ValueError, OverflowError) as exc:
        where = f"line {number}: " if number > 1 else ""
        raise ValueError(
            f"{path}: not a readable lorabench trace ({where}{type(exc).__name__}: {exc}): "
            "write it with `lorabench trace import` or `lorabench trace generate`"
        ) from None
    _check_count(path, header, len(arrival))
    return TraceData(
        header=header,
        adapters=adapters,
        arrival_s=np.frombuffer(arrival, dtype=np.float64),
        adapter=np.frombuffer(adapter, dtype=np.int32),
        input_len=np.frombuffer(inputs, dtype=np.int64),
        output_len=np.frombuffer(outputs, dtype=np.int64),
        duration_s=duration,
        hash_ids=hash_ids,
    )


def write(path: Path, data: TraceData) -> None:
    """Write ``data`` as version 2, whole or not at all (``files.write_whole``): its header
    (source, transforms) completed with the adapters, the duration and the count. The
    lines are those ``json.dumps(..., sort_keys=True)`` writes, built by hand because that
    is a third of the import's time."""
    header = {
        **data.header,
        "format": IMPORTED_FORMAT,
        "adapters": data.adapters,
        "duration_s": data.duration_s,
        "requests": len(data),
    }
    if data.hash_ids is None:
        header.pop(BLOCK_KEY, None)
    names = [json.dumps(a) for a in data.adapters]
    arrivals = np.round(data.arrival_s, TIME_DECIMALS)
    ids = [", ".join(map(str, row)) for row in data.hash_ids.rows()] if data.hash_ids is not None else None

    def chunks() -> Iterator[str]:
        yield json.dumps(header, sort_keys=True) + "\n"
        for start in range(0, len(data), _CHUNK):
            part = slice(start, start + _CHUNK)
            columns = (arrivals[part], data.adapter[part], data.input_len[part], data.output_len[part])
            rows = zip(*(c.tolist() for c in columns))
            if ids is None:
                yield "".join(
                    f'{{"adapter": {names[a]}, "arrival_s": {t!r}, "input_len": {i}, "output_len": {o}}}\n'
                    for t, a, i, o in rows
                )
            else:
                yield "".join(
                    f'{{"adapter": {names[a]}, "arrival_s": {t!r}, "hash_ids": [{h}], "input_len": {i}, '
                    f'"output_len": {o}}}\n'
                    for (t, a, i, o), h in zip(rows, ids[part])
                )

    write_whole(path, chunks())
