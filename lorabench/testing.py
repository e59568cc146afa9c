"""A stand-in for vLLM's engine whose costs a test sets, so every scenario runs in the quick
loop and a cost put in comes out in its column (ground truth).

It keeps what the scenarios rely on in vLLM, and nothing else:

- a step loop: every running request gets one token a step; a request scheduled in a step
  does its prefill there and gets its first token at the step's end;
- at most ``max_num_seqs`` running requests, with at most ``max_loras`` distinct adapters
  among them; the rest wait, first come first served, as vLLM's scheduler does;
- an LRU CPU cache of ``max_cpu_loras`` adapters (``add_lora``, ``list_loras``,
  ``remove_lora``) and LRU device slots for ``max_loras`` of them;
- the engine core's timestamps (queued, scheduled, first and last token) on the
  monotonic clock, streamed or final-only outputs, aborts, and death on demand.

A step lasts ``prefill_ms_per_token`` for each prompt token it schedules, plus
``disk_load_ms`` for each adapter it reads from disk and ``slot_load_ms`` for each it
moves into a slot, plus ``decode_ms_per_step`` and ``lora_ms_per_adapter`` for each
distinct adapter in the step. Use it with ``pytester.runpytest(plugins=[StandIn(costs)])``,
or from a conftest that returns a ``StandIn`` from ``pytest_lorabench_backend``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorabench.adapters import Adapter
from lorabench.config import BenchConfig, EngineSpec
from lorabench.device import Platform
from lorabench.engine import Engine, EngineDied
from lorabench.workload import Prompt

VOCAB_SIZE = 1000


@dataclass(frozen=True)
class Costs:
    """What each thing costs the stand-in, in milliseconds."""

    prefill_ms_per_token: float = 0.02
    decode_ms_per_step: float = 1.0
    lora_ms_per_adapter: float = 0.0
    disk_load_ms: float = 0.0
    slot_load_ms: float = 0.0
    # The sender blocks this long on every request it sends (a client that falls behind).
    send_block_ms: float = 0.0


@dataclass(frozen=True)
class LoraRef:
    lora_name: str
    lora_int_id: int
    lora_path: str


@dataclass(frozen=True)
class Params:
    max_tokens: int
    stream: bool
    greedy: bool


@dataclass
class Metrics:
    queued_ts: float
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0


@dataclass
class Completion:
    token_ids: list[int]


@dataclass
class Output:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[Completion]
    finished: bool
    metrics: Metrics


@dataclass(eq=False)
class _Request:
    id: str
    prompt: list[int]
    params: Params
    lora: LoraRef | None
    seed: bytes
    metrics: Metrics
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    tokens: list[int] = field(default_factory=list)
    finished: bool = False


class StandInLLM:
    """The part of vLLM's ``AsyncLLM`` that lorabench's ``Engine`` calls."""

    def __init__(self, costs: Costs, spec: EngineSpec, max_num_seqs: int, weights: Mapping[str, str]) -> None:
        self.costs, self.max_num_seqs, self.weights = costs, max_num_seqs, weights
        self.max_loras = spec.max_loras or 0
        self.max_cpu_loras = spec.max_cpu_loras or 0
        self.cpu: OrderedDict[int, LoraRef] = OrderedDict()
        self.slots: OrderedDict[int, None] = OrderedDict()
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.dead: str | None = None
        self.die_after: int | None = None
        self.sent = 0
        self._wake = asyncio.Event()
        self._loop: asyncio.Task | None = None

    async def add_lora(self, lora: LoraRef) -> bool:
        await asyncio.sleep(self.costs.disk_load_ms / 1000.0)
        self._cache(lora, active=set())
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.slots.pop(lora_id, None)
        return self.cpu.pop(lora_id, None) is not None

    async def list_loras(self) -> set[int]:
        return set(self.cpu)

    def kill(self, reason: str) -> None:
        """The engine dies: every request in it, and every one sent later, fails."""
        self.dead = reason
        for request in [*self.waiting, *self.running]:
            request.queue.put_nowait(EngineDied(reason))
        self.waiting.clear()
        self.running.clear()

    def shutdown(self) -> None:
        if self._loop is not None:
            self._loop.cancel()

    async def generate(
        self, prompt: list[int], params: Params, request_id: str, lora_request: LoraRef | None = None
    ) -> AsyncIterator[Output]:
        if self.dead:
            raise EngineDied(self.dead)
        if self.costs.send_block_ms:
            time.sleep(self.costs.send_block_ms / 1000.0)
        weights = self.weights.get(lora_request.lora_name, "") if lora_request else "base"
        seed = hashlib.sha256(f"{lora_request and lora_request.lora_name}|{weights}|{prompt}".encode()).digest()
        request = _Request(request_id, prompt, params, lora_request, seed, Metrics(time.monotonic()))
        self.waiting.append(request)
        self.sent += 1
        if self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._steps())
        self._wake.set()
        if self.die_after is not None and self.sent >= self.die_after:
            self.kill(f"the stand-in engine died after {self.sent} requests, as the test asked")
        try:
            while True:
                item = await request.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            if not request.finished:  # a cancelled stream aborts its request, as in vLLM
                if request in self.waiting:
                    self.waiting.remove(request)
                if request in self.running:
                    self.running.remove(request)

    async def _steps(self) -> None:
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            cost = self._schedule()
            in_step = {r.lora.lora_int_id for r in self.running if r.lora}
            cost += self.costs.decode_ms_per_step + self.costs.lora_ms_per_adapter * len(in_step)
            await asyncio.sleep(cost / 1000.0)
            self._emit(time.monotonic())

    def _schedule(self) -> float:
        """Admit waiting requests, first come first served; the milliseconds their prefill and
        adapter moves add to this step."""
        cost, now = 0.0, time.monotonic()
        active = {r.lora.lora_int_id for r in self.running if r.lora}
        for request in list(self.waiting):
            if len(self.running) >= self.max_num_seqs:
                break
            lora = request.lora
            if lora is not None and lora.lora_int_id not in active and len(active) >= self.max_loras:
                continue
            self.waiting.remove(request)
            self.running.append(request)
            request.metrics.scheduled_ts = now
            cost += self.costs.prefill_ms_per_token * len(request.prompt)
            if lora is not None:
                cost += self._to_slot(lora, active)
                active.add(lora.lora_int_id)
        return cost

    def _to_slot(self, lora: LoraRef, active: set[int]) -> float:
        cost = 0.0 if lora.lora_int_id in self.cpu else self.costs.disk_load_ms
        self._cache(lora, active)
        if lora.lora_int_id not in self.slots:
            cost += self.costs.slot_load_ms
            if len(self.slots) >= self.max_loras:
                del self.slots[next(i for i in self.slots if i not in active)]
        self.slots[lora.lora_int_id] = None
        self.slots.move_to_end(lora.lora_int_id)
        return cost

    def _cache(self, lora: LoraRef, active: set[int]) -> None:
        self.cpu[lora.lora_int_id] = lora
        self.cpu.move_to_end(lora.lora_int_id)
        while len(self.cpu) > self.max_cpu_loras:
            victim = next(i for i in self.cpu if i not in active and i != lora.lora_int_id)
            del self.cpu[victim]
            self.slots.pop(victim, None)

    def _emit(self, now: float) -> None:
        for request in list(self.running):
            index = len(request.tokens)
            digest = hashlib.sha256(request.seed + index.to_bytes(4, "little")).digest()
            request.tokens.append(int.from_bytes(digest[:4], "little") % VOCAB_SIZE)
            if index == 0:
                request.metrics.first_token_ts = now
            request.metrics.last_token_ts = now
            request.finished = len(request.tokens) >= request.params.max_tokens
            if request.finished:
                self.running.remove(request)
            if request.params.stream or request.finished:
                tokens = request.tokens[-1:] if request.params.stream else list(request.tokens)
                output = Output(request.id, request.prompt, [Completion(tokens)], request.finished, request.metrics)
                request.queue.put_nowait(output)


class StandInEngine(Engine):
    """lorabench's ``Engine`` with the stand-in in place of vLLM: everything lorabench does
    around the engine (adapters, batches, streams, shutdown) runs for real."""

    def __init__(self, config: BenchConfig, spec: EngineSpec, device_type: str, log_path: Path | None, **how: Any):
        super().__init__(config, spec, device_type, log_path)
        self.costs: Costs = how["costs"]
        self.weights: dict[str, str] = how["weights"]
        self.die_after: int | None = how.get("die_after")
        self.environ_seen: dict[str, str] = {}

    async def _build(self) -> StandInLLM:
        self.environ_seen = dict(os.environ)
        max_num_seqs = int((self.config.file.engine.model_extra or {}).get("max_num_seqs", 256))
        llm = StandInLLM(self.costs, self.spec, max_num_seqs, self.weights)
        llm.die_after = self.die_after
        return llm

    def _kv_cache_tokens(self) -> int:
        return 4096

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def check_alive(self) -> None:
        if self.llm is not None and self.llm.dead:
            raise EngineDied(self.llm.dead)

    def lora_request(self, adapter: Adapter | None) -> LoraRef | None:
        return None if adapter is None else LoraRef(adapter.name, self._lora_ids[adapter.name], str(adapter.path))

    def sampling_params(self, max_tokens: int, *, stream: bool = False, greedy: bool = False) -> Params:
        return Params(max_tokens, stream, greedy)

    def prompt_input(self, prompt: Prompt) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else [3 + b for b in prompt.encode()]


class StandIn:
    """A lorabench backend (see ``lorabench.hooks``) that builds stand-in engines.

    ``altered`` maps a build index to adapters whose weights differ on that build (their
    greedy outputs change); ``die_after`` kills each engine at its N-th request.
    """

    checks_vllm_args = False

    def __init__(
        self, costs: Costs = Costs(), *, altered: Mapping[int, Iterable[str]] = {}, die_after: int | None = None
    ) -> None:
        self.costs, self.die_after = costs, die_after
        self.altered = {build: set(names) for build, names in altered.items()}
        self.engines: list[StandInEngine] = []

    def pytest_lorabench_backend(self, config: Any) -> StandIn:
        return self

    def platform(self) -> Platform:
        return Platform("cpu", "lorabench stand-in engine")

    def engine(self, config: BenchConfig, spec: EngineSpec, device_type: str, log_path: Path | None) -> Engine:
        weights = {a.name: "altered" if a.name in self.altered.get(spec.build, ()) else "" for a in config.adapters}
        engine = StandInEngine(
            config, spec, device_type, log_path, costs=self.costs, weights=weights, die_after=self.die_after
        )
        self.engines.append(engine)
        return engine


def write_config(folder: Path, *, adapters: int = 4, **sections: Any) -> Path:
    """A config for the stand-in in ``folder`` (a model folder, ``adapters`` adapter folders
    of rank 8, prompts), needing no model weights; ``sections`` replace or update its parts."""
    model = folder / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 512, "vocab_size": VOCAB_SIZE}))
    (model / "model.safetensors").write_bytes(b"")
    entries = []
    for i in range(adapters):
        path = folder / "adapters" / f"a{i}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
        (path / "adapter_model.safetensors").write_bytes(b"")
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
