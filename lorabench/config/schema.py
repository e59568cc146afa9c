"""The configuration document (``config/common.json``) as pydantic models: what a file may say.

Checks that need nothing but the document live here, on the models; checks that need
the files it names, or vLLM, live in ``resolve``.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lorabench.capacity import MIN_REQUESTS, shortest_probe_s
from lorabench.graph import GRAPH_KEYS
from lorabench.http.target import check_url

WORKLOADS = ("distinct", "uniform", "skewed", "identical", "mixed")
Workload = Literal["distinct", "uniform", "skewed", "identical", "mixed"]
DeviceType = Literal["cpu", "cuda", "npu"]
# vLLM rejects any other value of max_lora_rank when the engine starts.
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
LORA_KEYS = ("max_loras", "max_lora_rank", "max_cpu_loras")
# Set by lorabench itself: the measurements depend on them.
RESERVED_ENGINE_KEYS = {
    "model": "set the top-level 'model' field instead",
    "tokenizer": "set the top-level 'tokenizer' field instead",
    "enable_lora": "lorabench enables LoRA per engine configuration",
    "disable_log_stats": "lorabench needs per-request stats and turns them on",
    "enable_prefix_caching": "lorabench turns prefix caching off so rounds are comparable",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


IntOrList = PositiveInt | list[PositiveInt]


Settings = dict[str, Any]


class EngineArgs(BaseModel):
    """Keyword arguments for vLLM's engine. The three LoRA knobs and the graph-mode
    settings (``lorabench.graph``) may be lists: each combination is a configuration."""

    model_config = ConfigDict(extra="allow", frozen=True)

    max_loras: IntOrList = 4
    max_lora_rank: LoraRank | list[LoraRank] = 16
    max_cpu_loras: IntOrList | None = None
    # Unset: vLLM's own default, and nothing is passed.
    enforce_eager: bool | list[bool] | None = None
    # Objects only: vLLM's async engine takes a mode number only as {"mode": N}.
    compilation_config: Settings | list[Settings] | None = None
    additional_config: Settings | list[Settings] | None = None

    @field_validator(*LORA_KEYS, *GRAPH_KEYS)
    @classmethod
    def _no_repeats(cls, value: Any) -> Any:
        return _unique(value)


class Matrix(_Strict):
    batch_sizes: list[PositiveInt] = Field(min_length=1)
    workloads: list[Workload] = Field(default=list(WORKLOADS), min_length=1)
    # Two tokens at least: decode time is measured between the first and the last.
    output_len: int = Field(ge=2)
    input_len: PositiveInt | None = None
    warmup_rounds: NonNegativeInt = 1
    rounds: PositiveInt = 3
    # Each engine configuration is built this many times per run. Builds of the same
    # code settle at speeds that differ more than rounds within one build do, and
    # `lorabench compare` needs at least two a side to tell that noise from a change.
    builds: PositiveInt = 2
    seed: int = 0
    # The Zipf exponent of the skewed workload (Punica's default).
    skew_alpha: PositiveFloat = 1.5
    # The share of base-model requests (no adapter) in a mixed batch.
    mixed_base_share: float = Field(default=0.5, gt=0, lt=1)

    @field_validator("batch_sizes", "workloads")
    @classmethod
    def _no_repeats(cls, value: Any) -> Any:
        return _unique(value)


def _unique(value: Any) -> Any:
    if not isinstance(value, list):
        return value
    texts = [json.dumps(v, sort_keys=True) for v in value]
    repeated = sorted({t for t in texts if texts.count(t) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} listed more than once: each value makes its own cases")
    return value


class DummyAdapterSpec(_Strict):
    count: PositiveInt = 8
    ranks: list[PositiveInt] = Field(default=[8, 16], min_length=1)
    target_modules: list[str] = Field(default=["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    seed: int = 0


class GeneratedAdapters(_Strict):
    generate: DummyAdapterSpec


# What describes a synthetic trace: a suite that replays a trace file sets none of it.
SYNTHETIC_FIELDS = ("num_adapters", "alpha", "cv", "input_range", "output_range", "lengths", "seed")


class TraceShape(_Strict):
    """What a trace is made of, whatever its rate: synthetic (adapters, popularity,
    burstiness, lengths; each list crossed with the others) or imported (``trace``: a file
    ``lorabench trace import`` wrote, relative to the config's folder, from ``start`` on)."""

    name: str = Field(default="suite", pattern=r"^[A-Za-z0-9_.]+$")
    # Declared before the fields whose checks depend on it.
    trace: Annotated[str, Field(min_length=1)] | None = None
    num_adapters: Annotated[list[PositiveInt], Field(min_length=1)] | None = Field(default=None, validate_default=True)
    alpha: list[PositiveFloat] = Field(default=[1.0], min_length=1)
    cv: list[PositiveFloat] = Field(default=[1.0], min_length=1)
    input_range: tuple[PositiveInt, PositiveInt] = (8, 64)
    output_range: tuple[PositiveInt, PositiveInt] = (8, 64)
    lengths: Literal["uniform", "longtail"] = "uniform"
    seed: int = 0
    # Seconds into an imported trace where the replay starts.
    start: NonNegativeFloat = 0.0

    @field_validator("input_range", "output_range")
    @classmethod
    def _ordered(cls, value: tuple[int, int]) -> tuple[int, int]:
        if value[0] > value[1]:
            raise ValueError(f"low {value[0]} is above high {value[1]}: write [low, high]")
        return value

    @field_validator(*SYNTHETIC_FIELDS)
    @classmethod
    def _synthetic_only(cls, value: Any, info: ValidationInfo) -> Any:
        imported = info.data.get("trace") is not None
        if imported and not (info.field_name == "num_adapters" and value is None):
            raise ValueError(
                "a suite with 'trace' replays that file, whose header says its adapters and lengths: "
                "leave this synthetic-trace field out"
            )
        if not imported and value is None:
            raise ValueError("a synthetic suite needs it (a list such as [8]); or set 'trace' to replay a trace file")
        return value

    @field_validator("start")
    @classmethod
    def _imported_only(cls, value: float, info: ValidationInfo) -> float:
        if info.data.get("trace") is None:
            raise ValueError("'start' is where a replay of a trace file begins: set 'trace', or leave 'start' out")
        return value


class OnlineSuite(TraceShape):
    """One sweep of traces, as in S-LoRA's experiment suites: each rate (and, for a
    synthetic shape, each combination of its lists) is a case. An imported trace is
    time-scaled so that ``duration`` seconds of it arrive at that mean rate."""

    rate: list[PositiveFloat] = Field(min_length=1)
    duration: PositiveFloat = 300.0


class Online(_Strict):
    suites: list[OnlineSuite] = Field(min_length=1)
    # S-LoRA's target: first token within 6 s.
    slo_ttft_ms: PositiveFloat = 6000.0
    slo_tpot_ms: PositiveFloat = 200.0
    warmup_s: NonNegativeFloat = 0.0
    drain_timeout_s: PositiveFloat = 60.0


class Residency(_Strict):
    """Requests whose adapter sits in a device slot, in the CPU cache, or on disk."""

    # Timed requests per tier, each served alone.
    requests: PositiveInt = 6


class WorkingSet(_Strict):
    """Requests cycling through W adapters, for each W in ``sizes``."""

    sizes: list[PositiveInt] = Field(min_length=1)
    # Timed requests per size: ``cycles`` times through the set, and at least ``min_requests``.
    cycles: PositiveInt = 2
    min_requests: PositiveInt = 8
    output_len: int = Field(default=8, ge=2)

    @field_validator("sizes")
    @classmethod
    def _no_repeats(cls, value: Any) -> Any:
        return _unique(value)


class Capacity(_Strict):
    """The capacity search (``lorabench.capacity``): the highest rate at which ``target`` of
    the requests meet both SLOs, for each trace shape, on every LoRA engine."""

    shapes: list[TraceShape] = Field(min_length=1)
    slo_ttft_ms: PositiveFloat
    slo_tpot_ms: PositiveFloat
    # The share of requests that must meet both SLOs (DistServe's 90 %).
    target: float = Field(default=0.9, gt=0, le=1)
    # The search stops once the lowest failing rate is within this ratio of the highest passing one.
    precision: float = Field(default=0.1, gt=0, le=1)
    probe_duration_s: PositiveFloat = 10.0
    # Requests arriving in a probe's first seconds are left out of its attainment.
    warmup_s: NonNegativeFloat = 2.0
    # After a probe's last arrival: how long its requests may take to finish before it counts as over.
    drain_s: PositiveFloat = 5.0
    max_probes: int = Field(default=8, ge=2)
    max_time_s: PositiveFloat = 300.0
    max_rate: PositiveFloat | None = None
    # Engine builds the searches run on: each search is long, so fewer than matrix.builds by
    # default (--bench-builds overrides both); two or more say whether a lead beats the noise.
    builds: PositiveInt = 1
    # The closed-loop estimate the search starts from: this many requests, this many at a time.
    estimate_requests: PositiveInt = 32
    estimate_concurrency: PositiveInt = 8

    @model_validator(mode="after")
    def _probes_can_judge(self) -> Capacity:
        if self.warmup_s >= self.probe_duration_s:
            raise ValueError(
                f"warmup_s {self.warmup_s:g} leaves nothing of probe_duration_s {self.probe_duration_s:g} "
                "to measure: make probe_duration_s longer than warmup_s"
            )
        shortest = shortest_probe_s(self.slo_ttft_ms / 1000, self.precision, self.target, self.warmup_s)
        if self.probe_duration_s < shortest:
            raise ValueError(
                f"probe_duration_s {self.probe_duration_s:g} is too short to tell an overload from a pass: at "
                f"{1 + self.precision:g} times the rate the engine keeps up with, the queue needs "
                f"{shortest:.3g} s to push enough requests past slo_ttft_ms {self.slo_ttft_ms:g}; make "
                f"probe_duration_s at least {shortest:.3g}, or raise precision, or lower slo_ttft_ms"
            )
        if self.max_rate is not None and self.max_rate <= self.min_rate:
            raise ValueError(
                f"max_rate {self.max_rate:g} is at or below {self.min_rate:.3g} requests/s, the lowest rate whose "
                f"probe holds {MIN_REQUESTS} measured requests: raise max_rate or lengthen probe_duration_s"
            )
        return self

    @property
    def min_rate(self) -> float:
        """The lowest rate a probe can judge: ``MIN_REQUESTS`` measured requests on average."""
        return MIN_REQUESTS / (self.probe_duration_s - self.warmup_s)


class Churn(_Strict):
    """Adapters outside each trace's working set loaded and unloaded while it replays
    (``lorabench.scenarios.churn``): every trace of ``suites`` crossed with every ``rate``."""

    suites: list[OnlineSuite] = Field(min_length=1)
    # Operations a second, alternating: load the next churn adapter, unload it.
    rate: list[PositiveFloat] = Field(default=[1.0], min_length=1)
    # The config's adapters after the trace's working set that the operations cycle through.
    adapters: PositiveInt = 2
    slo_ttft_ms: PositiveFloat = 6000.0
    slo_tpot_ms: PositiveFloat = 200.0
    warmup_s: NonNegativeFloat = 0.0
    drain_timeout_s: PositiveFloat = 60.0

    @field_validator("rate")
    @classmethod
    def _no_repeats(cls, value: Any) -> Any:
        return _unique(value)

    @model_validator(mode="after")
    def _something_measured(self) -> Churn:
        shortest = min(suite.duration for suite in self.suites)
        if self.warmup_s >= shortest:
            raise ValueError(
                f"warmup_s {self.warmup_s:g} leaves nothing of a {shortest:g} s trace to measure: "
                "lower warmup_s or lengthen the suites' duration"
            )
        return self


class Serve(_Strict):
    """The ``serve`` target's waits for the ``vllm serve`` it starts (``lorabench.http.serve``):
    the defaults are here, and nowhere else."""

    # From start to /health answering: the model's load, compile and graph capture. A 70B
    # model on an NPU node can take longer than the default.
    health_timeout_s: float = 600.0
    # From SIGTERM to SIGKILL: the server's shutdown.
    stop_timeout_s: float = 30.0

    @field_validator("health_timeout_s", "stop_timeout_s")
    @classmethod
    def _seconds(cls, value: float, info: ValidationInfo) -> float:
        if not 0 < value < math.inf:
            what = {
                "health_timeout_s": "how long vllm serve may take to answer /health, such as 1800 for a model "
                "that loads for up to half an hour",
                "stop_timeout_s": "how long vllm serve may take to exit after SIGTERM before it is killed, such as 30",
            }
            raise ValueError(f"give a number of seconds above 0: {what[info.field_name]}")
        return value


class UrlTarget(_Strict):
    """A server that already runs (``lorabench.http``): nothing is started or stopped."""

    url: str

    @field_validator("url")
    @classmethod
    def _a_server(cls, value: str) -> str:
        return check_url(value)


class ConfigFile(_Strict):
    """The JSON document as written; paths are still relative to its folder."""

    model: str
    tokenizer: str | None = None
    device: DeviceType | None = None
    adapters: str | GeneratedAdapters
    prompts: str
    results_dir: str = "results"
    output: str | None = None
    engine: EngineArgs = EngineArgs()
    env: dict[str, str | int | float] = {}
    matrix: Matrix
    online: Online | None = None
    residency: Residency | None = None
    working_set: WorkingSet | None = None
    capacity: Capacity | None = None
    churn: Churn | None = None
    # Where requests go (lorabench.http.target); --bench-target overrides it.
    target: Literal["inprocess", "serve"] | UrlTarget = "inprocess"
    # How long the serve target waits for its server to start and to stop.
    serve: Serve = Serve()
