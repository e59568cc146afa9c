"""A batch sent at once, timed over warm-up and measured rounds: the no-LoRA and multi-LoRA cases.
With a precision target, measured rounds go on until it is met (``lorabench.measure.sequential``).

Order matters for honest numbers: the batch is built and its adapters are loaded before
the first round, so neither is inside any timed region. Around each round, outside its
timing, vLLM's worker says how many adapters it loaded from disk in it anyway
(``timed_adapter_loads``, ``Engine.disk_loads``; 0 when they fit the CPU cache).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lorabench.load.workload import Batch, Prompt, build_batch
from lorabench.measure.latency import measure_round, summarize
from lorabench.measure.sequential import Design, Verdict, round_values
from lorabench.measure.wallclock import MEASURED, WARMUPS
from lorabench.results.columns import PER_REQUEST_METRICS, PERCENTILES
from lorabench.results.records import Sample
from lorabench.scenarios.base import Context, Outcome, Parametrization

if TYPE_CHECKING:
    from lorabench.config import ConfigFile
    from lorabench.targets.engine import Engine

METRIC_COLUMNS = frozenset(
    col for name in (*PER_REQUEST_METRICS, "e2e_ms") for col in (name, *(f"{name}_p{p}" for p in PERCENTILES))
) | {"output_tokens_per_s"}
COLUMNS = METRIC_COLUMNS | {"batch_size", "input_len", "output_len", "measured_s"}
LORA_COLUMNS = frozenset({"baseline_e2e_ms", "lora_overhead"})
# Counted in vLLM's worker, by lorabench's extension: blank where the config brings its own.
COUNTED_COLUMNS = frozenset({"timed_adapter_loads"})
MIXED_COLUMNS = frozenset({"base_share", "base_ttft_ms", "lora_ttft_ms", "base_decode_ms", "lora_decode_ms"})
SKEWED_COLUMNS = frozenset({"skew_alpha"})
PREFIX_COLUMNS = frozenset({"shared_prefix_len", "shared_prefix_share"})
# Sequential stopping (matrix.precision_pct, --bench-precision): blank without a target.
PRECISION_COLUMNS = frozenset(
    {"precision_target_pct", "precision_pct", "precision_reached", "builds_precision_pct", "builds_precision_reached"}
)
# Each headline metric's interval where it could be judged (2 rounds at least, all positive).
INTERVAL_COLUMNS = frozenset({"e2e_ms_ci_pct", "ttft_ms_ci_pct", "decode_ms_ci_pct"})


def batch_sizes(file: ConfigFile) -> Parametrization:
    sizes = file.matrix.batch_sizes
    return Parametrization("batch_size", sizes, [f"bs{b}" for b in sizes])


def _batch(ctx: Context, engine: Engine, batch_size: int, workload: str | None) -> Batch:
    m = ctx.config.matrix
    return build_batch(
        workload,
        batch_size,
        adapters=ctx.config.adapters,
        prompts=ctx.config.prompts,
        input_len=m.input_len,
        vocab_size=engine.vocab_size,
        seed=m.seed,
        shape=ctx.config.shape,
    )


def round_inputs(batch: Batch, index: int, salt: str | None) -> tuple[list[Prompt], str | None]:
    """Round ``index``'s prompts and salt. With caching on (a case's ``Engine.cold_salt``, so
    that it finds no earlier case's prompts cached), synthetic prompts
    bring new own tokens each round, the shared prefix kept; text prompts, which repeat, get
    a salt of the round's own, so a round never reuses the previous round's whole prompts."""
    if salt is None:
        return batch.round_prompts(0), None
    return batch.round_prompts(index), salt if batch.synthetic is not None else f"{salt}-r{index}"


def _prompts_key(batch: Batch) -> tuple:
    return tuple(tuple(r.prompt) if isinstance(r.prompt, list) else r.prompt for r in batch.requests)


def baseline_e2e_ms(ctx: Context, engine: Engine, batch: Batch, warmup_rounds: int, rounds: int) -> float:
    """The mean e2e of exactly this batch's prompts sent with no adapter, on this build, over
    as many warm-up and measured rounds as the case ran (with ``--benchmark-disable``, one
    unwarmed: a warmed baseline would put the cold round's cost in ``lora_overhead``);
    measured once per build, batch of prompts and rounds."""
    m = ctx.config.matrix
    key = (_prompts_key(batch), m.output_len, warmup_rounds, rounds)
    if key not in engine.state.baselines:
        adapters, salt = [None] * len(batch.requests), engine.cold_salt()
        times = []
        for index in range(warmup_rounds + rounds):
            prompts, salted = round_inputs(batch, index, salt)
            start = engine.loop.time()
            engine.generate(prompts, adapters, m.output_len, cache_salt=salted)
            times.append((engine.loop.time() - start) * 1000.0)
        ctx.clock.add(WARMUPS, sum(times[:warmup_rounds]) / 1000.0)
        ctx.clock.add(MEASURED, sum(times[warmup_rounds:]) / 1000.0)
        engine.state.baselines[key] = statistics.fmean(times[warmup_rounds:])
    return engine.state.baselines[key]


def split_by_adapter(samples: list[Sample]) -> dict[str, float]:
    """Mean TTFT and decode of base-model and of LoRA requests, apart (mixed batches);
    a group with no request gets no figure."""
    base = [s for s in samples if not s.adapter]
    lora = [s for s in samples if s.adapter]
    out = {"base_share": len(base) / len(samples)}
    for prefix, group in (("base", base), ("lora", lora)):
        for metric in ("ttft_ms", "decode_ms"):
            if group:
                out[f"{prefix}_{metric}"] = statistics.fmean(getattr(s, metric) for s in group)
    return out


# One round as run: (seconds, outputs, adapters vLLM loaded from disk in it; None uncounted).
Raw = tuple[float, list[Any], int | None]


def _until_precise(
    ctx: Context, one_round: Callable[[], None], values: Callable[[], list[dict[str, float]]], design: Design
) -> Verdict:
    """More measured rounds, one at a time, until a look of the design finds every headline
    metric within its target, or its last look is reached (``lorabench.measure.sequential``).
    Each is timed as ``Context.time`` times the first: measured time on the session's clock,
    and one more round in pytest-benchmark's statistics (its pedantic mode runs a fixed count)."""
    while not design.stops(verdict := design.judge(values())):
        start = time.perf_counter()
        try:
            one_round()
        finally:
            took = time.perf_counter() - start
            ctx.clock.add(MEASURED, took)
        stats = getattr(ctx.benchmark, "stats", None)
        if stats is not None:
            stats.update(took)
    assert verdict is not None  # the design stops at a look only
    return verdict


def _rounds(ctx: Context, engine: Engine, batch: Batch) -> tuple[list[Raw], Verdict | None]:
    """The batch's rounds as run, warm-ups first: ``matrix.rounds`` measured ones, and with a
    precision target (``matrix.precision_pct``) more until it is met, with the verdict. With
    ``--benchmark-disable`` pedantic runs one unwarmed round, and nothing more is run."""
    m = ctx.config.matrix
    adapters, salt = [r.adapter for r in batch.requests], engine.cold_salt()
    raw: list[Raw] = []

    def one_round() -> None:
        prompts, salted = round_inputs(batch, len(raw), salt)
        before = engine.disk_loads()
        start = engine.loop.time()
        outputs = engine.generate(prompts, adapters, m.output_len, cache_salt=salted)
        elapsed = engine.loop.time() - start
        raw.append((elapsed, outputs, None if before is None else engine.disk_loads() - before))

    engine.load_adapters(batch.adapters)
    ctx.time(one_round, rounds=m.rounds, warmup_rounds=m.warmup_rounds)
    if m.precision_pct is None or getattr(ctx.benchmark, "disabled", False):
        return raw, None
    warm = len(raw) - m.rounds

    def values() -> list[dict[str, float]]:
        return [round_values(measure_round(i, e, out, batch, m.output_len)) for i, (e, out, _) in enumerate(raw[warm:])]

    return raw, _until_precise(ctx, one_round, values, Design.of(m.precision_pct, m.rounds, m.rounds_at_most))


def run_batch(ctx: Context, engine: Engine, batch_size: int, workload: str | None) -> Outcome:
    """``workload=None``: the same batch with no adapter."""
    m = ctx.config.matrix
    batch = _batch(ctx, engine, batch_size, workload)
    raw, verdict = _rounds(ctx, engine, batch)
    # pedantic runs the warm-up rounds first; with --benchmark-disable it runs once, unwarmed.
    kept = raw[-(verdict.rounds if verdict is not None else m.rounds) :]
    measured = [measure_round(i, elapsed, outputs, batch, m.output_len) for i, (elapsed, outputs, _) in enumerate(kept)]
    metrics = summarize(measured)
    prompt_tokens = [r.prompt_tokens for rnd in measured for r in rnd.requests]
    fields = {
        "workload": workload or "none",
        "batch_size": batch_size,
        "input_len": m.input_len if m.input_len is not None else round(statistics.fmean(prompt_tokens)),
        "output_len": m.output_len,
        "num_adapters": len(batch.pool),
        "rounds": len(measured),
        "measured_s": sum(elapsed for elapsed, _, _ in kept),
        "warmup_rounds": m.warmup_rounds if len(raw) > len(measured) else 0,
        **metrics,
    }
    samples = [s for rnd in measured for s in rnd.requests]
    extra_info: dict[str, Any] = dict(metrics)
    if verdict is not None:
        fields.update(verdict.fields())
    judged = verdict or Design.fixed(len(measured)).judge([round_values(r) for r in measured])
    if judged is not None:  # the fixed design judges any count; a sequential verdict its own
        fields.update(judged.interval_fields())
        extra_info["intervals"] = {k: vars(i) for k, i in judged.intervals.items()}
    if workload is not None:
        baseline = baseline_e2e_ms(ctx, engine, batch, len(raw) - len(kept), len(kept))
        counts = [n for _, _, n in kept]
        loads = None if None in counts else sum(counts)
        fields.update(baseline_e2e_ms=baseline, lora_overhead=metrics["e2e_ms"] / baseline, timed_adapter_loads=loads)
    if workload == "mixed":
        fields.update(split_by_adapter(samples))
    if workload == "skewed":
        fields["skew_alpha"] = ctx.config.shape.skew_alpha
    if m.shared_prefix_len:
        fields.update(shared_prefix_len=m.shared_prefix_len, shared_prefix_share=m.shared_prefix_share)
    return Outcome(fields, samples, extra_info=extra_info)
