"""The records a run keeps beside its result rows, declared once: per-request samples,
the engine's timeline and each adapter's share of an online replay, capacity probes and
adapter digests, with their CSV columns and the files they go to.

Each file's columns are derived from its record; samples, timeline, adapters and probes
lead with ``SAMPLE_KEY``, enough to find the case row they belong to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lorabench.results.schema import CASE_KEY, field_names


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One request of one measured round (batch scenarios) or of a replayed trace (online)."""

    round: int
    request: int
    adapter: str
    adapter_rank: int | None
    prompt_tokens: int
    output_tokens: int
    queue_ms: float
    ttft_ms: float  # online: from the scheduled arrival
    decode_ms: float
    request_e2e_ms: float
    ttft_from_send_ms: float | None = None  # online: from the send
    prefill_ms: float | None = None
    batch_e2e_ms: float | None = None
    arrival_s: float | None = None
    send_lag_ms: float | None = None
    finished: bool | None = None
    failed: bool | None = None  # the engine failed it (HTTP: an error status, a broken stream)
    # Prompt tokens found in the prefix cache (vLLM's num_cached_tokens; in process only).
    cached_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class TimelineRecord:
    """The engine over one stretch of an online replay (``lorabench.targets.timeline``): one engine
    step, or the steps less than 50 ms after the stretch's first, merged."""

    t_s: float  # the stretch's first step, in seconds since the trace started
    steps: int
    # The most over the stretch's steps: KV cache in use (0-1), requests and distinct adapters.
    kv_usage: float
    running: int
    waiting: int
    adapters_running: int
    adapters_waiting: int
    # Summed over the stretch's steps; of the prefix cache, the prompt tokens of the requests
    # first scheduled (queries) and those found cached (hits): vLLM's PrefixCacheStats.
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    prefix_queries: int = 0
    prefix_hits: int = 0


@dataclass(frozen=True, kw_only=True)
class AdapterRecord:
    """One adapter's share of an online replay: its measured requests (after the warm-up)."""

    adapter: str
    requests: int
    finished: int
    prompt_tokens: int
    output_tokens: int  # generated, finished or not
    ttft_ms: float  # mean over finished requests, as the row's ttft_ms
    ttft_ms_p50: float
    ttft_ms_p99: float
    decode_ms_p50: float
    slo_attainment: float
    # Of its finished requests' prompt tokens, found cached (blank where the engine does not
    # say) and predicted by the trace's hash ids (blank without them): docs/metrics.md.
    prefix_hit_rate: float | None = None
    prefix_hit_rate_predicted: float | None = None


@dataclass(frozen=True, kw_only=True)
class IsolationRecord:
    """One greedy answer of the isolation canaries (``lorabench.scenarios.isolation``), in the
    order sent: with the prompt's ids, what reproduces a finding on another engine."""

    prompt: int
    adapter: str
    step: str  # reference (salted: nothing cached), owner, victim, control, reloaded
    digest: str
    # Prompt tokens the engine found cached (vLLM's num_cached_tokens; blank where not told).
    cached_tokens: int | None
    token_ids: str  # the answer, space-separated
    prompt_token_ids: str


@dataclass(frozen=True, kw_only=True)
class ProbeRecord:
    """One probe of a capacity search: a replay at one rate (``lorabench.measure.capacity.Probe``)."""

    probe: int  # in the order the search ran them
    rate: float
    requests: int  # measured: arrived after the warm-up
    met: int
    unfinished: int  # still running after the drain bound, then aborted
    failed_requests: int = 0  # failed by the engine (HTTP: an error status, a broken stream)
    attainment: float
    ci_low: float
    ci_high: float
    passed: bool
    # Measured at least capacity.MIN_REQUESTS requests: a pass or a fail. An undecided probe is
    # run again at its rate, longer (duration_s), and neither passes nor fails.
    decided: bool | None = None
    # Why an undecided probe decided nothing: too few requests, its client fell behind, or
    # requests failed (docs/capacity.md); blank for a decided one.
    undecided_why: str | None = None
    # Why it stopped before its end, certainly over (lorabench.measure.probe_stop), and when, in
    # seconds from its start; blank when it ran whole. Then requests and met are those whose SLO
    # verdict was due by the stop; planned, sent and finished count its measured requests.
    stopped_early: str | None = None
    stopped_at_s: float | None = None
    planned: int | None = None
    sent: int | None = None
    finished: int | None = None
    duration_s: float | None = None  # its arrivals, warm-up included: probe_duration_s, longer when rerun
    # Waited before it for the engine to have no unfinished request (the last probe's aborted
    # leftovers), and the requests still unfinished when it started; blank where the engine cannot tell.
    idle_wait_s: float | None = None
    busy_at_start: int | None = None
    goodput_rps: float
    ttft_ms_p99: float
    decode_ms_p99: float
    ttft_from_send_ms_p99: float | None = None
    send_lag_ms_p50: float | None = None
    send_lag_ms_p99: float | None = None
    send_lag_ms_max: float | None = None
    kv_usage_max: float | None = None
    preemptions: int | None = None
    adapters_waiting_max: int | None = None
    # Its measured requests' prompt tokens found cached, and what a trace's hash ids predict.
    prefix_hit_rate: float | None = None
    prefix_hit_rate_predicted: float | None = None
    seconds: float  # the probe's wall time, its drain included


