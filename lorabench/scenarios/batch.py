"""A batch sent at once, timed over warm-up and measured rounds: the no-LoRA and multi-LoRA cases.

Order matters for honest numbers: the batch is built and its adapters are loaded before
the first round, so neither is inside any timed region.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from lorabench.measure import measure_round, summarize
from lorabench.scenarios.base import Outcome, Parametrization
from lorabench.schema import PER_REQUEST_METRICS, PERCENTILES, Sample
from lorabench.workload import Batch, build_batch

if TYPE_CHECKING:
    from lorabench.case import BenchCase
    from lorabench.config import ConfigFile
    from lorabench.engine import Engine

METRIC_COLUMNS = frozenset(
    col for name in (*PER_REQUEST_METRICS, "e2e_ms") for col in (name, *(f"{name}_p{p}" for p in PERCENTILES))
) | {"output_tokens_per_s"}
COLUMNS = METRIC_COLUMNS | {"batch_size", "input_len", "output_len"}
OVERHEAD_COLUMNS = frozenset({"baseline_e2e_ms", "lora_overhead"})
MIXED_COLUMNS = frozenset({"base_share", "base_ttft_ms", "lora_ttft_ms", "base_decode_ms", "lora_decode_ms"})


def batch_sizes(file: ConfigFile) -> Parametrization:
    sizes = file.matrix.batch_sizes
    return Parametrization("batch_size", sizes, [f"bs{b}" for b in sizes])


def _batch(case: BenchCase, engine: Engine, batch_size: int, workload: str | None) -> Batch:
    m = case.config.matrix
    return build_batch(
        workload,
        batch_size,
        adapters=case.config.adapters,
        prompts=case.config.prompts,
        input_len=m.input_len,
        vocab_size=engine.vocab_size,
        seed=m.seed,
        shape=case.config.shape,
    )


def baseline_e2e_ms(case: BenchCase, engine: Engine, batch_size: int) -> float:
    """The mean e2e of the same batch with no adapter, on this build, over the case's rounds;
    measured once per build and batch size, the first time a multi-LoRA case needs it."""
    key = ("baseline_e2e_ms", batch_size)
    if key not in engine.memo:
        m = case.config.matrix
        batch = _batch(case, engine, batch_size, None)
        prompts, adapters = [r.prompt for r in batch.requests], [None] * batch_size
        times = []
        for _ in range(m.warmup_rounds + m.rounds):
            start = time.perf_counter()
            engine.generate(prompts, adapters, m.output_len)
            times.append((time.perf_counter() - start) * 1000.0)
        engine.memo[key] = sum(times[m.warmup_rounds :]) / m.rounds
    return engine.memo[key]


def split_by_adapter(samples: list[Sample]) -> dict[str, float]:
    """Mean TTFT and decode of base-model and of LoRA requests, apart (mixed batches)."""
    base = [s for s in samples if s.adapter_rank is None]
    lora = [s for s in samples if s.adapter_rank is not None]
    out = {"base_share": len(base) / len(samples)}
    for prefix, group in (("base", base), ("lora", lora)):
        for metric in ("ttft_ms", "decode_ms"):
            out[f"{prefix}_{metric}"] = sum(getattr(s, metric) for s in group) / len(group)
    return out


def run_batch(case: BenchCase, engine: Engine, batch_size: int, workload: str | None) -> Outcome:
    """``workload=None``: the same batch with no adapter."""
    m = case.config.matrix
    batch = _batch(case, engine, batch_size, workload)
    prompts = [r.prompt for r in batch.requests]
    adapters = [r.adapter for r in batch.requests]
    raw: list[tuple[float, list[Any]]] = []

    def one_round() -> None:
        start = time.perf_counter()
        outputs = engine.generate(prompts, adapters, m.output_len)
        raw.append((time.perf_counter() - start, outputs))

    def serve() -> float:
        load_s = engine.load_adapters(batch.adapters)
        case.benchmark.pedantic(one_round, rounds=m.rounds, warmup_rounds=m.warmup_rounds, iterations=1)
        return load_s

    load_s = case.on_engine(engine, serve)
    # pedantic runs the warm-up rounds first; with --benchmark-disable it runs once, unwarmed.
    measured = [
        measure_round(i, elapsed, outputs, batch, m.output_len) for i, (elapsed, outputs) in enumerate(raw[-m.rounds :])
    ]
    metrics = summarize(measured)
    prompt_tokens = [r.prompt_tokens for rnd in measured for r in rnd.requests]
    fields = {
        "workload": workload or "none",
        "batch_size": batch_size,
        "input_len": m.input_len if m.input_len is not None else round(sum(prompt_tokens) / len(prompt_tokens)),
        "output_len": m.output_len,
        "num_adapters": len(batch.pool),
        "rounds": len(measured),
        "warmup_rounds": m.warmup_rounds if len(raw) > len(measured) else 0,
        **metrics,
    }
    samples = [s for rnd in measured for s in rnd.requests]
    if workload is not None:
        baseline = case.on_engine(engine, lambda: baseline_e2e_ms(case, engine, batch_size))
        fields.update(baseline_e2e_ms=baseline, lora_overhead=metrics["e2e_ms"] / baseline)
    if workload == "mixed":
        fields.update(split_by_adapter(samples))
    return Outcome(fields, samples, load_s, extra_info=metrics)
