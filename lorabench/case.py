"""One benchmark case: a batch on one engine, timed over warm-up and measured rounds.

Order matters for honest numbers: the batch is built and its adapters are loaded
before the first round, so neither is inside any timed region.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from lorabench import trace
from lorabench.config import BenchConfig, OnlineCase
from lorabench.engine import Engine, is_engine_dead
from lorabench.measure import measure_round, sample_rows, summarize
from lorabench.replay import ReplayedRequest, replay, summarize_online
from lorabench.results import ResultWriter, utc_now
from lorabench.workload import build_batch

SCENARIOS = ("no_lora", "multilora", "online")


@dataclass
class BenchCase:
    """What one benchmark test needs: handed to it by the ``lorabench`` fixture."""

    config: BenchConfig
    benchmark: Any
    writer: ResultWriter
    provenance: dict[str, Any]
    scenario: str
    test_id: str

    def _on_engine(self, engine: Engine, work: Callable[[], float]) -> float:
        """Run ``work`` on ``engine``. A dead engine fails this case with the reason, and
        every later case of its configuration without touching it again."""
        if engine.died:
            pytest.fail(f"engine {engine.id} died in an earlier case, {engine.died}", pytrace=False)
        try:
            engine.check_alive()
            return work()
        except Exception as exc:
            if not is_engine_dead(exc):
                raise
            engine.died = f"{self.test_id}: {type(exc).__name__}: {exc}"
        pytest.fail(f"engine {engine.id} died: {engine.died}", pytrace=False)

    def _row(self, engine: Engine, load_s: float, **fields: Any) -> dict[str, Any]:
        """A result row: provenance, the engine configuration, and the case's own fields."""
        spec = engine.spec
        return {
            "timestamp": utc_now(),
            **self.provenance,
            "enable_lora": spec.enable_lora,
            "max_loras": spec.max_loras or "",
            "max_lora_rank": spec.max_lora_rank or "",
            "max_cpu_loras": spec.max_cpu_loras or "",
            **fields,
            "engine_id": engine.id,
            "build": spec.build,
            "adapter_load_ms": load_s * 1000.0,
            "engine_build_s": engine.build_s,
            "kv_cache_tokens": engine.kv_cache_tokens,
            "peak_memory_mb": engine.memory.update(),
            "memory_source": engine.memory.source,
            "test_id": self.test_id,
        }

    def run(self, engine: Engine, batch_size: int, workload: str | None = None) -> dict[str, Any]:
        """Run the case, write its row and samples to disk, and return the row."""
        if (self.scenario == "multilora") != (workload is not None):
            raise ValueError(f"scenario {self.scenario!r} {'needs' if workload is None else 'takes no'} workload")
        if self.scenario == "multilora" and not engine.spec.enable_lora:
            raise ValueError(f"multi-LoRA cases need a LoRA-enabled engine, got {engine.id}")
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

        def serve() -> float:
            load_s = engine.load_adapters(batch.adapters)
            self.benchmark.pedantic(one_round, rounds=m.rounds, warmup_rounds=m.warmup_rounds, iterations=1)
            return load_s

        load_s = self._on_engine(engine, serve)
        # pedantic runs the warm-up rounds first; with --benchmark-disable it runs once, unwarmed.
        measured = [
            measure_round(i, elapsed, outputs, batch, m.output_len)
            for i, (elapsed, outputs) in enumerate(raw[-m.rounds :])
        ]
        metrics = summarize(measured)
        prompt_tokens = [r.prompt_tokens for rnd in measured for r in rnd.requests]
        row = self._row(
            engine,
            load_s,
            scenario=self.scenario,
            workload=workload or "none",
            batch_size=batch_size,
            input_len=m.input_len if m.input_len is not None else round(sum(prompt_tokens) / len(prompt_tokens)),
            output_len=m.output_len,
            num_adapters=len(batch.pool),
            rounds=len(measured),
            warmup_rounds=m.warmup_rounds if len(raw) > len(measured) else 0,
            **metrics,
        )
        self.writer.append(row, sample_rows(measured))
        self.benchmark.extra_info.update({k: row[k] for k in (*metrics, "adapter_load_ms", "peak_memory_mb")})
        return row

    def run_online(self, engine: Engine, case: OnlineCase) -> dict[str, Any]:
        """Replay one synthetic trace on an async engine; write its row and per-request samples."""
        online = self.config.file.online
        adapters = {a.name: a for a in self.config.adapters[: case.params.num_adapters]}
        requests = trace.generate(case.params, list(adapters))
        records: list[ReplayedRequest] = []

        def one_replay() -> None:
            records[:] = engine.run(
                replay(
                    engine.llm,
                    requests,
                    lambda name: engine.lora_request(adapters[name]),
                    vocab_size=engine.vocab_size,
                    seed=case.params.seed,
                    drain_timeout_s=online.drain_timeout_s,
                )
            )

        def serve() -> float:
            load_s = engine.load_adapters(list(adapters.values()))
            self.benchmark.pedantic(one_replay, rounds=1, warmup_rounds=0, iterations=1)
            return load_s

        load_s = self._on_engine(engine, serve)
        metrics, per_adapter = summarize_online(
            records, slo_ttft_ms=online.slo_ttft_ms, slo_tpot_ms=online.slo_tpot_ms, warmup_s=online.warmup_s
        )
        p = case.params
        row = self._row(
            engine,
            load_s,
            scenario="online",
            workload="trace",
            num_adapters=p.num_adapters,
            rounds=1,
            warmup_rounds=0,
            trace_suite=case.suite,
            trace_num_adapters=p.num_adapters,
            trace_rate=p.rate,
            trace_alpha=p.alpha,
            trace_cv=p.cv,
            trace_duration_s=p.duration,
            trace_lengths=p.lengths,
            trace_input_range=f"{p.input_range[0]}-{p.input_range[1]}",
            trace_output_range=f"{p.output_range[0]}-{p.output_range[1]}",
            trace_seed=p.seed,
            **metrics,
        )
        samples = [
            {
                "round": 0, "request": r.index, "adapter": r.adapter, "prompt_tokens": r.input_len,
                "output_tokens": len(r.token_times), "queue_ms": r.queue_ms, "ttft_ms": r.ttft_ms,
                "decode_ms": r.tpot_ms, "request_e2e_ms": r.e2e_ms, "arrival_s": r.scheduled_s,
                "send_lag_ms": r.send_lag_ms, "finished": r.finished,
            }
            for r in records
        ]
        self.writer.append(row, samples)
        self.benchmark.extra_info.update({**metrics, "per_adapter": per_adapter})
        return row
