"""``churn``: an online trace replayed while adapters outside its working set are loaded and
unloaded at a set rate, as a server whose adapters come and go while it serves (vLLM's and
sglang's users ask what such a swap costs the traffic already flowing).

The operations alternate: load the next churn adapter, unload it, load the one after, so at
most one churn adapter is loaded at a time and each load reads it from disk. In process they
are vLLM's ``add_lora`` / ``remove_lora``; over HTTP ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` (the engines' ``load_lora`` / ``unload_lora``). Each is timed as
its caller sees it, on the replay's clock, so a request can be told apart by whether it was
sent while a load was in flight. Over HTTP each load registers a fresh alias of the adapter
(a new id: a real read from disk, ``lorabench.targets.http.lora_api``) and its unload drops the alias,
so the server's own names are never touched. The churn adapters are unloaded before the
replay and after it, untimed.

A load that failed loaded nothing: it is a failed operation, no load in flight, and the unload
that would follow it is not sent (there is nothing to unload; its time would read as an
unload's). Operations that start in the warm-up count nowhere, as the warm-up's requests do.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from lorabench.config.online_cases import (
    MAYBE_TRACE_COLUMNS,
    ONLINE_TRACE_COLUMNS,
    ImportedCase,
    OnlineCase,
    trace_cases,
)
from lorabench.measure import replay
from lorabench.results.stats import percentile
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario
from lorabench.scenarios.online import (
    METRIC_COLUMNS,
    ONLINE_COLUMNS,
    PREFIX_COLUMNS,
    TIMELINE_COLUMNS,
    replay_outcome,
)
from lorabench.targets.clock import now

if TYPE_CHECKING:
    from lorabench.config import ConfigFile
    from lorabench.load.adapters import Adapter
    from lorabench.targets.engine import Engine
    from lorabench.targets.timeline import Recorder

CHURN_COLUMNS = frozenset(
    {"churn_rate", "churn_adapters", "churn_ops", "churn_failed_ops"}
    | {"load_ms_p50", "load_ms_p99", "unload_ms_p50", "unload_ms_p99"}
    | {"ttft_during_load_ms_p50", "ttft_outside_load_ms_p50", "ttft_load_ratio"}
)
LOAD, UNLOAD = "load", "unload"


@dataclass(frozen=True)
class ChurnCase:
    """One trace replayed with churn at one rate."""

    trace: OnlineCase | ImportedCase
    rate: float
    adapters: int

    @property
    def id(self) -> str:
        return f"{self.trace.id}-churn{self.rate:g}"


def churn_cases(file: ConfigFile) -> list[ChurnCase]:
    block = file.churn
    if block is None:
        return []
    traces = [case for suite in block.suites for case in trace_cases(suite, suite.rate, suite.duration)]
    return [ChurnCase(t, rate, block.adapters) for t in traces for rate in block.rate]


@dataclass
class Op:
    """One load or unload: when it started and ended on the replay's clock, and why it failed."""

    kind: str
    adapter: str
    start_s: float
    end_s: float = math.nan
    error: str | None = None

    @property
    def ms(self) -> float:
        return (self.end_s - self.start_s) * 1000.0


