"""``lorabench trace import``: a public trace through the transforms into a trace file.

The steps, in this order: read the rows (held as compact arrays, about 28 bytes a
request), sort by arrival if the file is not, cut the window, drop requests without
output or input, clip lengths to the model, scale time, label with adapters. The header
records the source (file name, sha256, rows) and each step with the rows it touched. No
path, clock or random state outside ``seed`` enters the file: the same input and options
give the same bytes.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lorabench.load.traces import transforms as tf
from lorabench.load.traces.data import BLOCK_KEY, TraceData, file_sha256
from lorabench.load.traces.prefixes import HashIds
from lorabench.load.traces.sources import (
    FORMATS,
    MOONCAKE_BLOCK_TOKENS,
    TIME_UNITS,
    Columns,
    TraceInputError,
    read_rows,
)


@dataclass(frozen=True)
class ImportOptions:
    """What ``lorabench trace import`` was asked; ``columns`` only for the ``csv`` format
    (the other formats know theirs), ``label_column`` for any."""

    fmt: str
    source: Path
    num_adapters: int = 1
    columns: Columns | None = None
    label_column: str | None = None
    # A policy of transforms.POLICIES (default uniform); not with label_column.
    popularity: str | None = None
    seed: int = 0
    adapter_names: tuple[str, ...] | None = None
    start: float = 0.0
    duration: float | None = None
    time_scale: float | None = None
    rate: float | None = None
    max_model_len: int | None = None
    # Block hash ids: a column of them (mooncake's ``hash_ids`` unless named), the prompt
    # tokens one stands for, and whether to keep them at all.
    prefix_column: str | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    hash_ids: bool = True


def parse_popularity(text: str) -> tuple[str, float]:
    """``powerlaw:ALPHA``, ``zipf:ALPHA``, ``uniform`` or ``round-robin`` as (policy, alpha)."""
    policy, _, alpha = text.partition(":")
    if policy not in tf.POLICIES or (policy in ("powerlaw", "zipf")) != bool(alpha):
        raise TraceInputError(
            f"--popularity {text!r}: use powerlaw:ALPHA, zipf:ALPHA (ALPHA above 0), uniform or round-robin"
        )
    try:
        value = float(alpha) if alpha else 1.0
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise TraceInputError(f"--popularity {text!r}: ALPHA must be a number above 0, such as {policy}:0.5")
    return policy, value


def _positive(value: float | None) -> bool:
    """An option left out, or above 0 and finite."""
    return value is None or 0 < value < math.inf


def _check(opts: ImportOptions) -> Columns:
    """The columns to read, once the options are known to make sense together."""
    if opts.fmt not in FORMATS:
        raise TraceInputError(f"unknown format {opts.fmt!r}: use one of {', '.join(FORMATS)}")
    if FORMATS[opts.fmt][1] is not None and opts.columns is not None:
        raise TraceInputError(
            f"--time-column, --input-column, --output-column and --time-unit are for the csv format: "
            f"{opts.fmt} names its own columns; leave them out"
        )
    columns = FORMATS[opts.fmt][1] or opts.columns
    if columns is None or not (columns.time and columns.input and columns.output):
        raise TraceInputError("the csv format needs --time-column, --input-column and --output-column")
    if columns.time_unit not in TIME_UNITS:
        raise TraceInputError(f"--time-unit {columns.time_unit!r}: use one of {', '.join(TIME_UNITS)}")
    problems = [
        (opts.num_adapters < 1, f"--num-adapters {opts.num_adapters}: at least 1"),
        (not 0 <= opts.start < math.inf, f"--start {opts.start:g}: seconds from the first request, 0 or more"),
        (not _positive(opts.duration), f"--duration {opts.duration}: above 0 s, finite"),
        (not _positive(opts.time_scale), f"--time-scale {opts.time_scale}: above 0, finite"),
        (not _positive(opts.rate), f"--rate {opts.rate}: above 0 requests/s, finite"),
        (None not in (opts.rate, opts.time_scale), "--rate and --time-scale both scale time: give one"),
        (opts.max_model_len is not None and opts.max_model_len < 2, "--max-model-len: 2 tokens at least"),
        (opts.block_tokens < 1, f"--hash-block-tokens {opts.block_tokens}: 1 token at least"),
        (not opts.hash_ids and opts.prefix_column is not None, "--no-hash-ids and --prefix-column: give one"),
    ]
    if opts.adapter_names is not None and len(opts.adapter_names) < opts.num_adapters:
        problems.append((True, f"--num-adapters {opts.num_adapters}: --adapters has {len(opts.adapter_names)}"))
    for bad, text in problems:
        if bad:
            raise TraceInputError(f"{text}: fix the option")
    if opts.popularity is not None:
        if opts.label_column is not None:
            raise TraceInputError("--popularity and --label-column both label requests: give one")
        parse_popularity(opts.popularity)
    if not opts.source.is_file():
        raise TraceInputError(f"{opts.source}: no such file: check the path")
    ids = (opts.prefix_column or columns.hash_ids) if opts.hash_ids else None
    return replace(columns, label=opts.label_column, hash_ids=ids)


def _read(path: Path, fmt: str, columns: Columns) -> tuple[TraceData, list[str], int]:
    """Every row as arrays, a label column's values as ids in order of first appearance
    (in ``adapter``, until they are folded onto adapters); the labels; the row count."""
    arrival, inputs, outputs, labels = array("d"), array("q"), array("q"), array("i")
    ids: dict[str, int] = {}
    hashes: list[list[int]] = []
    for _, t, i, o, label, hash_ids in read_rows(path, fmt, columns):
        arrival.append(t)
        inputs.append(i)
        outputs.append(o)
        if label is not None:
            labels.append(ids.setdefault(label, len(ids)))
        if hash_ids is not None:
            hashes.append(hash_ids)
    if not arrival:
        raise TraceInputError(f"{path}: no requests in the file: is it the {fmt} trace?")
    n = len(arrival)
    data = TraceData(
        header={},
        adapters=[],
        arrival_s=np.frombuffer(arrival, dtype=np.float64),
        adapter=np.frombuffer(labels, dtype=np.int32) if labels else np.zeros(n, dtype=np.int32),
        input_len=np.frombuffer(inputs, dtype=np.int64),
        output_len=np.frombuffer(outputs, dtype=np.int64),
        duration_s=0.0,
        hash_ids=HashIds.from_lists(hashes) if columns.hash_ids is not None else None,
    )
    return data, list(ids), n


def _at_most(seconds: float) -> str:
    """``seconds`` rounded down to the millisecond, as an option's value that fits."""
    return f"{math.floor(seconds * 1000) / 1000:.3f}".rstrip("0").rstrip(".")


