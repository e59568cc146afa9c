"""The configuration sections that replay traces: ``online`` (suites of traces at given
rates), ``capacity`` (a search for the highest rate that meets the SLOs, per trace shape) and
``churn`` (adapters loaded and unloaded while suites replay), and the trace shape they share.

Checks that need nothing but the document live here, on the models; those that need the
trace files or the model live in ``traces``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lorabench.config.strict import Seed, Strict, unique

# What describes a synthetic trace: a suite that replays a trace file sets none of it.
SYNTHETIC_FIELDS = ("num_adapters", "alpha", "cv", "input_range", "output_range", "lengths", "seed")

# Below this many measured requests a probe's attainment means little: the search never
# goes to a rate whose probe would hold fewer on average, and a probe that holds fewer by
# chance decides nothing (it is rerun longer).
MIN_REQUESTS = 10


def shortest_probe_s(slo_ttft_s: float, precision: float, target: float, warmup_s: float) -> float:
    """The shortest probe that fails at ``1 + precision`` times the rate the engine keeps up
    with. There the queue, empty at the start, grows so that a request arriving at ``t``
    waits about ``precision * t``; it misses the TTFT SLO once ``t > slo / precision``, and
    more than ``1 - target`` of the measured requests must arrive after that."""
    return (slo_ttft_s / precision - (1 - target) * warmup_s) / target


class TraceShape(Strict):
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
    seed: Seed = 0
    # Seconds into an imported trace where the replay starts.
    start: NonNegativeFloat = 0.0
    # Whether the replay turns an imported trace's hash ids into shared prefixes
    # (docs/online.md#shared-prefixes): null where it has them, true insists, false ignores them.
    shared_prefixes: bool | None = None

    @field_validator("num_adapters", "alpha", "cv")
    @classmethod
    def _no_repeats(cls, value: Any) -> Any:
        return unique(value)

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

    @field_validator("shared_prefixes")
    @classmethod
    def _hashed_only(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        if value and info.data.get("trace") is None:
            raise ValueError(
                "a synthetic trace has no hash ids to share prefixes by: set 'trace' to a file imported with them "
                "(lorabench trace import mooncake), or leave it out"
            )
        return value


class OnlineSuite(TraceShape):
    """One sweep of traces, as in S-LoRA's experiment suites: each rate (and, for a
    synthetic shape, each combination of its lists) is a case. An imported trace is
    time-scaled so that ``duration`` seconds of it arrive at that mean rate."""

    rate: list[PositiveFloat] = Field(min_length=1)
    duration: PositiveFloat = 300.0

    @field_validator("rate")
    @classmethod
    def _no_repeated_rate(cls, value: Any) -> Any:
        return unique(value)


class Online(Strict):
    suites: list[OnlineSuite] = Field(min_length=1)
    # S-LoRA's target: first token within 6 s.
    slo_ttft_ms: PositiveFloat = 6000.0
    slo_tpot_ms: PositiveFloat = 200.0
    warmup_s: NonNegativeFloat = 0.0
    drain_timeout_s: PositiveFloat = 60.0


class Capacity(Strict):
    """The capacity search (``lorabench.measure.capacity``): the highest rate at which ``target`` of
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
    # The least a request gets to finish from its arrival before it is aborted and its probe is
    # over; more where its output needs it (lorabench.measure.replay.drain_s, docs/capacity.md#the-drain).
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


class Churn(Strict):
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
        return unique(value)

    @model_validator(mode="after")
    def _something_measured(self) -> Churn:
        shortest = min(suite.duration for suite in self.suites)
        if self.warmup_s >= shortest:
            raise ValueError(
                f"warmup_s {self.warmup_s:g} leaves nothing of a {shortest:g} s trace to measure: "
                "lower warmup_s or lengthen the suites' duration"
            )
        return self
