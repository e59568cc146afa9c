"""Latency metrics of one batch from the engine's own per-request timestamps.

vLLM stamps each request in the engine core on one monotonic clock (``queued_ts``,
``scheduled_ts``, ``first_token_ts``, ``last_token_ts``); a server's requests are timed by
this process instead (``lorabench.targets.http``), with no queue or prefill apart. The batch's end-to-end time
is the wall clock around sending the whole batch and gathering its outputs. docs/metrics.md
defines every metric.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lorabench.load.workload import Batch
from lorabench.results.columns import PER_REQUEST_METRICS
from lorabench.results.records import Sample
from lorabench.results.stats import summary


class MeasurementError(RuntimeError):
    """The engine's output cannot be measured as configured."""


@dataclass(frozen=True)
class RoundSample:
    round: int
    e2e_ms: float
    requests: tuple[Sample, ...]

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / (self.e2e_ms / 1000.0)


def measure_round(round_index: int, e2e_s: float, outputs: Sequence[Any], batch: Batch, output_len: int) -> RoundSample:
    """Turn one batch's outputs into samples, checking they are what was asked."""
    if len(outputs) != len(batch.requests):
        raise MeasurementError(f"sent {len(batch.requests)} requests, the engine returned {len(outputs)}")
    samples = []
    for i, (out, req) in enumerate(zip(outputs, batch.requests)):
        generated = len(out.outputs[0].token_ids)
        if generated != output_len:
            raise MeasurementError(f"request {i} generated {generated} tokens instead of {output_len}")
        samples.append(
            Sample(
                round=round_index,
                request=i,
                adapter=req.adapter.name if req.adapter is not None else "",
                adapter_rank=req.adapter.rank if req.adapter is not None else None,
                prompt_tokens=len(out.prompt_token_ids or ()),
                output_tokens=generated,
                batch_e2e_ms=e2e_s * 1000.0,
                cached_tokens=getattr(out, "num_cached_tokens", None),
                **_times(out, generated),
            )
        )
    return RoundSample(round_index, e2e_s * 1000.0, tuple(samples))


def _times(out: Any, generated: int) -> dict[str, float | None]:
    """A request's times from the engine's timestamps; or, from a server (``lorabench.targets.http``),
    from the client's own (sent, first and last token arrived): no queue or prefill apart."""
    m = out.metrics
    if m is None and getattr(out, "timing", None) is not None:
        t = out.timing
        return {
            "queue_ms": math.nan,
            "prefill_ms": math.nan,
            "ttft_ms": (t.first_token_ts - t.sent_ts) * 1000.0,
            "decode_ms": (t.last_token_ts - t.first_token_ts) * 1000.0 / (generated - 1),
            "request_e2e_ms": (t.last_token_ts - t.sent_ts) * 1000.0,
        }
    if m is None or not m.first_token_ts:
        raise MeasurementError(
            "the engine returned no per-request timestamps: it must run with disable_log_stats=False"
        )
    return {
        "queue_ms": (m.scheduled_ts - m.queued_ts) * 1000.0,
        "ttft_ms": (m.first_token_ts - m.queued_ts) * 1000.0,
        "prefill_ms": (m.first_token_ts - m.scheduled_ts) * 1000.0,
        "decode_ms": (m.last_token_ts - m.first_token_ts) * 1000.0 / (generated - 1),
        "request_e2e_ms": (m.last_token_ts - m.queued_ts) * 1000.0,
    }


def summarize(rounds: Sequence[RoundSample]) -> dict[str, float]:
    """Mean and percentiles of each per-request metric over every request of every round,
    and of the batch's end-to-end time over rounds."""
    if not rounds:
        raise MeasurementError("no measured round")
    requests = [r for rnd in rounds for r in rnd.requests]
    metrics: dict[str, float] = {}
    for name in PER_REQUEST_METRICS:
        metrics.update(summary(name, [getattr(r, name) for r in requests]))
    metrics.update(summary("e2e_ms", [r.e2e_ms for r in rounds]))
    metrics["output_tokens_per_s"] = float(np.mean([r.output_tokens_per_s for r in rounds]))
    cached = [r.cached_tokens for r in requests]
    prompt = sum(r.prompt_tokens for r in requests)
    if None not in cached and prompt:
        metrics["prefix_hit_rate"] = sum(cached) / prompt
    return metrics