def _cut(data: TraceData, opts: ImportOptions, steps: list[dict[str, Any]]) -> TraceData:
    """Sort, window and drop; an empty result is an error that says what emptied it."""
    data, moved = tf.sort_by_arrival(data)
    if moved:
        steps.append({"op": "sort", "rows_out_of_order": moved})
    span = float(data.arrival_s[-1] - data.arrival_s[0])
    try:
        data, outside = tf.window(data, opts.start, opts.duration)
    except ValueError:
        room = f"--duration {_at_most(span - opts.start)} or less, or " if span - opts.start >= 0.001 else ""
        raise TraceInputError(
            f"{opts.source}: --start {opts.start:g} --duration {opts.duration:g} runs to {opts.start + opts.duration:g}"
            f" s, past the trace's last request at {span:g} s from its first: give {room}leave --duration out "
            "to keep the trace to its end"
        ) from None
    if opts.start or opts.duration is not None:
        steps.append({"op": "window", "start_s": opts.start, "duration_s": opts.duration, "rows_outside": outside})
    if not len(data):
        asked = f"--start {opts.start:g}" + (f" --duration {opts.duration:g}" if opts.duration is not None else "")
        raise TraceInputError(
            f"{opts.source}: the window {asked} holds no request (the trace spans 0 to {span:g} s from its first "
            "request): choose a window within it"
        )
    data, no_output, no_input = tf.drop_empty(data)
    steps.append({"op": "drop", "rows_no_output": no_output, "rows_no_input": no_input})
    if not len(data):
        raise TraceInputError(f"{opts.source}: no request in the window has both input and output tokens")
    return data


def _label(data: TraceData, opts: ImportOptions, labels: list[str]) -> tuple[TraceData, dict[str, Any]]:
    """Each request's adapter from its label (``transforms.fold_labels``) or drawn by the
    popularity policy; and the step that says how."""
    if opts.label_column is not None:
        adapter, ranked = tf.fold_labels(data.adapter, opts.num_adapters)
        step: dict[str, Any] = {
            "op": "label",
            "label_column": opts.label_column,
            "labels": len(ranked),
            "adapters": opts.num_adapters,
        }
        if len(ranked) <= opts.num_adapters:
            step["adapter_labels"] = [labels[i] for i in ranked.tolist()]
        return replace(data, adapter=adapter), step
    chosen = opts.popularity or "uniform"
    policy, alpha = parse_popularity(chosen)
    data = replace(data, adapter=tf.popularity(len(data), opts.num_adapters, policy, alpha, opts.seed))
    return data, {"op": "label", "popularity": chosen, "adapters": opts.num_adapters, "seed": opts.seed}


