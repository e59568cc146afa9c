"""From a configuration to what runs: engine configurations, online cases, vLLM's arguments.

An engine configuration is one combination of the LoRA knobs (each may be a list in the
file); the plugin builds each one ``matrix.builds`` times, and one build serves every
scenario that needs its configuration.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorabench.config.schema import LORA_KEYS, PREFIX_CACHING, ConfigFile, Matrix
from lorabench.config.variants import variant_kwargs
from lorabench.load.adapters import Adapter
from lorabench.load.workload import Shape
from lorabench.results import graph
from lorabench.results.naming import engine_id, engine_name


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
    enable_prefix_caching: bool = False
    # A variant build (lorabench.config.variants): "" for the configuration's own.
    engine_variant: str = ""
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
            self.enable_prefix_caching,
            self.engine_variant,
        )

    @property
    def id(self) -> str:
        return engine_id(self.name, self.build)

    def engine_kwargs(self) -> dict[str, Any]:
        """vLLM's arguments that make this configuration what it is."""
        kwargs = {
            **graph.engine_kwargs(self.enforce_eager, self.graph_config),
            PREFIX_CACHING: self.enable_prefix_caching,
        }
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
    m = file.matrix
    return Shape(
        skew_alpha=m.skew_alpha,
        base_share=m.mixed_base_share,
        prefix_len=m.shared_prefix_len,
        prefix_share=m.shared_prefix_share,
    )


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def graph_modes(file: ConfigFile) -> list[tuple[bool | None, str | None]]:
    """Every combination of the graph-mode settings' lists, as (enforce_eager, graph_config)."""
    eager, compilation, additional = (as_list(getattr(file.engine, key)) for key in graph.GRAPH_KEYS)
    return [
        (e, graph.canonical({"compilation_config": c, "additional_config": a}))
        for e, c, a in itertools.product(eager, compilation, additional)
    ]


def engine_specs(
    file: ConfigFile, *, with_lora_off: bool, builds: int = 1, variants: tuple[str, ...] = ()
) -> list[EngineSpec]:
    """The cross product of the graph modes, prefix caching and the LoRA knobs (and
    ``lora-off`` first in each mode if asked), ``builds`` times over, build-major: a
    configuration's builds are spread over the run. Then each of ``variants`` of the first LoRA
    configuration, built once (``lorabench.config.variants``)."""
    configurations = []
    lists = [as_list(getattr(file.engine, key)) for key in LORA_KEYS]
    caching = as_list(file.engine.enable_prefix_caching)
    for (eager, settings), cached in itertools.product(graph_modes(file), caching):
        mode = {"enforce_eager": eager, "graph_config": settings, PREFIX_CACHING: cached}
        if with_lora_off:
            configurations.append(EngineSpec(False, **mode))
        for loras, rank, cpu in itertools.product(*lists):
            configurations.append(EngineSpec(True, loras, rank, cpu if cpu is not None else loras, **mode))
    specs = [EngineSpec(**{**s.__dict__, "build": b}) for b in range(builds) for s in configurations]
    first = next((s for s in specs if s.enable_lora), None)
    return specs + [EngineSpec(**{**first.__dict__, "engine_variant": v}) for v in variants if first is not None]


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
        chosen_per_spec = (*LORA_KEYS, *graph.GRAPH_KEYS, PREFIX_CACHING)
        kwargs.update({k: v for k, v in self.file.engine.model_dump().items() if k not in chosen_per_spec})
        kwargs.update(spec.engine_kwargs())
        kwargs.update(variant_kwargs(spec.engine_variant, kwargs))
        kwargs.update(disable_log_stats=False)
        return kwargs

    @property
    def shape(self) -> Shape:
        return shape_of(self.file)

    @property
    def devices_per_engine(self) -> int:
        extra = self.file.engine.model_extra or {}
        return int(extra.get("tensor_parallel_size", 1)) * int(extra.get("pipeline_parallel_size", 1))
