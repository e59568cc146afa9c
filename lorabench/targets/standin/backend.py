"""The stand-in as lorabench builds it: an ``Engine`` over the simulated core, the backend a
test hands the plugin, and a config that needs no model weights."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy

from lorabench.config import BenchConfig, EngineSpec
from lorabench.host.device import Platform
from lorabench.load.adapters import Adapter
from lorabench.load.workload import Prompt
from lorabench.targets.engine import Engine
from lorabench.targets.failures import EngineDied
from lorabench.targets.standin.costs import Costs
from lorabench.targets.standin.llm import VOCAB_SIZE, LoraRef, Params, StandInLLM
from lorabench.targets.standin.scheduler import BLOCK_SIZE
from lorabench.targets.standin.virtual_clock import VirtualClockLoop

# The module of the stand-in adapters' one LoRA pair, named as PEFT names it.
STANDIN_MODULE = "base_model.model.model.layers.0.self_attn.q_proj"
_WEIGHTS = "adapter_model.safetensors"


class StandInEngine(Engine):
    """lorabench's ``Engine`` with the stand-in in place of vLLM: everything lorabench does
    around the engine (adapters, batches, streams, shutdown) runs for real."""

    def __init__(self, config: BenchConfig, spec: EngineSpec, device_type: str, log_path: Path | None, **how: Any):
        super().__init__(config, spec, device_type, log_path)
        self.costs: Costs = how["costs"]
        self.weights: dict[str, str] = how["weights"]
        self.die_after: int | None = how.get("die_after")
        self.virtual_clock: bool = how.get("virtual_clock", False)
        self.environ_seen: dict[str, str] = {}
        # The stats the stand-in gave its stat loggers (StandInLLM.stats_sent), kept past shutdown.
        self.stats_sent: Sequence[tuple[Any, Any]] = ()

    async def _build(self) -> StandInLLM:
        self.environ_seen = dict(os.environ)
        await asyncio.sleep(self.costs.build_ms / 1000)
        max_num_seqs = int((self.config.file.engine.model_extra or {}).get("max_num_seqs", 256))
        llm = StandInLLM(self.costs, self.spec, max_num_seqs, self.weights, self.timeline.factories())
        llm.die_after = self.die_after
        self.stats_sent = llm.stats_sent
        self._with_load_counter(self.config.llm_kwargs(self.spec))  # counts as the extension in vLLM
        return llm

    def new_loop(self) -> asyncio.AbstractEventLoop:
        return VirtualClockLoop() if self.virtual_clock else super().new_loop()

    def _kv_cache_tokens(self) -> int:
        return self.costs.kv_blocks * BLOCK_SIZE

    async def _shutdown(self) -> None:
        # No sockets to let close first, unlike vLLM's: stop the step loop and go.
        self.llm.shutdown()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    @property
    def block_size(self) -> int:
        return BLOCK_SIZE

    def check_alive(self) -> None:
        if self.llm is not None and self.llm.dead:
            raise EngineDied(self.llm.dead)

    def lora_request(self, adapter: Adapter | None) -> LoraRef | None:
        return None if adapter is None else LoraRef(adapter.name, self._lora_ids[adapter.name], str(adapter.path))

    def sampling_params(
        self,
        max_tokens: int,
        *,
        stream: bool = False,
        greedy: bool = False,
        prompt_logprobs: int | None = None,
        logprobs: int | None = None,
    ) -> Params:
        return Params(max_tokens, stream, greedy, prompt_logprobs, logprobs)

    def reload_in_place(self, adapter: Adapter) -> None:
        """As vLLM's ``load_inplace``: the same name, id and path, the weights read again."""
        self.run(self.llm.add_lora(self.lora_request(adapter), load_inplace=True))

    def prompt_input(self, prompt: Prompt, cache_salt: str | None = None) -> list[int] | dict:
        ids = list(prompt) if isinstance(prompt, list) else [3 + b for b in prompt.encode()]
        return ids if cache_salt is None else {"prompt_token_ids": ids, "cache_salt": cache_salt}


