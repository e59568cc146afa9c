"""Synthetic online multi-LoRA traces, after S-LoRA's benchmark.

A trace is a list of requests, each with an arrival time, an adapter and input and
output lengths, drawn from:

- **arrivals**: a Gamma renewal process. Inter-arrival times are Gamma with shape
  ``1/cv**2`` and scale ``cv**2/rate``: mean ``1/rate``, coefficient of variation
  ``cv``. ``cv=1`` is a Poisson process; below 1 arrivals are more regular, above 1
  burstier.
- **adapter popularity**: a power law over adapter ranks. With ``X ~ Power(alpha)``
  (density ``alpha * x**(alpha - 1)`` on [0, 1]) a request goes to adapter
  ``floor(n * X)``, so adapter ``i`` (0-based) gets the share
  ``((i + 1) / n)**alpha - (i / n)**alpha``. ``alpha = 1`` spreads requests evenly;
  the smaller ``alpha``, the more requests go to the first few adapters.
- **lengths**: integers uniform on ``[low, high]``, or ``longtail``: a Pareto law of
  shape 1.5 truncated to ``[low, high]`` (most requests short, a few long).

A trace file is JSON lines: a header with the parameters, the adapter names and the
number of requests, then one request per line. The same parameters and seed give the
same file, byte for byte. This is version 1 of the format; version 2 holds imported
traces (``lorabench.load.traces``), with the same request lines; ``lorabench.load.traces.data``
reads both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from lorabench.load.traces.files import write_whole

FORMAT = "lorabench-trace/1"
LONGTAIL_SHAPE = 1.5


@dataclass(frozen=True)
class TraceParams:
    num_adapters: int
    rate: float
    alpha: float = 1.0
    cv: float = 1.0
    input_range: tuple[int, int] = (8, 64)
    output_range: tuple[int, int] = (8, 64)
    lengths: Literal["uniform", "longtail"] = "uniform"
    duration: float = 300.0
    seed: int = 0

    def check(self) -> None:
        problems = []
        if self.num_adapters < 1:
            problems.append(f"num_adapters must be at least 1, got {self.num_adapters}")
        if not 0 < self.rate < math.inf:
            problems.append(f"rate must be above 0 requests/s and finite, got {self.rate}")
        if not 0 < self.alpha < math.inf:
            problems.append(f"alpha must be above 0 and finite, got {self.alpha}")
        if not 0 < self.cv < math.inf:
            problems.append(f"cv must be above 0 and finite, got {self.cv}")
        if not 0 < self.duration < math.inf:
            problems.append(f"duration must be above 0 s and finite, got {self.duration}")
        for name in ("input_range", "output_range"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                problems.append(f"{name} must satisfy 1 <= low <= high, got [{low}, {high}]")
        if self.lengths not in ("uniform", "longtail"):
            problems.append(f"lengths must be 'uniform' or 'longtail', got {self.lengths!r}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    adapter: str
    input_len: int
    output_len: int
    # Block hash ids (``lorabench.load.traces.prefixes``): the prompt's leading blocks of
    # ``block_tokens`` each, shared with every request whose ids start alike. Imported only.
    hash_ids: tuple[int, ...] = ()
    block_tokens: int = 0


def adapter_shares(num_adapters: int, alpha: float) -> np.ndarray:
    """The expected share of requests of each adapter, by rank."""
    edges = (np.arange(num_adapters + 1) / num_adapters) ** alpha
    return np.diff(edges)


def _lengths(rng: np.random.Generator, kind: str, low: int, high: int, size: int) -> np.ndarray:
    if kind == "uniform":
        return rng.integers(low, high + 1, size=size)
    # Inverse CDF of a Pareto(shape) law truncated to [low, high + 1).
    u = rng.random(size)
    a, b = float(low), float(high + 1)
    x = (a**-LONGTAIL_SHAPE - u * (a**-LONGTAIL_SHAPE - b**-LONGTAIL_SHAPE)) ** (-1 / LONGTAIL_SHAPE)
    return np.minimum(np.floor(x).astype(int), high)


def generate(params: TraceParams, adapters: Sequence[str]) -> list[TraceRequest]:
    """Requests arriving in ``[0, duration)``; adapter ``i`` of the popularity law is ``adapters[i]``."""
    params.check()
    if len(adapters) < params.num_adapters:
        raise ValueError(f"the trace needs {params.num_adapters} adapters, {len(adapters)} are available")
    # One stream per component, so the draws of one never depend on how many another used.
    arrival_rng, adapter_rng, input_rng, output_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(params.seed).spawn(4)
    )
    shape, scale = 1.0 / params.cv**2, params.cv**2 / params.rate
    arrivals: list[float] = []
    now = 0.0
    while now < params.duration:
        times = now + np.cumsum(arrival_rng.gamma(shape, scale, size=1024))
        arrivals.extend(times[times < params.duration].tolist())
        now = float(times[-1])
    n = len(arrivals)
    ranks = np.minimum(
        (params.num_adapters * adapter_rng.power(params.alpha, size=n)).astype(int), params.num_adapters - 1
    )
    inputs = _lengths(input_rng, params.lengths, *params.input_range, n)
    outputs = _lengths(output_rng, params.lengths, *params.output_range, n)
    return [
        TraceRequest(round(t, 6), adapters[r], int(i), int(o)) for t, r, i, o in zip(arrivals, ranks, inputs, outputs)
    ]


def write(path: Path, params: TraceParams, adapters: Sequence[str], requests: Sequence[TraceRequest]) -> None:
    """The trace as version 1, whole or not at all; its header counts the requests, which
    ``lorabench.load.traces.data.load`` checks."""
    header = {
        "format": FORMAT,
        "params": asdict(params),
        "adapters": list(adapters[: params.num_adapters]),
        "requests": len(requests),
    }
    lines = [json.dumps(header, sort_keys=True)]
    fields = ("arrival_s", "adapter", "input_len", "output_len")
    lines += [json.dumps({f: getattr(r, f) for f in fields}, sort_keys=True) for r in requests]
    write_whole(Path(path), ["\n".join(lines) + "\n"])


def params_from_header(header: dict) -> TraceParams:
    raw = header["params"]
    return TraceParams(**{**raw, "input_range": tuple(raw["input_range"]), "output_range": tuple(raw["output_range"])})


def histogram(values: np.ndarray, bins: int = 8, width: int = 40) -> list[str]:
    counts, edges = np.histogram(values, bins=bins)
    top = max(int(counts.max()), 1)
    return [
        f"  [{edges[i]:6.0f}, {edges[i + 1]:6.0f})  {counts[i]:6d}  {'#' * round(width * counts[i] / top)}"
        for i in range(len(counts))
    ]


def stats(params: TraceParams, adapters: Sequence[str], requests: Sequence[TraceRequest]) -> dict:
    """What the trace achieved, to set against what its parameters asked for."""
    arrivals = np.array([r.arrival_s for r in requests])
    gaps = np.diff(arrivals)
    counts = np.array([sum(r.adapter == a for r in requests) for a in adapters])
    ranked = np.sort(counts)[::-1]
    top = max(1, len(adapters) // 10)
    return {
        "requests": len(requests),
        "rate": len(requests) / params.duration,
        "interarrival_cv": float(gaps.std() / gaps.mean()) if len(gaps) > 1 else float("nan"),
        "adapter_requests": dict(zip(adapters, counts.tolist())),
        "top1_share": float(ranked[0] / len(requests)) if requests else 0.0,
        f"top{top}_share": float(ranked[:top].sum() / len(requests)) if requests else 0.0,
        "expected_top1_share": float(adapter_shares(params.num_adapters, params.alpha).max()),
    }


def format_stats(params: TraceParams, adapters: Sequence[str], requests: Sequence[TraceRequest]) -> str:
    s = stats(params, adapters, requests)
    inputs = np.array([r.input_len for r in requests])
    outputs = np.array([r.output_len for r in requests])
    lines = [
        f"requests: {s['requests']} over {params.duration:g} s",
        f"rate: {s['rate']:.3f} req/s (asked {params.rate:g})",
        f"inter-arrival CV: {s['interarrival_cv']:.3f} (asked {params.cv:g})",
        f"top adapter share: {s['top1_share']:.3f} "
        f"(expected {s['expected_top1_share']:.3f} for alpha={params.alpha:g})",
        *(f"{k.replace('_', ' ')}: {v:.3f}" for k, v in s.items() if k.startswith("top") and k != "top1_share"),
        "requests per adapter: " + ", ".join(f"{a}={c}" for a, c in s["adapter_requests"].items()),
        f"input lengths ({params.lengths} on [{params.input_range[0]}, {params.input_range[1]}]):",
        *histogram(inputs),
        f"output lengths ({params.lengths} on [{params.output_range[0]}, {params.output_range[1]}]):",
        *histogram(outputs),
    ]
    return "\n".join(lines)