def _hash_step(data: TraceData, block_tokens: int) -> dict[str, Any]:
    """The ids' block size, and how many rows list more ids than their prompt has blocks of
    it: a sign the ids stand for fewer tokens than ``--hash-block-tokens`` says."""
    blocks = -(-data.input_len // block_tokens)
    over = int(np.count_nonzero(np.diff(data.hash_ids.offsets) > blocks))
    return {"op": "hash_ids", "block_tokens": block_tokens, "rows_more_ids_than_blocks": over}


def _hash_warnings(header: dict[str, Any]) -> list[str]:
    step = next((s for s in header["transforms"] if s["op"] == "hash_ids"), None)
    if step is None or not step["rows_more_ids_than_blocks"]:
        return []
    return [
        f"{step['rows_more_ids_than_blocks']} rows list more hash ids than their prompt has blocks of "
        f"{step['block_tokens']} tokens (the extra ids were cut): if the ids stand for fewer tokens, "
        "give --hash-block-tokens"
    ]


def import_warnings(header: dict[str, Any]) -> list[str]:
    """What an import did that its user may not expect, for stderr: labels folded
    together onto shared adapters, adapters left without a request, or hash ids that
    reach past their prompts."""
    step = header["transforms"][-1]
    if "label_column" not in step:
        return _hash_warnings(header)
    column, labels, adapters = step["label_column"], step["labels"], step["adapters"]
    if labels > adapters:
        return [
            f"column {column!r} has {labels} labels for {adapters} adapters: folded by request count, the label "
            f"ranked r (from 0) on adapter r mod {adapters}; --num-adapters {labels} gives each its own",
            *_hash_warnings(header),
        ]
    if labels < adapters:
        return [
            f"column {column!r} has {labels} labels for {adapters} adapters: {adapters - labels} adapters get no "
            f"request; --num-adapters {labels} gives each label its own with none idle",
            *_hash_warnings(header),
        ]
    return _hash_warnings(header)


def _shape(data: TraceData, opts: ImportOptions, labels: list[str], steps: list[dict[str, Any]]) -> TraceData:
    """Clip, scale time and label."""
    if opts.max_model_len is not None:
        data, clipped = tf.clip(data, opts.max_model_len)
        steps.append({"op": "clip", "max_model_len": opts.max_model_len, "rows_clipped": clipped})
    if data.hash_ids is not None:
        # Ids past a (clipped) prompt's end share nothing it sends.
        data = replace(data, hash_ids=data.hash_ids.clipped(data.input_len, opts.block_tokens))
    if opts.rate is not None or opts.time_scale is not None:
        try:
            factor = tf.factor_for_rate(data, opts.rate) if opts.rate is not None else opts.time_scale
        except ValueError as exc:
            raise TraceInputError(f"{opts.source}: --rate {opts.rate:g}: {exc}: give a --duration") from None
        data = tf.scale_time(data, factor)
        steps.append({"op": "time_scale", "factor": factor, "rate": opts.rate})
    data, step = _label(data, opts, labels)
    steps.append(step)
    return data


def import_trace(opts: ImportOptions) -> TraceData:
    """The trace ``opts`` ask for, its header saying where it came from and how."""
    columns = _check(opts)
    data, labels, rows = _read(opts.source, opts.fmt, columns)
    steps: list[dict[str, Any]] = []
    if data.hash_ids is not None:
        steps.append(_hash_step(data, opts.block_tokens))
    data = _shape(_cut(data, opts, steps), opts, labels, steps)
    names = list(opts.adapter_names or (f"adapter-{i}" for i in range(opts.num_adapters)))[: opts.num_adapters]
    source = {
        "format": opts.fmt,
        "file": opts.source.name,
        "sha256": file_sha256(opts.source),
        "rows": rows,
        "columns": {role: name for role, name in columns.named()},
        "time_unit": columns.time_unit,
    }
    header: dict[str, Any] = {"source": source, "transforms": steps}
    if data.hash_ids is not None:
        header[BLOCK_KEY] = opts.block_tokens
    return replace(data, header=header, adapters=names)
