"""The result schema, declared once: every column of the result file.

A result row is a ``ResultRow``. The CSV columns, the case key that ``lorabench compare``
matches runs on and the engine-configuration key are derived from this declaration (the
configuration's name and id from its key columns, ``lorabench.results.naming``), and so are
the keys of the records kept beside the rows (``lorabench.results.records``). Fields only some
scenarios fill default to ``None`` (a blank cell); each scenario declares which it fills
(``Scenario.columns``), and ``check_row`` (``lorabench.results.schema_check``) refuses a row
that leaves one blank or fills one it did not declare. An unknown field name is a
``TypeError`` when the record is built: a misspelt column never becomes a silent blank.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any

from lorabench.results.columns import (
    CAPACITY,
    ENGINE,
    HIGHER,
    LOWER,
    METRIC,
    ONLINE,
    PARAMETER,
    PROVENANCE,
    TRACE,
    column,
)


@dataclass(frozen=True, kw_only=True)
class ResultRow:
    """One case: one build of an engine configuration, one scenario, one set of parameters."""

    timestamp: str = column(PROVENANCE)
    run_id: str = column(PROVENANCE)
    git_commit: str = column(PROVENANCE)
    git_dirty: bool = column(PROVENANCE)
    hostname: str = column(PROVENANCE)
    device_type: str = column(PROVENANCE, key=True)
    device_name: str = column(PROVENANCE)
    vllm_version: str = column(PROVENANCE)
    vllm_ascend_version: str = column(PROVENANCE)
    torch_version: str = column(PROVENANCE)
    torch_npu_version: str = column(PROVENANCE)
    toolkit_version: str = column(PROVENANCE)
    driver_version: str = column(PROVENANCE)
    firmware_version: str = column(PROVENANCE)
    # What a history bisects over besides versions: builds' commits ("unknown": not said), the host (docs/history.md).
    vllm_commit: str | None = column(PROVENANCE, optional=True, by_engine=True, older="")
    vllm_ascend_commit: str | None = column(PROVENANCE, optional=True, by_engine=True, older="")
    cpu_model: str | None = column(PROVENANCE, optional=True, by_engine=True, older="")
    device_count: int | None = column(PROVENANCE, optional=True, by_engine=True, older="")
    model: str = column(PROVENANCE, key=True)
    # An HTTP target's server (lorabench.targets.http): the URL requests went to; blank in process.
    endpoint: str | None = column(PROVENANCE, optional=True, by_engine=True)
    # A fleet's rows (--bench-fleet, docs/fleet.md): the devices the case ran on, and the
    # configurations that ran beside it on its node meanwhile ("" none); blank in a sequential run.
    fleet_devices: str | None = column(PROVENANCE, optional=True, by_engine=True)
    fleet_neighbours: str | None = column(PROVENANCE, optional=True, by_engine=True)

    scenario: str = column(PARAMETER, key=True)
    # Where requests went (lorabench.config.target): inprocess, serve or url, each a case of its own.
    target: str | None = column(PARAMETER, key=True, optional=True, by_engine=True, older="inprocess")
    workload: str = column(PARAMETER, key=True)
    batch_size: int | None = column(PARAMETER, key=True, optional=True)
    input_len: int | None = column(PARAMETER, key=True, optional=True)
    output_len: int | None = column(PARAMETER, key=True, optional=True)
    num_adapters: int = column(PARAMETER)
    enable_lora: bool = column(PARAMETER, key=True, engine=True)
    max_loras: int | None = column(PARAMETER, key=True, engine=True, optional=True)
    max_lora_rank: int | None = column(PARAMETER, key=True, engine=True, optional=True)
    max_cpu_loras: int | None = column(PARAMETER, key=True, engine=True, optional=True)
    # Graph mode as configured (lorabench.results.graph); blank: vLLM's default.
    enforce_eager: bool | None = column(PARAMETER, key=True, engine=True, optional=True)
    graph_config: str | None = column(PARAMETER, key=True, engine=True, optional=True)
    # vLLM's prefix caching (config engine.enable_prefix_caching); files before it ran without.
    enable_prefix_caching: bool | None = column(PARAMETER, key=True, engine=True, optional=True, older="False")
    # A variant build's name (lorabench.config.variants: "ngram", "chunked"); blank: the configuration's own.
    engine_variant: str | None = column(PARAMETER, key=True, engine=True, optional=True)
    # With caching on: each measurement salted apart, a batch's rounds new (docs/metrics.md#prefix-caching);
    # blank with caching off, and in files whose cached rows reused earlier rounds' prompts.
    prefix_cache_salted: bool | None = column(PARAMETER, key=True, optional=True, by_engine=True)
    rounds: int = column(PARAMETER)
    # Sequential stopping (--bench-precision): target and achieved half-width (docs/metrics.md#sequential-stopping).
    precision_target_pct: float | None = column(PARAMETER, optional=True)
    precision_pct: float | None = column(METRIC, optional=True)
    precision_reached: bool | None = column(METRIC, optional=True)
    # Across builds, with matrix.max_builds: the same, over this build and the ones before (docs/metrics.md).
    builds_precision_pct: float | None = column(METRIC, optional=True)
    builds_precision_reached: bool | None = column(METRIC, optional=True)
    # A batch case's 95 % intervals, relative half-widths, % (docs/metrics.md#intervals); its measured rounds' seconds.
    e2e_ms_ci_pct: float | None = column(METRIC, optional=True)
    ttft_ms_ci_pct: float | None = column(METRIC, optional=True)
    decode_ms_ci_pct: float | None = column(METRIC, optional=True)
    measured_s: float | None = column(METRIC, optional=True)
    tier: str | None = column(PARAMETER, key=True, optional=True)
    working_set: int | None = column(PARAMETER, key=True, optional=True)
    base_share: float | None = column(PARAMETER, key=True, optional=True)
    skew_alpha: float | None = column(PARAMETER, key=True, optional=True)
    # A batch's shared prefix (matrix.shared_prefix_len and _share); blank where there is none.
    shared_prefix_len: int | None = column(PARAMETER, key=True, optional=True)
    shared_prefix_share: float | None = column(PARAMETER, key=True, optional=True)
    # Adapter churn: load-or-unload operations a second, and adapters outside the trace's working set they cycle.
    churn_rate: float | None = column(PARAMETER, key=True, optional=True)
    churn_adapters: int | None = column(PARAMETER, key=True, optional=True)

    trace_suite: str | None = column(TRACE, key=True, optional=True)
    trace_num_adapters: int | None = column(TRACE, key=True, optional=True)
    trace_rate: float | None = column(TRACE, key=True, optional=True)
    trace_alpha: float | None = column(TRACE, key=True, optional=True)
    trace_cv: float | None = column(TRACE, key=True, optional=True)
    trace_duration_s: float | None = column(TRACE, key=True, optional=True)
    trace_lengths: str | None = column(TRACE, key=True, optional=True)
    trace_input_range: str | None = column(TRACE, key=True, optional=True)
    trace_output_range: str | None = column(TRACE, key=True, optional=True)
    trace_seed: int | None = column(TRACE, key=True, optional=True)
    # Requests arriving before this many seconds are left out of every online statistic.
    trace_warmup_s: float | None = column(TRACE, key=True, optional=True)
    # An imported trace (lorabench trace import): its name and sha256 (compare pairs replays of one trace).
    trace_file: str | None = column(TRACE, optional=True)
    trace_sha256: str | None = column(TRACE, key=True, optional=True)
    # Seconds into the imported trace where the replayed window begins.
    trace_start_s: float | None = column(TRACE, key=True, optional=True)

    # Mean and percentiles over requests (over rounds for e2e_ms, which is per batch).
    ttft_ms: float | None = column(METRIC, optional=True, better=LOWER)
    ttft_ms_p50: float | None = column(METRIC, optional=True)
    ttft_ms_p90: float | None = column(METRIC, optional=True)
    ttft_ms_p99: float | None = column(METRIC, optional=True)
    prefill_ms: float | None = column(METRIC, optional=True, engine_only=True, better=LOWER)
    prefill_ms_p50: float | None = column(METRIC, optional=True, engine_only=True)
    prefill_ms_p90: float | None = column(METRIC, optional=True, engine_only=True)
    prefill_ms_p99: float | None = column(METRIC, optional=True, engine_only=True)
    decode_ms: float | None = column(METRIC, optional=True, better=LOWER)
    decode_ms_p50: float | None = column(METRIC, optional=True)
    decode_ms_p90: float | None = column(METRIC, optional=True)
    decode_ms_p99: float | None = column(METRIC, optional=True)
    request_e2e_ms: float | None = column(METRIC, optional=True)
    request_e2e_ms_p50: float | None = column(METRIC, optional=True)
    request_e2e_ms_p90: float | None = column(METRIC, optional=True)
    request_e2e_ms_p99: float | None = column(METRIC, optional=True)
    queue_ms: float | None = column(METRIC, optional=True, engine_only=True)
    # The measured requests' prompt tokens found in the prefix cache, over their prompt tokens
    # (docs/metrics.md#prefix-caching); over HTTP where the server's usage says.
    prefix_hit_rate: float | None = column(METRIC, optional=True, by_engine=True)
    # What a replayed trace's hash ids predict of it for an infinite cache (online rows).
    prefix_hit_rate_predicted: float | None = column(METRIC, optional=True)
    queue_ms_p50: float | None = column(METRIC, optional=True, engine_only=True)
    queue_ms_p90: float | None = column(METRIC, optional=True, engine_only=True)
    queue_ms_p99: float | None = column(METRIC, optional=True, engine_only=True)
    e2e_ms: float | None = column(METRIC, optional=True, better=LOWER)
    e2e_ms_p50: float | None = column(METRIC, optional=True)
    e2e_ms_p90: float | None = column(METRIC, optional=True)
    e2e_ms_p99: float | None = column(METRIC, optional=True)
    output_tokens_per_s: float | None = column(METRIC, optional=True, better=HIGHER)
    # Multi-LoRA batches: e2e against the same batch with no adapter on the same build.
    baseline_e2e_ms: float | None = column(METRIC, optional=True)
    lora_overhead: float | None = column(METRIC, optional=True, better=LOWER)
    # Mixed batches: base-model and LoRA requests apart.
    base_ttft_ms: float | None = column(METRIC, optional=True)
    lora_ttft_ms: float | None = column(METRIC, optional=True)
    base_decode_ms: float | None = column(METRIC, optional=True)
    lora_decode_ms: float | None = column(METRIC, optional=True)
    # Residency and working sets.
    disk_load_ms: float | None = column(METRIC, optional=True)
    # Residency: a tier's TTFT less the same request's sent right after (in a slot), median over pairs.
    tier_extra_ttft_ms: float | None = column(METRIC, optional=True)
    # Working sets: timed_adapter_loads per timed request.
    load_share: float | None = column(METRIC, optional=True, engine_only=True)
    # Adapters loaded from disk in the case's timed span, counted in vLLM's worker
    # (lorabench.targets.vllm_worker; batch, working-set and online rows) or known by
    # construction (residency tiers).
    timed_adapter_loads: int | None = column(METRIC, optional=True, engine_only=True)

    num_requests: int | None = column(ONLINE, optional=True)
    unfinished: int | None = column(ONLINE, optional=True)
    # HTTP targets: the case's requests that failed (an error status, a stream broken off);
    # an online replay counts them among the unfinished too. Blank in process, where a failure raises.
    failed: int | None = column(ONLINE, optional=True, by_engine=True)
    request_throughput: float | None = column(ONLINE, optional=True)
    slo_ttft_ms: float | None = column(ONLINE, key=True, optional=True)
    slo_tpot_ms: float | None = column(ONLINE, key=True, optional=True)
    slo_attainment: float | None = column(ONLINE, optional=True)
    goodput_rps: float | None = column(ONLINE, optional=True)
    fairness: float | None = column(ONLINE, optional=True)
    itl_ms_p50: float | None = column(ONLINE, optional=True)
    itl_ms_p99: float | None = column(ONLINE, optional=True)
    send_lag_ms_p50: float | None = column(ONLINE, optional=True)
    send_lag_ms_p99: float | None = column(ONLINE, optional=True)
    send_lag_ms_max: float | None = column(ONLINE, optional=True)
    # Too many requests sent late (replay_summary.client_behind); TTFT from the send, lag left out.
    client_fell_behind: bool | None = column(ONLINE, optional=True)
    ttft_from_send_ms_p50: float | None = column(ONLINE, optional=True)
    ttft_from_send_ms_p99: float | None = column(ONLINE, optional=True)
    # From the engine timeline recorded while the trace replayed (lorabench.targets.timeline).
    kv_usage_max: float | None = column(ONLINE, optional=True)
    waiting_p99: float | None = column(ONLINE, optional=True)
    preemptions: int | None = column(ONLINE, optional=True)
    adapters_waiting_max: int | None = column(ONLINE, optional=True)
    # Adapter churn: each load's and unload's latency as the caller sees it (add_lora /
    # remove_lora in process, /v1/load_lora_adapter / unload over HTTP), the operations done and
    # failed, and the TTFT of requests sent while a load was in flight against those sent
    # while none was (median each; ratio: during over outside). compare judges the medians and
    # the ratio: the p99 of a case's few operations is its slowest one, and the ratio is free
    # of the machine's speed, which moves both TTFTs alike.
    churn_ops: int | None = column(ONLINE, optional=True)
    churn_failed_ops: int | None = column(ONLINE, optional=True)
    load_ms_p50: float | None = column(ONLINE, optional=True, better=LOWER)
    load_ms_p99: float | None = column(ONLINE, optional=True)
    unload_ms_p50: float | None = column(ONLINE, optional=True, better=LOWER)
    unload_ms_p99: float | None = column(ONLINE, optional=True)
    ttft_during_load_ms_p50: float | None = column(ONLINE, optional=True)
    ttft_outside_load_ms_p50: float | None = column(ONLINE, optional=True)
    ttft_load_ratio: float | None = column(ONLINE, optional=True, better=LOWER)

    # Capacity searches (lorabench.measure.capacity): what a probe must reach to pass...
    slo_target: float | None = column(CAPACITY, key=True, optional=True)
    capacity_precision: float | None = column(CAPACITY, key=True, optional=True)
    capacity_drain_s: float | None = column(CAPACITY, key=True, optional=True)
    # The highest rate probed: the config's max_rate, or what an imported trace's requests allow.
    capacity_max_rate: float | None = column(CAPACITY, key=True, optional=True)
    # ...the closed-loop estimate, the highest passing and lowest failing rates, the edge's 95 %
    # interval over the probes (docs/capacity.md), the passing probe's attainment and its interval.
    estimate_rps: float | None = column(CAPACITY, optional=True)
    capacity_rps: float | None = column(CAPACITY, optional=True, better=HIGHER)
    capacity_over_rps: float | None = column(CAPACITY, optional=True)
    capacity_ci_low_rps: float | None = column(CAPACITY, optional=True)
    capacity_ci_high_rps: float | None = column(CAPACITY, optional=True)
    probes: int | None = column(CAPACITY, optional=True)
    attainment_at_capacity: float | None = column(CAPACITY, optional=True)
    attainment_ci_low: float | None = column(CAPACITY, optional=True)
    attainment_ci_high: float | None = column(CAPACITY, optional=True)
    search_stop: str | None = column(CAPACITY, optional=True)

    warmup_rounds: int = column(ENGINE)
    engine_id: str = column(ENGINE)
    build: int = column(ENGINE)
    # The pair this build belongs to when ``lorabench ab`` ran the session; blank otherwise.
    ab_pair: int | None = column(ENGINE, optional=True, by_engine=True)
    # One adapter's add_lora from disk into the CPU cache, timed alone, mean over every
    # adapter; measured once per build before its first case (blank without LoRA).
    adapter_load_ms: float | None = column(ENGINE, optional=True, by_engine=True)
    engine_build_s: float = column(ENGINE)
    # Blank where the engine does not say (a server without vllm:cache_config_info).
    kv_cache_tokens: int | None = column(ENGINE, optional=True, by_engine=True)
    # Graph mode as the engine's configuration reports it after the build, and the
    # compile and graph-capture times its log gives (blank where it logged none).
    compilation_mode: str = column(ENGINE)
    cudagraph_mode: str = column(ENGINE)
    compile_s: float | None = column(ENGINE, optional=True, by_engine=True)
    graph_capture_s: float | None = column(ENGINE, optional=True, by_engine=True)
    # vLLM's compilation_config.custom_ops after the build, comma-joined ("all", "none", "+rms_norm").
    custom_ops: str | None = column(ENGINE, optional=True, by_engine=True)
    # Adapters whose greedy output on this build differs from the run's first (LoRA engines).
    digest_mismatches: int | None = column(ENGINE, optional=True, by_engine=True)
    # The isolation canaries (docs/metrics.md#engine-and-memory defines each).
    isolation_checked: int | None = column(METRIC, optional=True)
    isolation_broken: int | None = column(METRIC, optional=True)
    isolation_reload_broken: int | None = column(METRIC, optional=True)
    isolation_control_changed: int | None = column(METRIC, optional=True)
    isolation_unjudged: int | None = column(METRIC, optional=True)
    isolation_uncached: int | None = column(METRIC, optional=True)
    isolation_cached_tokens: int | None = column(METRIC, optional=True)
    # The LoRA correctness canaries, one row a check (docs/canaries.md#the-columns defines each).
    canary_verdict: str | None = column(METRIC, optional=True)
    canary_checked: int | None = column(METRIC, optional=True)
    canary_failed: int | None = column(METRIC, optional=True)
    canary_unjudged: int | None = column(METRIC, optional=True)
    peak_memory_mb: float = column(ENGINE)
    memory_source: str = column(ENGINE)
    test_id: str = column(ENGINE)


def field_names(record: type, test: Any = lambda f: True) -> tuple[str, ...]:
    """The names of a dataclass's fields that pass ``test``, in declaration order."""
    return tuple(f.name for f in fields(record) if test(f))


