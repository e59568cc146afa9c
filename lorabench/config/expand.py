"""From a configuration to what runs: engine configurations, online cases, vLLM's arguments.

An engine configuration is one combination of the LoRA knobs (each may be a list in the
file); the plugin builds each one ``matrix.builds`` times, and one build serves every
scenario that needs its configuration.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from lorabench.config.schema import LORA_KEYS, ConfigFile, Matrix
from lorabench.config.trace_sections import TraceShape
from lorabench.load.adapters import Adapter
from lorabench.load.traces import data as trace_data
from lorabench.load.traces import synthetic as trace
from lorabench.load.traces import transforms
from lorabench.load.traces.synthetic import TraceParams, TraceRequest
from lorabench.load.workload import Shape
from lorabench.results import graph
from lorabench.results.schema import engine_id, engine_name


@dataclass(frozen=True)
class EngineSpec:
    """One build of one engine configuration: what the ``engine`` fixture is parametrized by."""

    enable_lora: bool
    max_loras: int | None = None
    max_lora_rank: int | None = None
    max_cpu_loras: int | None = None
    # Graph mode (lorabench.results.graph): None leaves vLLM's default.
    enforce_eager: bool | None = None
    graph_config: str | None = None
    # Which of the run's builds of this configuration (matrix.builds) this is.
    build: int = 0

    @property
    def name(self) -> str:
        return engine_name(
            self.enable_lora,
            self.max_loras,
            self.max_lora_rank,
            self.max_cpu_loras,
            self.enforce_eager,
            self.graph_config,
        )

    @property
    def id(self) -> str:
        return engine_id(self.name, self.build)

    def engine_kwargs(self) -> dict[str, Any]:
        """vLLM's arguments that make this configuration what it is."""
        kwargs = graph.engine_kwargs(self.enforce_eager, self.graph_config)
        if not self.enable_lora:
            return {**kwargs, "enable_lora": False}
        return {
            **kwargs,
            "enable_lora": True,
            "max_loras": self.max_loras,
            "max_lora_rank": self.max_lora_rank,
            "max_cpu_loras": self.max_cpu_loras,
        }


def shape_of(file: ConfigFile) -> Shape:
    return Shape(skew_alpha=file.matrix.skew_alpha, base_share=file.matrix.mixed_base_share)


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def graph_modes(file: ConfigFile) -> list[tuple[bool | None, str | None]]:
    """Every combination of the graph-mode settings' lists, as (enforce_eager, graph_config)."""
    eager, compilation, additional = (as_list(getattr(file.engine, key)) for key in graph.GRAPH_KEYS)
    return [
        (e, graph.canonical({"compilation_config": c, "additional_config": a}))
        for e, c, a in itertools.product(eager, compilation, additional)
    ]


def engine_specs(file: ConfigFile, *, with_lora_off: bool, builds: int = 1) -> list[EngineSpec]:
    """The cross product of the graph modes and the LoRA knobs (and ``lora-off`` first in
    each graph mode if asked), ``builds`` times over, build-major: a configuration's
    builds are spread over the run."""
    configurations = []
    lists = [as_list(getattr(file.engine, key)) for key in LORA_KEYS]
    for eager, settings in graph_modes(file):
        mode = {"enforce_eager": eager, "graph_config": settings}
        if with_lora_off:
            configurations.append(EngineSpec(False, **mode))
        for loras, rank, cpu in itertools.product(*lists):
            configurations.append(EngineSpec(True, loras, rank, cpu if cpu is not None else loras, **mode))
    return [EngineSpec(**{**s.__dict__, "build": b}) for b in range(builds) for s in configurations]


# The trace columns (lorabench.results.schema, group "trace") every online case fills...
ONLINE_TRACE_COLUMNS = frozenset(
    {"trace_suite", "trace_num_adapters", "trace_rate", "trace_duration_s", "trace_warmup_s"}
)
# ...those a synthetic trace fills with its parameters...
SYNTHETIC_TRACE_COLUMNS = frozenset(
    {"trace_alpha", "trace_cv", "trace_lengths", "trace_input_range", "trace_output_range", "trace_seed"}
)
# ...and those an imported trace fills with its file.
IMPORTED_TRACE_COLUMNS = frozenset({"trace_file", "trace_sha256", "trace_start_s"})
# Filled by some online cases only: the scenario's maybe_columns.
MAYBE_TRACE_COLUMNS = SYNTHETIC_TRACE_COLUMNS | IMPORTED_TRACE_COLUMNS


@dataclass(frozen=True)
class OnlineCase:
    """One synthetic trace to replay: it owns where its requests come from and the columns that say so."""

    suite: str
    params: TraceParams

    @property
    def shape_id(self) -> str:
        """The trace without its rate: what a capacity search varies the rate of."""
        p = self.params
        return f"{self.suite}-n{p.num_adapters}-a{p.alpha:g}-cv{p.cv:g}"

    @property
    def id(self) -> str:
        return f"{self.shape_id}-r{self.params.rate:g}"

    def at(self, rate: float, duration: float) -> OnlineCase:
        return replace(self, params=replace(self.params, rate=rate, duration=duration))

    @property
    def num_adapters(self) -> int:
        return self.params.num_adapters

    @property
    def duration(self) -> float:
        return self.params.duration

    @property
    def seed(self) -> int:
        """The seed of the trace, and of its prompts' tokens."""
        return self.params.seed

    def located(self, config_dir: Path) -> OnlineCase:
        """A synthetic trace names no file: itself."""
        return self

    def requests(self, adapters: Sequence[str]) -> list[TraceRequest]:
        return trace.generate(self.params, adapters)

    def fields(self, warmup_s: float) -> dict[str, Any]:
        p = self.params
        return {
            "trace_suite": self.suite,
            "trace_num_adapters": p.num_adapters,
            "trace_rate": p.rate,
            "trace_alpha": p.alpha,
            "trace_cv": p.cv,
            "trace_duration_s": p.duration,
            "trace_lengths": p.lengths,
            "trace_input_range": f"{p.input_range[0]}-{p.input_range[1]}",
            "trace_output_range": f"{p.output_range[0]}-{p.output_range[1]}",
            "trace_seed": p.seed,
            "trace_warmup_s": warmup_s,
        }


