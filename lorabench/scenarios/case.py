"""One benchmark case: a scenario run on one engine build, recorded as one typed row.

The scenario decides what is sent and measured; this module prepares each engine build
once (its adapter load time, its output digests), adds what every row carries
(provenance, the engine build, memory), and makes the row durable before anything else
can fail: a row that breaks its scenario's declared columns is written first, then
fails its test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import pytest

from lorabench.config import BenchConfig
from lorabench.config.target import INPROCESS
from lorabench.measure.correctness import AdapterNotApplied, DigestBook
from lorabench.measure.sequential import Design, builds_fields
from lorabench.measure.wallclock import MEASURED, WallClock
from lorabench.results.files import ResultWriter
from lorabench.results.provenance import utc_now
from lorabench.results.records import SAMPLE_KEY
from lorabench.results.schema import ENGINE_ONLY, ResultRow
from lorabench.results.schema_check import SchemaError, check_row
from lorabench.scenarios import Context, Outcome, Scenario
from lorabench.targets.engine import Engine
from lorabench.targets.failures import is_engine_dead


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
    progress: Callable[[str], None] | None = None
    clock: WallClock = field(default_factory=WallClock)
    # Stopping across builds (matrix.max_builds): its design, whose verdict each row records; None without.
    builds_design: Design | None = None

    def _engine_died(self, engine: Engine, exc: BaseException) -> NoReturn:
        log = f" (engine log: {engine.log_path})" if engine.log_path is not None else ""
        engine.died = f"{self.test_id}: {type(exc).__name__}: {exc}{log}"
        if engine.spec.engine_variant:  # as a variant build that fails to build (pytest_plugin.fixtures)
            pytest.skip(f"engine {engine.id} died: {engine.died}: the variant build's check is not judged")
        pytest.fail(f"engine {engine.id} died: {engine.died}", pytrace=False)

    def _on_engine(self, engine: Engine, work: Callable[[], Any]) -> Any:
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
            self._engine_died(engine, exc)

    def _prepare(self, engine: Engine) -> None:
        """Once per build, before its first case and outside any case's timing: the
        adapters' greedy digests against the run's reference, then each adapter's load
        from disk, timed alone."""
        state, adapters = engine.state, self.config.adapters
        if state.prepared:
            return
        state.prepared = True
        if not (engine.spec.enable_lora and adapters):
            return
        try:
            records = self.digests.check_build(engine, adapters, self.provenance)
        except AdapterNotApplied as exc:
            state.digest_failure = str(exc)
            return
        self.writer.append_digests(records)
        state.digest_mismatches = self.digests.mismatches(records)
        with self.clock.timing(MEASURED):
            state.adapter_load_s = engine.measure_adapter_loads(adapters)

    def run(self, engine: Engine, **params: Any) -> ResultRow:
        """Run the case, write its row and samples to disk, and return the row."""
        keeper = _Keeper(self, engine)
        ctx = Context(self.config, self.benchmark, self.digests, keeper, self.progress, self.clock)

        def work() -> Outcome:
            self._prepare(engine)
            if engine.state.digest_failure:
                pytest.fail(engine.state.digest_failure, pytrace=False)
            return self.scenario.run(ctx, engine, **params)

        failed = engine.failed_requests
        outcome = self._on_engine(engine, work)
        if self.builds_design is not None:
            outcome.fields.update(builds_fields(self.builds_design, [*self._earlier_builds(engine), outcome.fields]))
        row = self._row(engine, outcome, None if failed is None else engine.failed_requests - failed, keeper.stamp)
        self.writer.append(row, outcome.samples, outcome.records)
        self.benchmark.extra_info.update(
            {**outcome.extra_info, "adapter_load_ms": row.adapter_load_ms, "peak_memory_mb": row.peak_memory_mb}
        )
        try:
            check_row(row, self.scenario.columns, self.scenario.maybe_columns)
        except SchemaError as exc:
            pytest.fail(f"{exc} (the row is written to {self.writer.path})", pytrace=False)
        if outcome.failure:
            pytest.fail(f"{outcome.failure} (the row and its records are in {self.writer.path})", pytrace=False)
        return row

    def _earlier_builds(self, engine: Engine) -> list[dict[str, Any]]:
        """This case's rows on the builds before this one, in build order (the same test id with
        an earlier build's engine id)."""
        spec = engine.spec
        ids = {self.test_id.replace(spec.id, replace(spec, build=b).id): b for b in range(spec.build)}
        found = {ids[r.test_id]: r for r in self.writer.rows if r.test_id in ids}
        return [asdict(found[b]) for b in sorted(found)]

    def _row(self, engine: Engine, outcome: Outcome, failed: int | None, stamp: str | None) -> ResultRow:
        """``failed``: the case's requests that failed and were counted (HTTP targets);
        ``stamp``: the case's time where records were kept before it (``_Keeper``), else now."""
        values = self._values(engine, outcome, stamp or utc_now())
        # A replay counts its own, over the requests its other columns count (after the warm-up).
        failed = values.pop("failed", failed)
        return ResultRow(**values, failed=failed, peak_memory_mb=engine.memory.update())

    def _values(self, engine: Engine, outcome: Outcome, stamp: str) -> dict[str, Any]:
        """The row's columns but its memory peak and failed requests. On an HTTP target, what
        only an in-process engine can stamp is left blank (``schema.ENGINE_ONLY``)."""
        spec, state = engine.spec, engine.state
        fields = outcome.fields
        if engine.target != INPROCESS:
            fields = {k: v for k, v in fields.items() if k not in ENGINE_ONLY}
        mismatches = state.digest_mismatches
        if mismatches is not None:
            mismatches += outcome.digest_mismatches
        load_s = state.adapter_load_s
        return dict(
            timestamp=stamp,
            **{**self.provenance, **engine.provenance()},
            endpoint=engine.endpoint,
            target=engine.target,
            scenario=self.scenario.name,
            enable_lora=spec.enable_lora,
            max_loras=spec.max_loras,
            max_lora_rank=spec.max_lora_rank,
            max_cpu_loras=spec.max_cpu_loras,
            enforce_eager=spec.enforce_eager,
            graph_config=spec.graph_config,
            enable_prefix_caching=spec.enable_prefix_caching,
            engine_variant=spec.engine_variant or None,
            prefix_cache_salted=True if spec.enable_prefix_caching else None,
            **engine.graph.columns(),
            engine_id=engine.id,
            build=spec.build,
            adapter_load_ms=load_s * 1000.0 if load_s is not None else None,
            engine_build_s=engine.build_s,
            kv_cache_tokens=engine.kv_cache_tokens,
            digest_mismatches=mismatches,
            memory_source=engine.memory.source,
            test_id=self.test_id,
            **fields,
        )


@dataclass
class _Keeper:
    """``Context.keep`` for one case: records made durable before its row, keyed as that row
    will be (``records.SAMPLE_KEY``). The row then carries the time the first were kept, which
    their key holds; a case that fails midway keeps them, with no row."""

    case: BenchCase
    engine: Engine
    stamp: str | None = None

    def __call__(self, kind: str, records: Sequence[Any], fields: Mapping[str, Any]) -> Path:
        self.stamp = self.stamp or utc_now()
        values = self.case._values(self.engine, Outcome(dict(fields), []), self.stamp)
        return self.case.writer.append_records({c: values.get(c) for c in SAMPLE_KEY}, kind, records)