class _Clock:
    """The timeline ``replay`` is handed: it passes start and stop on to the engine's recorder
    and keeps the replay's own start, so the operations are timed on the same clock as sends."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder, self.t0 = recorder, None

    def start(self, t0: float) -> None:
        self.t0 = t0
        self.recorder.start(t0)

    async def flush(self) -> None:
        await self.recorder.flush()

    def stop(self) -> Any:
        return self.recorder.stop()


async def _operate(engine: Engine, kind: str, adapter: Adapter, t0: float) -> Op:
    op = Op(kind, adapter.name, now() - t0)
    try:
        await (engine.load_lora(adapter) if kind == LOAD else engine.unload_lora(adapter))
    except Exception as exc:  # noqa: BLE001 - a failed operation is counted; the replay goes on
        op.error = f"{type(exc).__name__}: {exc}"
    op.end_s = now() - t0
    return op


async def churn(engine: Engine, adapters: Sequence[Adapter], rate: float, clock: _Clock, until_s: float) -> list[Op]:
    """Operations at ``rate`` a second from the replay's start until ``until_s``, one at a time:
    one that outlasts its interval delays the next rather than overlapping it."""
    while clock.t0 is None:
        await asyncio.sleep(0.001)
    ops: list[Op] = []
    for k in range(math.ceil(until_s * rate)):
        wait = clock.t0 + k / rate - now()
        if wait > 0:
            await asyncio.sleep(wait)
        kind = LOAD if k % 2 == 0 else UNLOAD
        if kind == UNLOAD and ops[-1].error is not None:
            continue  # its load failed: nothing to unload
        ops.append(await _operate(engine, kind, adapters[(k // 2) % len(adapters)], clock.t0))
    return ops


def churn_fields(ops: Sequence[Op], records: Sequence[replay.ReplayedRequest], warmup_s: float) -> dict[str, Any]:
    """The row's churn columns, over the operations that started and the finished requests that
    arrived after ``warmup_s``. A request was sent during a load when a load that succeeded was
    in flight then (a warm-up one too: its cost reaches past the warm-up)."""
    loads = [(o.start_s, o.end_s) for o in ops if o.kind == LOAD and o.error is None]
    measured = [o for o in ops if o.start_s >= warmup_s]
    ok = [o for o in measured if o.error is None]
    done = [r for r in records if r.finished and r.scheduled_s >= warmup_s]
    during = [r.ttft_ms for r in done if any(a <= r.sent_s < b for a, b in loads)]
    outside = [r.ttft_ms for r in done if not any(a <= r.sent_s < b for a, b in loads)]
    fields = {"churn_ops": len(measured), "churn_failed_ops": len(measured) - len(ok)}
    for kind in (LOAD, UNLOAD):
        times = [o.ms for o in ok if o.kind == kind]
        fields.update({f"{kind}_ms_p{p}": percentile(times, p) for p in (50, 99)})
    fields["ttft_during_load_ms_p50"] = percentile(during, 50)
    fields["ttft_outside_load_ms_p50"] = percentile(outside, 50)
    outside_p50 = fields["ttft_outside_load_ms_p50"]
    fields["ttft_load_ratio"] = fields["ttft_during_load_ms_p50"] / outside_p50 if outside_p50 else math.nan
    return fields


class Churn(Scenario):
    name = "churn"
    columns = ONLINE_TRACE_COLUMNS | ONLINE_COLUMNS | METRIC_COLUMNS | CHURN_COLUMNS
    maybe_columns = TIMELINE_COLUMNS | MAYBE_TRACE_COLUMNS | PREFIX_COLUMNS

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        cases = churn_cases(file)
        if not cases:
            return [Parametrization("churn_case", [None], ["no-churn"], skip_reason="the config has no 'churn' block")]
        return [Parametrization("churn_case", cases, [c.id for c in cases])]

    def replay_s(self, file: ConfigFile, *, churn_case: ChurnCase | None = None, **_: object) -> float:  # type: ignore[override]
        return churn_case.trace.duration if churn_case is not None else 0.0

    def run(self, ctx: Context, engine: Engine, *, churn_case: ChurnCase) -> Outcome:  # type: ignore[override]
        block = ctx.config.file.churn
        trace = churn_case.trace.located(ctx.config.path.parent)
        n = trace.num_adapters
        working = {a.name: a for a in ctx.config.adapters[:n]}
        churned = list(ctx.config.adapters[n : n + churn_case.adapters])
        if len(churned) < churn_case.adapters:
            raise ValueError(f"churn needs {n + churn_case.adapters} adapters, the config has {n + len(churned)}")
        missing = engine.runtime_api_missing()
        if missing:
            pytest.skip(f"churn loads adapters while serving with /v1/load_lora_adapter, and {missing}")
        requests = trace.requests(list(working))
        engine.load_adapters(list(working.values()))
        _untimed_unloads(engine, churned)
        result: dict[str, Any] = {}

        async def both() -> None:
            clock = _Clock(engine.timeline)
            drain = replay.drain_s(requests, block.drain_timeout_s, block.slo_ttft_ms, block.slo_tpot_ms)
            kwargs = {"seed": trace.seed, "drain_timeout_s": drain, "timeline": clock}
            result["records"], result["ops"] = await asyncio.gather(
                replay.replay(engine, requests, working, **kwargs),
                churn(engine, churned, churn_case.rate, clock, trace.duration),
            )

        ctx.time(lambda: engine.run(both()))
        _untimed_unloads(engine, churned)
        return self._outcome(ctx, engine, churn_case, trace, result)

    def _outcome(self, ctx: Context, engine: Engine, case: ChurnCase, trace: Any, result: dict) -> Outcome:
        block = ctx.config.file.churn
        records, ops = result["records"], result["ops"]
        fields = {
            "churn_rate": case.rate,
            "churn_adapters": case.adapters,
            **churn_fields(ops, records, block.warmup_s),
        }
        errors = sorted({o.error for o in ops if o.error})[:3]
        return replay_outcome(ctx, engine, trace, records, block, fields, {"churn_errors": errors})


def _untimed_unloads(engine: Engine, adapters: Sequence[Adapter]) -> None:
    """Each churn adapter unloaded, failures ignored: before the replay, so that every load reads
    the disk; after it, so that none the churn loaded stays. In process that is ``remove_lora``;
    over HTTP only the aliases the churn registered are dropped (the server's names stay)."""

    async def each() -> None:
        for adapter in adapters:
            await _operate(engine, UNLOAD, adapter, now())

    engine.run(each())


SCENARIO = Churn()
