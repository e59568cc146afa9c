"""``lorabench trace stats``: what a trace holds, in text.

Real traffic's rate changes over the day, so the rate over time comes first, as a line
of characters (one per bucket) and its extremes; then the lengths, the adapters' shares
and, for an imported trace, its source and what each import step did.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lorabench.load.traces import synthetic as trace
from lorabench.load.traces.data import IMPORTED_FORMAT, TraceData
from lorabench.load.traces.prefixes import predict

MAX_BUCKETS = 60
LEVELS = " .:-=+*#%@"
TOP_ADAPTERS = 10
# vLLM's default KV block size on GPUs; its CPU backend's is 128 (`trace stats --block-size`).
DEFAULT_ENGINE_BLOCK = 16


def _nice(value: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten that is at least ``value``."""
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value)


def rate_over_time(data: TraceData, max_buckets: int = MAX_BUCKETS) -> tuple[float, np.ndarray]:
    """The width of a bucket (seconds) and the rate in each (requests/s), over the trace.

    The last bucket is divided by the time it covers, not by a whole width: an even trace
    ending a tenth into it read as a dip to a fifth of its rate. A last piece under half a
    width joins the bucket before it, so that no sliver's one or two requests read as a peak."""
    span = max(data.duration_s, float(data.arrival_s[-1]) if len(data) else 0.0)
    width = _nice(span / max_buckets) if span > 0 else 1.0
    buckets = max(1, math.ceil(span / width))
    last = span - (buckets - 1) * width
    if buckets > 1 and last < width / 2:
        buckets, last = buckets - 1, last + width
    index = np.minimum((data.arrival_s // width).astype(np.int64), buckets - 1)
    widths = np.full(buckets, width)
    widths[-1] = last if last > 0 else width
    return width, np.bincount(index, minlength=buckets) / widths


def sparkline(rates: np.ndarray) -> str:
    top = rates.max() if len(rates) else 0.0
    if not top > 0:
        return LEVELS[0] * len(rates)
    return "".join(LEVELS[math.ceil(r / top * (len(LEVELS) - 1))] for r in rates)


def _rate_lines(data: TraceData) -> list[str]:
    width, rates = rate_over_time(data)
    mean = data.rate
    peak = f" (peak {rates.max() / mean:.1f}x the mean)" if mean > 0 else ""
    return [
        f"rate over time ({width:g} s buckets, req/s): min {rates.min():.3g}, median {np.median(rates):.3g}, "
        f"max {rates.max():.3g}{peak}",
        f"  |{sparkline(rates)}|",
    ]


def _length_lines(name: str, values: np.ndarray) -> list[str]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    head = f"{name} lengths: p50 {p50:.0f}, p90 {p90:.0f}, p99 {p99:.0f}, max {values.max()}, mean {values.mean():.1f}"
    return [head, *trace.histogram(values)]


def _share_lines(data: TraceData) -> list[str]:
    """The busiest adapters' shares; adapters with no request are named apart, not
    listed at 0 % as if they were part of the mix."""
    counts = np.bincount(data.adapter, minlength=len(data.adapters))
    used = np.count_nonzero(counts)
    order = np.argsort(-counts, kind="stable")[: min(TOP_ADAPTERS, used)]
    shown = ", ".join(f"{data.adapters[i]} {counts[i] / len(data):.1%}" for i in order)
    more = f" (top {TOP_ADAPTERS} of {used})" if used > TOP_ADAPTERS else ""
    lines = [f"adapter shares{more}: {shown}"]
    idle = [data.adapters[i] for i in np.flatnonzero(counts == 0)]
    if idle:
        named = ", ".join(idle[:TOP_ADAPTERS]) + (", ..." if len(idle) > TOP_ADAPTERS else "")
        lines.append(f"adapters without a request: {len(idle)} of {len(data.adapters)}: {named}")
    return lines


def _label_step(step: dict[str, Any]) -> str:
    if "hash_column" in step:
        # Files imported before labels were ranked: values hashed, so some may share an adapter.
        return f"adapters: column {step['hash_column']!r} hashed onto {step['adapters']}"
    column, labels, adapters = step["label_column"], step["labels"], step["adapters"]
    if labels > adapters:
        return (
            f"adapters: column {column!r}, {labels} labels folded onto {adapters} adapters by request count "
            f"(the label ranked r on adapter r mod {adapters})"
        )
    shown = ", ".join(map(repr, step["adapter_labels"][:TOP_ADAPTERS]))
    more = ", ..." if labels > TOP_ADAPTERS else ""
    idle = f"; {adapters - labels} adapters without one" if labels < adapters else ""
    return f"adapters: column {column!r}, {labels} labels, each its own adapter, busiest first: {shown}{more}{idle}"


def describe_step(step: dict[str, Any]) -> str:
    op = step["op"]
    if op == "sort":
        return f"sorted by arrival: {step['rows_out_of_order']} rows were out of order"
    if op == "window":
        length = "to the end" if step["duration_s"] is None else f"for {step['duration_s']:g} s"
        return f"window from {step['start_s']:g} s {length}: {step['rows_outside']} rows outside, left out"
    if op == "drop":
        return f"dropped: {step['rows_no_output']} rows without output, {step['rows_no_input']} without input"
    if op == "clip":
        return f"clipped to {step['max_model_len']} tokens (input shortened, output kept): {step['rows_clipped']} rows"
    if op == "hash_ids":
        over = step["rows_more_ids_than_blocks"]
        past = f"; {over} rows listed more ids than their prompt had blocks (cut)" if over else ""
        return f"hash ids kept, each {step['block_tokens']} tokens of prompt{past}"
    if op == "time_scale":
        asked = f" for {step['rate']:g} req/s" if step["rate"] is not None else ""
        return f"time scaled by {step['factor']:.6g}{asked}"
    if "popularity" not in step:
        return _label_step(step)
    return f"adapters: {step['popularity']} over {step['adapters']}, seed {step['seed']}"


def _source_lines(header: dict[str, Any]) -> list[str]:
    source = header["source"]
    return [
        f"source: {source['format']} file {source['file']} (sha256 {source['sha256'][:16]}...), {source['rows']} rows",
        *(f"  {describe_step(step)}" for step in header["transforms"]),
    ]


def prefix_lines(data: TraceData, engine_block: int = DEFAULT_ENGINE_BLOCK) -> list[str]:
    """The prefix hit rate a trace's hash ids predict for an infinite cache of ``engine_block``
    token blocks (``prefixes.predict``): overall and per adapter with vLLM's keys (an adapter
    reuses only its own blocks), and what the ids alone would share if adapters did not split them."""
    if data.hash_ids is None:
        return []
    block, tokens = data.block_tokens, data.input_len.sum()
    hits = predict(data.hash_ids, data.input_len, data.adapter, block, engine_block)
    pooled = predict(data.hash_ids, data.input_len, None, block, engine_block)
    per = np.bincount(data.adapter, weights=hits, minlength=len(data.adapters))
    sent = np.bincount(data.adapter, weights=data.input_len, minlength=len(data.adapters))
    order = [i for i in np.argsort(-sent, kind="stable")[:TOP_ADAPTERS] if sent[i]]
    shown = ", ".join(f"{data.adapters[i]} {per[i] / sent[i]:.1%}" for i in order)
    return [
        f"prefix hit rate the hash ids predict ({block}-token ids; an infinite cache of {engine_block}-token "
        f"blocks): {hits.sum() / tokens:.1%} of prompt tokens, each adapter reusing only its own blocks as vLLM "
        f"does; {pooled.sum() / tokens:.1%} if adapters shared them",
        f"  per adapter: {shown}",
    ]


def describe(data: TraceData, engine_block: int = DEFAULT_ENGINE_BLOCK) -> str:
    """Every section of ``lorabench trace stats``; a synthetic trace also says what its
    parameters asked for."""
    if data.header.get("format") != IMPORTED_FORMAT:
        params = trace.params_from_header(data.header)
        return "\n".join([trace.format_stats(params, data.adapters, data.requests()), *_rate_lines(data)])
    gaps = np.diff(data.arrival_s)
    cv = f"{gaps.std() / gaps.mean():.3f}" if len(gaps) > 1 and gaps.mean() > 0 else "n/a"
    lines = [
        *_source_lines(data.header),
        f"requests: {len(data)} over {data.duration_s:g} s: {data.rate:.3f} req/s",
        *_rate_lines(data),
        f"inter-arrival CV: {cv}",
        *_length_lines("input", data.input_len),
        *_length_lines("output", data.output_len),
        *_share_lines(data),
        *prefix_lines(data, engine_block),
    ]
    return "\n".join(lines)
