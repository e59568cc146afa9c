"""One benchmark case: a batch on one engine, timed over warm-up and measured rounds.

Order matters for honest numbers: the batch is built and its adapters are loaded
before the first round, so neither is inside any timed region.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from lorabench.config import BenchConfig
from lorabench.engine import Engine, is_engine_dead
from lorabench.measure import measure_round, sample_rows, summarize
from lorabench.results import ResultWriter, utc_now
from lorabench.workload import build_batch

SCENARIOS = ("no_lora", "multilora")


@dataclass
class BenchCase:
    """What one benchmark test needs: handed to it by the ``lorabench`` fixture."""

    config: BenchConfig
    benchmark: Any
    writer: ResultWriter
    provenance: dict[str, Any]
    scenario: str
    test_id: str

    def run(self, engine: Engine, batch_size: int, workload: str | None = None) -> dict[str, Any]:
        """Run the case, write its row and samples to disk, and return the row."""
        if (self.scenario == "multilora") != (workload is not None):
            raise ValueError(f"scenario {self.scenario!r} {'needs' if workload is None else 'takes no'} workload")
        if self.scenario == "multilora" and not engine.spec.enable_lora:
            raise ValueError(f"multi-LoRA cases need a LoRA-enabled engine, got {engine.id}")
        if engine.died:
            pytest.fail(f"engine {engine.id} died in an earlier case, {engine.died}", pytrace=False)
        m = self.config.matrix
        batch = build_batch(
            workload,
            batch_size,
            adapters=self.config.adapters,
            prompts=self.config.prompts,
            input_len=m.input_len,
            vocab_size=engine.vocab_size,
            seed=m.seed,
        )
        raw: list[tuple[float, list[Any]]] = []

        def one_round() -> None:
            start = time.perf_counter()
            outputs = engine.generate(batch, m.output_len)
            raw.append((time.perf_counter() - start, outputs))

        try:
            engine.check_alive()
            load_s = engine.load_adapters(batch.adapters)
            self.benchmark.pedantic(one_round, rounds=m.rounds, warmup_rounds=m.warmup_rounds, iterations=1)
        except Exception as exc:
            if not is_engine_dead(exc):
                raise
            engine.died = f"{self.test_id}: {type(exc).__name__}: {exc}"
        if engine.died:
            pytest.fail(f"engine {engine.id} died: {engine.died}", pytrace=False)
        # pedantic runs the warm-up rounds first; with --benchmark-disable it runs once, unwarmed.
        measured = [
            measure_round(i, elapsed, outputs, batch, m.output_len)
            for i, (elapsed, outputs) in enumerate(raw[-m.rounds :])
        ]
        metrics = summarize(measured)
        prompt_tokens = [r.prompt_tokens for rnd in measured for r in rnd.requests]
        spec = engine.spec
        row = {
            "timestamp": utc_now(),
            **self.provenance,
            "scenario": self.scenario,
            "workload": workload or "none",
            "batch_size": batch_size,
            "input_len": m.input_len if m.input_len is not None else round(sum(prompt_tokens) / len(prompt_tokens)),
            "output_len": m.output_len,
            "num_adapters": len(batch.pool),
            "enable_lora": spec.enable_lora,
            "max_loras": spec.max_loras or "",
            "max_lora_rank": spec.max_lora_rank or "",
            "max_cpu_loras": spec.max_cpu_loras or "",
            "rounds": len(measured),
            **metrics,
            "warmup_rounds": m.warmup_rounds if len(raw) > len(measured) else 0,
            "engine_id": engine.id,
            "adapter_load_ms": load_s * 1000.0,
            "engine_build_s": engine.build_s,
            "peak_memory_mb": engine.memory.update(),
            "memory_source": engine.memory.source,
            "test_id": self.test_id,
        }
        self.writer.append(row, sample_rows(measured))
        self.benchmark.extra_info.update({k: row[k] for k in (*metrics, "adapter_load_ms", "peak_memory_mb")})
        return row
