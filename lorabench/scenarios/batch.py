"""A batch sent at once, timed over warm-up and measured rounds: the no-LoRA and multi-LoRA cases.

Order matters for honest numbers: the batch is built and its adapters are loaded before
the first round, so neither is inside any timed region.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from lorabench.measure import measure_round, summarize
from lorabench.scenarios.base import Outcome, Parametrization
from lorabench.schema import PER_REQUEST_METRICS, PERCENTILES
from lorabench.workload import build_batch

if TYPE_CHECKING:
    from lorabench.case import BenchCase
    from lorabench.config import ConfigFile
    from lorabench.engine import Engine

METRIC_COLUMNS = frozenset(
    col for name in (*PER_REQUEST_METRICS, "e2e_ms") for col in (name, *(f"{name}_p{p}" for p in PERCENTILES))
) | {"output_tokens_per_s"}
COLUMNS = METRIC_COLUMNS | {"batch_size", "input_len", "output_len"}


def batch_sizes(file: ConfigFile) -> Parametrization:
    sizes = file.matrix.batch_sizes
    return Parametrization("batch_size", sizes, [f"bs{b}" for b in sizes])


def run_batch(case: BenchCase, engine: Engine, batch_size: int, workload: str | None) -> Outcome:
    """``workload=None``: the same batch with no adapter."""
    m = case.config.matrix
    batch = build_batch(
        workload,
        batch_size,
        adapters=case.config.adapters,
        prompts=case.config.prompts,
        input_len=m.input_len,
        vocab_size=engine.vocab_size,
        seed=m.seed,
    )
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
    return Outcome(fields, samples, load_s, extra_info=metrics)