@dataclass(frozen=True, kw_only=True)
class DigestRecord:
    """One adapter's greedy output digest on one engine build (``<run>.digests.csv``)."""

    run_id: str
    model: str
    device_type: str
    engine_id: str
    build: int
    adapter: str
    adapter_rank: int | None
    digest: str
    base_digest: str


def counted_by_rank(finished: object, arrival_s: object, warmup_s: object) -> bool:
    """Whether a sample counts in the by-rank medians (the session's line, ``compare
    --by-rank``): as the row's own latencies, a request that finished (a batch's samples say
    nothing: all did) and arrived after its case's warm-up. Values as read from a file too:
    blank is "not said", "False" is false."""

    def said(value: object) -> bool:
        return value is not None and value == value and str(value) != ""  # nan: not said

    if said(finished) and str(finished) in ("False", "0", "0.0"):
        return False
    return not (said(arrival_s) and said(warmup_s) and float(arrival_s) < float(warmup_s))  # type: ignore[arg-type]


# Enough to find a sample's case row: the run, the engine build and the case key.
@dataclass(frozen=True, kw_only=True)
class CanaryRecord:
    """One greedy answer of a canary, in the order sent."""

    # base, alone, batched, control (a base-only batch), first, repeat, evictor, after, logprobs, fill, padded.
    step: str
    adapter: str  # BASE ("") for the base model
    prompt: int
    # The batch it was sent in, as adapter:prompt, space-separated, the base model as "base";
    # blank where it was sent alone.
    batch: str
    digest: str
    token_ids: str  # the answer, space-separated
    prompt_token_ids: str
    # Prompt positions whose log probabilities came back, where the request asked for them in
    # process; blank where it did not ask, or over HTTP (which the check does not read them from).
    prompt_logprobs: str = ""
    # The answer's log probabilities, space-separated, as Python writes floats (exact): each sampled
    # token's where it asked for them, each answer token's prompt logprob on a teacher-forced
    # request (its prompt: a prompt and an answer); blank otherwise. What prompt_logprobs judges.
    logprobs: str = ""


SAMPLE_KEY = ("timestamp", "run_id", "engine_id", "build", *(c for c in CASE_KEY if c != "timestamp"))
SAMPLE_COLUMNS = SAMPLE_KEY + field_names(Sample)
TIMELINE_FIELDS = field_names(TimelineRecord)
TIMELINE_COLUMNS = SAMPLE_KEY + TIMELINE_FIELDS
ADAPTER_COLUMNS = SAMPLE_KEY + field_names(AdapterRecord)
PROBE_COLUMNS = SAMPLE_KEY + field_names(ProbeRecord)
ISOLATION_COLUMNS = SAMPLE_KEY + field_names(IsolationRecord)
CANARY_COLUMNS = SAMPLE_KEY + field_names(CanaryRecord)
DIGEST_COLUMNS = field_names(DigestRecord)


def beside(csv_path: Path, kind: str) -> Path:
    """A file beside a result file: ``run.csv`` -> ``run.KIND.csv`` (samples, digests)."""
    return csv_path.with_name(f"{csv_path.stem}.{kind}.csv")


def replays_path_for(csv_path: Path, kind: str) -> Path:
    """What online replays record, in a folder beside a result file: ``run.csv`` ->
    ``run.replays/KIND.csv`` (timeline, adapters); there, what reads a results folder's
    CSV files (``result_files``) cannot take them for results."""
    return csv_path.with_name(f"{csv_path.stem}.replays") / f"{kind}.csv"


def samples_path_for(csv_path: Path) -> Path:
    return beside(csv_path, "samples")


def digests_path_for(csv_path: Path) -> Path:
    return beside(csv_path, "digests")


# What the files written beside a result file end with (``run.samples.csv``, ``run.digests.csv``).
COMPANIONS = (samples_path_for(Path("x.csv")).name[1:], digests_path_for(Path("x.csv")).name[1:])


def is_companion(path: Path) -> bool:
    """Whether ``path`` is a file written beside a result file, not a result file."""
    return Path(path).name.endswith(COMPANIONS)


def result_files(folder: Path) -> list[Path]:
    """The result files in a folder, without the samples and digests files beside them."""
    return [p for p in sorted(Path(folder).glob("*.csv")) if not is_companion(p)]
