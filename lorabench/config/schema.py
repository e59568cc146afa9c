"""The configuration document (``config/common.json``) as pydantic models: what a file may say.

Checks that need nothing but the document live here, on the models; checks that need
the files it names, or vLLM, live in ``resolve``. The sections that replay traces
(``online``, ``capacity``, ``churn``) are in ``trace_sections``.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
)

from lorabench.config.strict import Seed, Strict, unique
from lorabench.config.target import check_url
from lorabench.config.trace_sections import Capacity, Churn, Online
from lorabench.results.graph import GRAPH_KEYS
from lorabench.results.schema import COMPARED

WORKLOADS = ("distinct", "uniform", "skewed", "identical", "mixed")
Workload = Literal["distinct", "uniform", "skewed", "identical", "mixed"]
DeviceType = Literal["cpu", "cuda", "npu"]
# vLLM rejects any other value of max_lora_rank when the engine starts.
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
LORA_KEYS = ("max_loras", "max_lora_rank", "max_cpu_loras")
# vLLM's prefix caching, per configuration: off unless the config says (a cached prefix makes
# a round cheaper than the one before it); the isolation scenario turns it on for its engines.
PREFIX_CACHING = "enable_prefix_caching"
# Set by lorabench itself: the measurements depend on them.
RESERVED_ENGINE_KEYS = {
    "model": "set the top-level 'model' field instead",
    "tokenizer": "set the top-level 'tokenizer' field instead",
    "enable_lora": "lorabench enables LoRA per engine configuration",
    "disable_log_stats": "lorabench needs per-request stats and turns them on",
}


IntOrList = PositiveInt | list[PositiveInt]


Settings = dict[str, Any]


class EngineArgs(BaseModel):
    """Keyword arguments for vLLM's engine. The three LoRA knobs, prefix caching and the
    graph-mode settings (``lorabench.results.graph``) may be lists: each combination is a
    configuration."""

    model_config = ConfigDict(extra="allow", frozen=True)

    max_loras: IntOrList = 4
    max_lora_rank: LoraRank | list[LoraRank] = 16
    max_cpu_loras: IntOrList | None = None
    # Unset: vLLM's own default, and nothing is passed.
    enforce_eager: bool | list[bool] | None = None
    # Objects only: vLLM's async engine takes a mode number only as {"mode": N}.
    compilation_config: Settings | list[Settings] | None = None
    additional_config: Settings | list[Settings] | None = None
    # A list: a configuration with and one without, to measure what caching gains.
    enable_prefix_caching: bool | list[bool] = False

    @field_validator(*LORA_KEYS, *GRAPH_KEYS, PREFIX_CACHING)
    @classmethod
    def _no_repeats(cls, value: Any) -> Any:
        return unique(value)


class Matrix(Strict):
    batch_sizes: list[PositiveInt] = Field(min_length=1)
    workloads: list[Workload] = Field(default=list(WORKLOADS), min_length=1)
    # Two tokens at least: decode time is measured between the first and the last.
    output_len: int = Field(ge=2)
    input_len: PositiveInt | None = None
    warmup_rounds: NonNegativeInt = 1
    rounds: PositiveInt = 3
    # Sequential stopping (docs/metrics.md#sequential-stopping): rounds go on past `rounds`
    # until each headline metric's 95 % interval is within precision_pct percent of it, or
    # max_rounds (default 4 x rounds) ran; --bench-precision overrides precision_pct.
    max_rounds: int | None = Field(default=None, ge=2)
    precision_pct: float | None = Field(default=None, gt=0, lt=100)
    # Each engine configuration is built this many times per run. Builds of the same
    # code settle at speeds that differ more than rounds within one build do, and
    # `lorabench compare` needs at least two a side to tell that noise from a change.
    builds: PositiveInt = 2
    # With a precision target: a batch case's builds go on past `builds` until its builds' 95 %
    # intervals are within it, or max_builds were built (docs/metrics.md#sequential-stopping).
    max_builds: int | None = Field(default=None, ge=2)
    seed: Seed = 0
    # The Zipf exponent of the skewed workload (Punica's default).
    skew_alpha: PositiveFloat = 1.5
    # The share of base-model requests (no adapter) in a mixed batch.
    mixed_base_share: float = Field(default=0.5, gt=0, lt=1)
    # A prefix of this many tokens that shared_prefix_share of each batch's requests start
    # with (lorabench.load.workload): what prefix caching can reuse.
    shared_prefix_len: NonNegativeInt = 0
    shared_prefix_share: float = Field(default=1.0, gt=0, le=1)

    @field_validator("batch_sizes", "workloads")
    @classmethod
    def _no_repeats(cls, value: Any) -> Any:
        return unique(value)

    @field_validator("max_rounds")
    @classmethod
    def _at_least_the_minimum(cls, value: int | None, info: ValidationInfo) -> int | None:
        rounds = info.data.get("rounds")
        if value is not None and rounds is not None and value < rounds:
            raise ValueError(f"rounds = {rounds} is the minimum a case runs: give {rounds} or more")
        return value

    @field_validator("max_builds")
    @classmethod
    def _at_least_the_builds(cls, value: int | None, info: ValidationInfo) -> int | None:
        builds = info.data.get("builds")
        if value is not None and builds is not None and value < builds:
            raise ValueError(f"builds = {builds} is the least a configuration is built: give {builds} or more")
        return value

    @property
    def rounds_at_most(self) -> int:
        """The most rounds sequential stopping runs a case: ``max_rounds``, else 4 x ``rounds`` (2 at least)."""
        return self.max_rounds or max(4 * self.rounds, 2)

    @field_validator("shared_prefix_len")
    @classmethod
    def _within_the_prompt(cls, value: int, info: ValidationInfo) -> int:
        input_len = info.data.get("input_len")
        if value and input_len is None:
            raise ValueError("a shared prefix is of synthetic prompts: set matrix.input_len, or leave it out")
        if value and value >= input_len:
            raise ValueError(
                f"the prompt is input_len = {input_len} tokens and needs one of its own after the prefix: "
                f"give {input_len - 1} or less"
            )
        return value


class DummyAdapterSpec(Strict):
    count: PositiveInt = 8
    ranks: list[PositiveInt] = Field(default=[8, 16], min_length=1)
    target_modules: list[str] = Field(default=["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    seed: Seed = 0

    @field_validator("ranks", "target_modules")
    @classmethod
    def _no_repeats(cls, value: Any) -> Any:
        return unique(value, "the adapters would be named, or would adapt a module, twice")


class GeneratedAdapters(Strict):
    generate: DummyAdapterSpec


class Residency(Strict):
    """Requests whose adapter sits in a device slot, in the CPU cache, or on disk."""

    # Timed requests per tier, each served alone.
    requests: PositiveInt = 6


class WorkingSet(Strict):
    """Requests cycling through W adapters, for each W in ``sizes``."""

    sizes: list[PositiveInt] = Field(min_length=1)
    # Timed requests per size: ``cycles`` times through the set, and at least ``min_requests``.
    cycles: PositiveInt = 2
    min_requests: PositiveInt = 8
    output_len: int = Field(default=8, ge=2)

    @field_validator("sizes")
    @classmethod
    def _no_repeats(cls, value: Any) -> Any:
        return unique(value)


class Serve(Strict):
    """The ``serve`` target's waits for the ``vllm serve`` it starts (``lorabench.targets.http.serve``):
    the defaults are here, and nowhere else."""

    # From start to /health answering: the model's load, compile and graph capture. A 70B
    # model on an NPU node can take longer than the default.
    health_timeout_s: float = 600.0
    # From SIGTERM to SIGKILL: the server's shutdown.
    stop_timeout_s: float = 30.0

    @field_validator("health_timeout_s", "stop_timeout_s")
    @classmethod
    def _seconds(cls, value: float, info: ValidationInfo) -> float:
        if value <= 0:  # Infinity and NaN: refused in every section (Strict)
            what = {
                "health_timeout_s": "how long vllm serve may take to answer /health, such as 1800 for a model "
                "that loads for up to half an hour",
                "stop_timeout_s": "how long vllm serve may take to exit after SIGTERM before it is killed, such as 30",
            }
            raise ValueError(f"give a number of seconds above 0: {what[info.field_name]}")
        return value


class UrlTarget(Strict):
    """A server that already runs (``lorabench.targets.http``): nothing is started or stopped."""

    url: str

    @field_validator("url")
    @classmethod
    def _a_server(cls, value: str) -> str:
        return check_url(value)


class History(Strict):
    """The nightly gate's thresholds (``lorabench history check --config``): the smallest
    worsening of a metric that fails it, in percent; a ``--threshold`` given on the command
    line overrides them. Unset: the gate's own default (docs/history.md#the-nightly-gate)."""

    threshold_pct: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    metrics_pct: dict[str, float] = {}

    @field_validator("metrics_pct")
    @classmethod
    def _compared(cls, value: dict[str, float]) -> dict[str, float]:
        for metric, pct in value.items():
            if metric not in COMPARED:
                raise ValueError(f"'{metric}' is not a compared column; columns are {', '.join(COMPARED)}")
            if not 0 <= pct < math.inf:
                raise ValueError(f"'{metric}': give a percentage of 0 or more, such as 3 for 3 %")
        return value


# A variable's name as a shell and os.environ take it ("A=B" or "" failed in every case).
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"


class ConfigFile(Strict):
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

    @field_validator("env")
    @classmethod
    def _variables(cls, value: dict[str, Any]) -> dict[str, Any]:
        named = next((k for k in value if not re.fullmatch(ENV_NAME, k)), None)
        if named is not None:
            raise ValueError(f"{named!r} is no variable's name: use letters, digits and _, not a digit first")
        bad = next((k for k, v in value.items() if isinstance(v, str) and "\x00" in v), None)
        if bad is not None:
            raise ValueError(f"{bad}'s value holds a NUL character, which no environment variable can")
        return value

    matrix: Matrix
    online: Online | None = None
    residency: Residency | None = None
    working_set: WorkingSet | None = None
    capacity: Capacity | None = None
    churn: Churn | None = None
    # Where requests go (lorabench.config.target); --bench-target overrides it.
    target: Literal["inprocess", "serve"] | UrlTarget = "inprocess"
    # How long the serve target waits for its server to start and to stop.
    serve: Serve = Serve()
    # The nightly gate's thresholds (lorabench history check --config).
    history: History = History()
