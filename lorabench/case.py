"""One benchmark case: a scenario run on one engine build, recorded as one typed row.

The scenario decides what is sent and measured; this module adds what every row
carries (provenance, the engine build, memory), checks the row against the scenario's
declared columns, and makes it durable before the next case starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from lorabench.config import BenchConfig
from lorabench.correctness import AdapterNotApplied, DigestBook
from lorabench.engine import Engine, is_engine_dead
from lorabench.results import ResultWriter, utc_now
from lorabench.scenarios import Scenario
from lorabench.schema import ResultRow, check_row


@dataclass
class BenchCase:
    """What one benchmark test needs: handed to it by the ``lorabench`` fixture."""

    config: BenchConfig
    benchmark: Any
    writer: ResultWriter
    provenance: dict[str, Any]
    scenario: Scenario
    test_id: str
    digests: DigestBook
    # Writes a line to the terminal while the case runs (progress of a long replay).
    progress: Callable[[str], None] | None = None

    def on_engine(self, engine: Engine, work: Callable[[], float]) -> float:
        """Run ``work`` on ``engine``. A dead engine fails this case with the reason, and
        every later case of its build without touching it again."""
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

    def _build_digests(self, engine: Engine) -> int:
        """Adapters whose greedy output on this build differs from the run's reference;
        checked once per build, before its first case, outside any timing."""
        if "digests" not in engine.memo:
            try:
                records = self.on_engine(
                    engine, lambda: self.digests.check_build(engine, self.config.adapters, self.provenance)
                )
            except AdapterNotApplied as exc:
                engine.memo["digests"] = exc
            else:
                self.writer.append_digests(records)
                engine.memo["digests"] = self.digests.mismatches(records)
        result = engine.memo["digests"]
        if isinstance(result, AdapterNotApplied):
            pytest.fail(str(result), pytrace=False)
        return result

    def run(self, engine: Engine, **params: Any) -> ResultRow:
        """Run the case, write its row and samples to disk, and return the row."""
        mismatches = self._build_digests(engine) if engine.spec.enable_lora and self.config.adapters else None
        outcome = self.scenario.run(self, engine, **params)
        if mismatches is not None:
            mismatches += outcome.digest_mismatches
        spec = engine.spec
        row = ResultRow(
            timestamp=utc_now(),
            **self.provenance,
            scenario=self.scenario.name,
            enable_lora=spec.enable_lora,
            max_loras=spec.max_loras,
            max_lora_rank=spec.max_lora_rank,
            max_cpu_loras=spec.max_cpu_loras,
            engine_id=engine.id,
            build=spec.build,
            adapter_load_ms=outcome.adapter_load_s * 1000.0,
            engine_build_s=engine.build_s,
            kv_cache_tokens=engine.kv_cache_tokens,
            digest_mismatches=mismatches,
            peak_memory_mb=engine.memory.update(),
            memory_source=engine.memory.source,
            test_id=self.test_id,
            **outcome.fields,
        )
        check_row(row, self.scenario.columns, self.scenario.maybe_columns)
        self.writer.append(row, outcome.samples)
        self.benchmark.extra_info.update(
            {**outcome.extra_info, "adapter_load_ms": row.adapter_load_ms, "peak_memory_mb": row.peak_memory_mb}
        )
        return row