class StandIn:
    """A lorabench backend (see ``lorabench.pytest_plugin.hooks``) that builds stand-in engines.

    ``altered`` maps a build index to adapters whose weights differ on that build (their
    greedy outputs change); ``die_after`` kills each engine at its N-th request;
    ``virtual_clock`` serves on a virtual clock (``lorabench.targets.standin.virtual_clock``): for
    tests of logic, exact and in no real time, never for real sockets or real-time behaviour.
    """

    checks_vllm_args = False

    def __init__(
        self,
        costs: Costs | None = None,
        *,
        altered: Mapping[int, Iterable[str]] | None = None,
        die_after: int | None = None,
        virtual_clock: bool = False,
    ) -> None:
        self.costs, self.die_after, self.virtual_clock = costs or Costs(), die_after, virtual_clock
        self.altered = {build: set(names) for build, names in (altered or {}).items()}
        self.engines: list[StandInEngine] = []

    def pytest_lorabench_backend(self, config: Any) -> StandIn:
        return self

    def platform(self) -> Platform:
        return Platform("cpu", "lorabench stand-in engine")

    def engine(self, config: BenchConfig, spec: EngineSpec, device_type: str, log_path: Path | None) -> Engine:
        weights = {a.name: "altered" if a.name in self.altered.get(spec.build, ()) else "" for a in config.adapters}
        engine = StandInEngine(
            config,
            spec,
            device_type,
            log_path,
            costs=self.costs,
            weights=weights,
            die_after=self.die_after,
            virtual_clock=self.virtual_clock,
        )
        self.engines.append(engine)
        return engine


def write_config(folder: Path, *, adapters: int = 4, ranks: Sequence[int] = (8,), **sections: Any) -> Path:
    """A config for the stand-in in ``folder`` (a model folder, ``adapters`` adapter folders,
    their ranks ``ranks`` in turn, prompts), needing no model weights; ``sections`` replace or
    update its parts.
    Each adapter has one small A and B tensor of its own, which ``lorabench.load.padded`` can
    pad; the stand-in reads none of it."""
    from safetensors.numpy import save_file

    model = folder / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 512, "vocab_size": VOCAB_SIZE}))
    (model / "model.safetensors").write_bytes(b"")
    entries = []
    for i in range(adapters):
        path = folder / "adapters" / f"a{i}"
        path.mkdir(parents=True, exist_ok=True)
        r = ranks[i % len(ranks)]
        (path / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": 2 * r}))
        a, b = (numpy.full(shape, 0.01 * (i + 1), dtype=numpy.float32) for shape in ((r, 4), (4, r)))
        save_file({f"{STANDIN_MODULE}.lora_A.weight": a, f"{STANDIN_MODULE}.lora_B.weight": b}, str(path / _WEIGHTS))
        entries.append({"name": f"a{i}", "path": str(path), "prompt": f"Adapter {i}, answer."})
    (folder / "adapters.json").write_text(json.dumps(entries))
    (folder / "prompts.json").write_text(json.dumps(["Say hello.", "Count to three.", "Name a colour."]))
    data: dict[str, Any] = {
        "model": "model",
        "adapters": "adapters.json",
        "prompts": "prompts.json",
        "results_dir": "results",
        "engine": {"max_loras": 2, "max_lora_rank": 8, "max_cpu_loras": 4, "max_num_seqs": 16},
        "matrix": {"batch_sizes": [2], "workloads": ["distinct"], "output_len": 4, "input_len": 16},
    }
    data["matrix"].update(warmup_rounds=0, rounds=2, builds=1)
    for key, value in sections.items():
        is_update = isinstance(value, dict) and isinstance(data.get(key), dict)
        data[key] = {**data[key], **value} if is_update else value
    path = folder / "stand-in.json"
    path.write_text(json.dumps(data, indent=2))
    return path
