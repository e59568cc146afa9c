"""What an import (or a suite's replay) does to a trace, each step on arrays.

Each step returns the new trace and what it did, for the header: a trace says how it was
made from its source. Times are seconds from the trace's first request; every step
keeps the order of arrival.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from lorabench.load.traces.data import TIME_DECIMALS, TraceData

POLICIES = ("powerlaw", "zipf", "uniform", "round-robin")


def sort_by_arrival(data: TraceData) -> tuple[TraceData, int]:
    """Requests in arrival order (a stable sort: ties keep the file's order), and how many
    rows arrived before the row above them."""
    out_of_order = int(np.count_nonzero(np.diff(data.arrival_s) < 0))
    if not out_of_order:
        return data, 0
    return data.select(np.argsort(data.arrival_s, kind="stable")), out_of_order


def window(data: TraceData, start: float, duration: float | None) -> tuple[TraceData, int]:
    """The requests in ``[start, start + duration)`` seconds from the first request, moved
    so the window starts at 0; without ``duration``, everything from ``start`` on, and the
    trace lasts until its last request. Also: how many requests fell outside.

    A window that ends after the last request is refused (``ValueError``): the trace
    would claim ``duration`` seconds of traffic where the source has none, and its rate
    (and any time scale for a rate) would be wrong by the missing part."""
    first = float(data.arrival_s[0]) if len(data) else 0.0
    end = float(data.arrival_s[-1]) - first if len(data) else 0.0
    if duration is not None and start + duration > end:
        raise ValueError(
            f"the window [{start:g}, {start + duration:g}) s runs past the trace's last request, "
            f"{end:g} s after its first"
        )
    relative = data.arrival_s - (first + start)
    keep = relative >= 0
    if duration is not None:
        keep &= relative < duration
    inside = replace(data.select(keep), arrival_s=relative[keep])
    span = duration if duration is not None else (float(inside.arrival_s[-1]) if len(inside) else 0.0)
    return replace(inside, duration_s=span), len(data) - len(inside)


def drop_empty(data: TraceData) -> tuple[TraceData, int, int]:
    """Without the requests that have no output (failed ones in BurstGPT) or no input
    (nothing to send); how many of each were dropped."""
    no_output = data.output_len == 0
    no_input = (data.input_len == 0) & ~no_output
    return data.select(~(no_output | no_input)), int(no_output.sum()), int(no_input.sum())


def clip(data: TraceData, max_model_len: int) -> tuple[TraceData, int]:
    """Requests longer than ``max_model_len`` tokens in all made to fit: the output is kept
    (up to ``max_model_len - 1`` tokens) and the input shortened to the rest, as a server
    truncating the prompt would; decode, which a trace's users watch per user, stays as
    recorded. Also: how many were clipped."""
    over = data.input_len + data.output_len > max_model_len
    outputs = np.where(over, np.minimum(data.output_len, max_model_len - 1), data.output_len)
    inputs = np.where(over, max_model_len - outputs, data.input_len)
    return replace(data, input_len=inputs, output_len=outputs), int(over.sum())


def scale_time(data: TraceData, factor: float) -> TraceData:
    """Every arrival and the duration times ``factor``: the order and the burst shape stay."""
    return replace(data, arrival_s=data.arrival_s * factor, duration_s=data.duration_s * factor)


def factor_for_rate(data: TraceData, rate: float) -> float:
    """The time scale that makes the trace's mean rate (requests over its duration) ``rate``."""
    if not data.duration_s > 0:
        raise ValueError("the trace spans no time (one instant), so no time scale gives it a rate")
    return len(data) / (rate * data.duration_s)


def popularity(num_requests: int, num_adapters: int, policy: str, alpha: float, seed: int) -> np.ndarray:
    """Adapter indices for requests in arrival order, drawn with ``seed``:

    - ``powerlaw``: ``floor(n * X)`` with ``X ~ Power(alpha)``, as ``trace generate`` draws;
    - ``zipf``: adapter ``i`` with probability proportional to ``(i + 1) ** -alpha``;
    - ``uniform``: every adapter alike; ``round-robin``: in turn, no draw.
    """
    rng = np.random.default_rng(seed)
    if policy == "powerlaw":
        return np.minimum(num_adapters * rng.power(alpha, size=num_requests), num_adapters - 1).astype(np.int32)
    if policy == "zipf":
        weights = np.arange(1, num_adapters + 1, dtype=float) ** -alpha
        return rng.choice(num_adapters, size=num_requests, p=weights / weights.sum()).astype(np.int32)
    if policy == "uniform":
        return rng.integers(0, num_adapters, size=num_requests).astype(np.int32)
    return (np.arange(num_requests) % num_adapters).astype(np.int32)


def fold_labels(label: np.ndarray, num_adapters: int) -> tuple[np.ndarray, np.ndarray]:
    """Adapter indices for requests labelled ``label`` (ids from 0, in order of first
    appearance in the source), and the label ids by rank.

    Labels are ranked by their number of requests, most first (ties: the first to appear
    first); the label ranked ``r`` goes to adapter ``r % num_adapters``. So with no more
    labels than adapters each label has its own adapter, the busiest on adapter 0 as the
    popularity laws put it; with more, they are dealt round-robin by rank, which spreads
    the load, and every request of a label stays on one adapter."""
    counts = np.bincount(label)
    ranked = np.argsort(-counts, kind="stable")[: np.count_nonzero(counts)]
    adapter_of = np.zeros(len(counts), dtype=np.int32)
    adapter_of[ranked] = np.arange(len(ranked)) % num_adapters
    return adapter_of[label], ranked


def from_start(data: TraceData, start: float) -> TraceData:
    """The requests arriving at ``start`` seconds of the trace's time or after, times
    unchanged: what a replay that starts there can use."""
    return data.select(slice(int(np.searchsorted(data.arrival_s, start, side="left")), None))


def replay_window(data: TraceData, start: float, duration: float, rate: float) -> TraceData:
    """What a suite replays: the trace from ``start`` seconds on, its time scaled so that its
    first ``round(rate * duration)`` requests arrive over ``duration`` seconds (mean rate
    ``rate``, burst shape kept): a faster rate replays more of the trace in the same time."""
    need = round(rate * duration)
    if need < 1:
        raise ValueError(f"rate {rate:g} req/s over {duration:g} s is less than one request: raise either")
    rest = from_start(data, start)
    available = len(rest)
    if available < need:
        raise ValueError(
            f"from {start:g} s on the trace has {available} requests, and {duration:g} s at {rate:g} req/s needs "
            f"{need}: lower the rate or the duration, or import a longer window"
        )
    # The window ends where the next request would arrive, or where the trace ends.
    end = float(rest.arrival_s[need]) if available > need else max(data.duration_s, float(data.arrival_s[-1]))
    factor = duration / (end - start) if end > start else 1.0
    part = rest.select(slice(0, need))
    arrivals = np.round((part.arrival_s - start) * factor, TIME_DECIMALS)
    return replace(part, arrival_s=arrivals, duration_s=duration)