@dataclass(frozen=True)
class ImportedCase:
    """One replay of an imported trace (``lorabench trace import``): from ``start`` seconds on,
    time-scaled so that ``duration`` seconds of it arrive at mean rate ``rate``.

    The trace's adapters go, in its header's order, to the adapters ``requests`` is given:
    the config's first N. Its file is read when first needed, once ``located`` has made
    its path absolute, so collecting the case reads nothing."""

    suite: str
    trace: Path
    rate: float
    duration: float
    start: float = 0.0

    @property
    def shape_id(self) -> str:
        start = f"-s{self.start:g}" if self.start else ""
        return f"{self.suite}-{self.trace.stem}{start}"

    @property
    def id(self) -> str:
        return f"{self.shape_id}-r{self.rate:g}"

    def at(self, rate: float, duration: float) -> ImportedCase:
        """The same trace at another rate, sharing the file this case has read already
        (a capacity search asks for one per probe)."""
        moved = replace(self, rate=rate, duration=duration)
        if "data" in self.__dict__:
            moved.__dict__["data"] = self.__dict__["data"]
        return moved

    @cached_property
    def data(self) -> trace_data.TraceData:
        return trace_data.load(self.trace)

    @property
    def num_adapters(self) -> int:
        return len(self.data.adapters)

    @property
    def seed(self) -> int:
        """The seed of the prompts' tokens: a trace has lengths, not content."""
        return 0

    def located(self, config_dir: Path) -> ImportedCase:
        """The case with its trace's path resolved against the config file's folder."""
        return replace(self, trace=config_dir / self.trace)

    def requests(self, adapters: Sequence[str]) -> list[TraceRequest]:
        if len(adapters) < self.num_adapters:
            raise ValueError(f"the trace needs {self.num_adapters} adapters, {len(adapters)} are available")
        window = transforms.replay_window(self.data, self.start, self.duration, self.rate)
        return replace(window, adapters=list(adapters[: self.num_adapters])).requests()

    def fields(self, warmup_s: float) -> dict[str, Any]:
        return {
            "trace_suite": self.suite,
            "trace_num_adapters": self.num_adapters,
            "trace_rate": self.rate,
            "trace_duration_s": self.duration,
            "trace_warmup_s": warmup_s,
            "trace_file": self.trace.name,
            "trace_sha256": trace_data.file_sha256(self.trace),
            "trace_start_s": self.start,
        }


def trace_cases(shape: TraceShape, rates: Sequence[float], duration: float) -> list[OnlineCase | ImportedCase]:
    """Every combination of a synthetic shape's lists with each rate; each rate of an imported one."""
    if shape.trace is not None:
        return [ImportedCase(shape.name, Path(shape.trace), r, duration, shape.start) for r in rates]
    combinations = itertools.product(shape.num_adapters, shape.alpha, shape.cv, rates)
    return [
        OnlineCase(
            shape.name,
            TraceParams(
                num_adapters=n,
                rate=rate,
                alpha=alpha,
                cv=cv,
                input_range=shape.input_range,
                output_range=shape.output_range,
                lengths=shape.lengths,
                duration=duration,
                seed=shape.seed,
            ),
        )
        for n, alpha, cv, rate in combinations
    ]


def online_cases(file: ConfigFile) -> list[OnlineCase | ImportedCase]:
    """Every case of every online suite."""
    suites = file.online.suites if file.online else ()
    return [case for suite in suites for case in trace_cases(suite, suite.rate, suite.duration)]


@dataclass(frozen=True)
class BenchConfig:
    """A validated configuration with every path resolved and every file read."""

    path: Path
    file: ConfigFile
    model: Path
    tokenizer: Path | None
    is_builtin_model: bool
    adapters: tuple[Adapter, ...]
    prompts: tuple[str, ...]
    results_dir: Path
    output: Path | None
    # Problems of sections the selection does not run (``resolve_config``'s ``runs``), said, not refused.
    warnings: tuple[str, ...] = ()

    @property
    def matrix(self) -> Matrix:
        return self.file.matrix

    def llm_kwargs(self, spec: EngineSpec) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": str(self.model), "seed": self.matrix.seed}
        if self.tokenizer is not None:
            kwargs["tokenizer"] = str(self.tokenizer)
        chosen_per_spec = (*LORA_KEYS, *graph.GRAPH_KEYS)
        kwargs.update({k: v for k, v in self.file.engine.model_dump().items() if k not in chosen_per_spec})
        kwargs.update(spec.engine_kwargs())
        kwargs.update(disable_log_stats=False, enable_prefix_caching=False)
        return kwargs

    @property
    def shape(self) -> Shape:
        return shape_of(self.file)

    @property
    def devices_per_engine(self) -> int:
        extra = self.file.engine.model_extra or {}
        return int(extra.get("tensor_parallel_size", 1)) * int(extra.get("pipeline_parallel_size", 1))
