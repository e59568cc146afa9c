"""``online``: traces replayed in real time against the engine, one case per trace of the
config's online suites: synthetic (Gamma arrivals, power-law adapter popularity) or
imported (``lorabench trace import``). Each replay also gives the engine's timeline
(``lorabench.targets.timeline``) and each adapter's usage, written beside the samples."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lorabench.config.online_cases import MAYBE_TRACE_COLUMNS, ONLINE_TRACE_COLUMNS, online_cases
from lorabench.measure import replay, replay_summary
from lorabench.results.columns import PERCENTILES
from lorabench.results.progress import trace_reporter
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario
from lorabench.targets import timeline

if TYPE_CHECKING:
    from lorabench.config import ConfigFile, OnlineCase
    from lorabench.config.online_cases import ImportedCase
    from lorabench.targets.engine import Engine

ONLINE_COLUMNS = frozenset(
    {
        "num_requests",
        "unfinished",
        "request_throughput",
        "slo_ttft_ms",
        "slo_tpot_ms",
        "slo_attainment",
        "goodput_rps",
        "fairness",
        "itl_ms_p50",
        "itl_ms_p99",
        "send_lag_ms_p50",
        "send_lag_ms_p99",
        "send_lag_ms_max",
        "client_fell_behind",
        "ttft_from_send_ms_p50",
        "ttft_from_send_ms_p99",
    }
)
# Filled from the engine timeline recorded while the trace replays (lorabench.targets.timeline.summarize).
TIMELINE_COLUMNS = frozenset({"kv_usage_max", "waiting_p99", "preemptions", "adapters_waiting_max"})
# Predicted where the trace has hash ids (prefix_hit_rate, measured, is the engine's to fill or not).
PREFIX_COLUMNS = frozenset({"prefix_hit_rate_predicted"})
METRIC_COLUMNS = frozenset(
    col
    for name in ("ttft_ms", "decode_ms", "request_e2e_ms", "queue_ms")
    for col in (name, *(f"{name}_p{p}" for p in PERCENTILES))
) | {"output_tokens_per_s"}


class Online(Scenario):
    name = "online"
    columns = ONLINE_TRACE_COLUMNS | ONLINE_COLUMNS | METRIC_COLUMNS
    # timed_adapter_loads: counted in vLLM's worker, blank where nothing counts (HTTP, a
    # config's own worker extension). The timeline's: blank when there is none (the reason is said).
    # The trace's: synthetic and imported traces are described by different columns.
    maybe_columns = frozenset({"timed_adapter_loads", *TIMELINE_COLUMNS}) | MAYBE_TRACE_COLUMNS | PREFIX_COLUMNS

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        cases = online_cases(file)
        if not cases:
            return [
                Parametrization("online_case", [None], ["no-suites"], skip_reason="the config has no 'online' suites")
            ]
        return [Parametrization("online_case", cases, [c.id for c in cases])]

    def replay_s(self, file: ConfigFile, *, online_case: OnlineCase | ImportedCase | None = None, **_: object) -> float:  # type: ignore[override]
        return online_case.duration if online_case is not None else 0.0

    def run(self, ctx: Context, engine: Engine, *, online_case: OnlineCase | ImportedCase) -> Outcome:  # type: ignore[override]
        online = ctx.config.file.online
        online_case = online_case.located(ctx.config.path.parent)
        adapters = {a.name: a for a in ctx.config.adapters[: online_case.num_adapters]}
        requests = online_case.requests(list(adapters))
        records: list[replay.ReplayedRequest] = []
        loads: list[int | None] = []

        def one_replay() -> None:
            before = engine.disk_loads()  # outside the replay's own timing, as a batch round's
            duration = online_case.duration
            report = trace_reporter(ctx.progress, online_case.id, duration, len(requests)) if ctx.progress else None
            coroutine = replay.replay(
                engine,
                requests,
                adapters,
                seed=online_case.seed,
                drain_timeout_s=replay.drain_s(
                    requests, online.drain_timeout_s, online.slo_ttft_ms, online.slo_tpot_ms
                ),
                progress=report,
                timeline=engine.timeline,
            )
            records[:] = engine.run(coroutine)
            loads.append(None if before is None else engine.disk_loads() - before)

        engine.load_adapters(list(adapters.values()))
        ctx.time(one_replay)
        extra = {} if loads[-1] is None else {"timed_adapter_loads": loads[-1]}
        return replay_outcome(ctx, engine, online_case, records, online, extra)


def replay_outcome(
    ctx: Context,
    engine: Engine,
    case: OnlineCase | ImportedCase,
    records: list[replay.ReplayedRequest],
    slo: Any,
    extra_fields: dict[str, Any],
    extra_info: dict[str, Any] | None = None,
) -> Outcome:
    """A replayed trace's row, samples, timeline and per-adapter usage, judged against the
    SLOs and warm-up of ``slo`` (the config block that set them): what every scenario that
    replays a trace records."""
    judged = {"slo_ttft_ms": slo.slo_ttft_ms, "slo_tpot_ms": slo.slo_tpot_ms, "warmup_s": slo.warmup_s}
    metrics, per_adapter = replay_summary.summarize_online(records, **judged)
    steps, notes = _timeline_columns(ctx, engine, case.id, slo.warmup_s)
    counted = timeline.prefix_hit_rate(engine.timeline.rows, slo.warmup_s, engine.timeline.counts_until_t)
    finished = metrics["num_requests"] > metrics["unfinished"]
    if "prefix_hit_rate" not in metrics and counted is not None and finished:
        # A server that reports no request's cached tokens: its own counters, after the warm-up.
        metrics["prefix_hit_rate"] = counted
        notes["prefix_hit_rate"] = (
            "from the engine's prefix-cache counters over the scrapes after the warm-up: every request it "
            "admitted then, finished or not (no request said its cached tokens)"
        )
    if engine.failed_requests is not None:  # an HTTP target: the failed among the unfinished
        metrics["failed"] = sum(r.failed for r in records if r.scheduled_s >= slo.warmup_s)
        notes.update(_failures_said(ctx, engine, case.id, records, metrics))
    lags = [r.send_lag_ms for r in records if r.scheduled_s >= slo.warmup_s]
    behind = replay_summary.client_behind(lags, slo.slo_ttft_ms)
    if behind:
        notes["client_fell_behind"] = behind
        if ctx.progress:
            ctx.progress(f"trace {case.id}: {behind}: the engine saw less load than the trace's")
    fields = {
        "workload": "trace",
        "num_adapters": case.num_adapters,
        "rounds": 1,
        "warmup_rounds": 0,
        **case.fields(slo.warmup_s),
        **metrics,
        **steps,
        **extra_fields,
    }
    return Outcome(
        fields,
        replay_summary.samples(records, {a.name: a.rank for a in ctx.config.adapters}),
        extra_info={**metrics, **steps, **notes, "per_adapter": per_adapter, **(extra_info or {})},
        records={"timeline": list(engine.timeline.rows), "adapters": replay_summary.adapter_usage(records, **judged)},
    )


def _failures_said(
    ctx: Context, engine: Engine, case_id: str, records: list[replay.ReplayedRequest], metrics: dict[str, Any]
) -> dict[str, str]:
    """Where measured requests failed, how many and the server's first error of the replay,
    on the terminal and in the case's extra_info: a count in the row alone said nothing of why."""
    if not metrics["failed"]:
        return {}
    # The replay's failures are the engine's last ones, one per failed request (the warm-up's too).
    ours = engine.failures[-sum(r.failed for r in records) :]
    said = f"{metrics['failed']} of {metrics['num_requests']} requests failed, the first: {ours[0]}"
    if ctx.progress:
        ctx.progress(f"trace {case_id}: {said}")
    return {"failed": said}


def _timeline_columns(ctx: Context, engine: Engine, case_id: str, warmup_s: float) -> tuple[dict, dict]:
    """The row's timeline columns; or none, and why in the case's extra_info and on the terminal."""
    steps = timeline.summarize(engine.timeline.rows, warmup_s, engine.timeline.counts_until_t)
    if steps:
        return steps, {}
    why = engine.timeline.why_none or timeline.NO_STEPS
    if ctx.progress:
        ctx.progress(f"trace {case_id}: no engine timeline: {why}")
    return {}, {"timeline": why}


SCENARIO = Online()