COLUMNS = field_names(ResultRow)
OPTIONAL_COLUMNS = frozenset(field_names(ResultRow, lambda f: f.default is not MISSING))
PROVENANCE_COLUMNS = field_names(ResultRow, lambda f: f.metadata["group"] == PROVENANCE)
# Provenance that should match between runs compared: the machine and its software stack.
# Not the fleet's columns: they differ from row to row of one run (compare says when one side ran beside others).
FLEET_COLUMNS = ("fleet_devices", "fleet_neighbours")
RUN_COLUMNS = ("timestamp", "run_id", "git_commit", "git_dirty", "model")
STACK_COLUMNS = tuple(c for c in PROVENANCE_COLUMNS if c not in (*RUN_COLUMNS, *FLEET_COLUMNS))
# What identifies a case across runs: compare matches rows on it.
CASE_KEY = field_names(ResultRow, lambda f: f.metadata["key"])
# What identifies an engine configuration (one build of it is one engine).
ENGINE_KEY = field_names(ResultRow, lambda f: f.metadata["engine"])
# What only an in-process engine can fill: blank on HTTP targets, whatever the scenario declares.
ENGINE_ONLY = frozenset(field_names(ResultRow, lambda f: f.metadata["engine_only"]))
# What ``lorabench compare`` judges: metric -> True where higher is better.
COMPARED = {f.name: f.metadata["better"] == HIGHER for f in fields(ResultRow) if f.metadata["better"] is not None}
# What files written before a column existed meant by its absence.
OLDER_FILES = {f.name: f.metadata["older"] for f in fields(ResultRow) if f.metadata["older"] is not None}
# The optional columns that depend on the scenario, not on the engine.
SCENARIO_COLUMNS = OPTIONAL_COLUMNS - set(field_names(ResultRow, lambda f: f.metadata["by_engine"]))
