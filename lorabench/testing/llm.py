"""The simulated engine core: vLLM's ``AsyncLLM`` as far as lorabench's ``Engine`` calls it,
with a scheduler, adapter caches and costs the test sets (see ``lorabench.testing``)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace

from lorabench.config import EngineSpec
from lorabench.engine import EngineDied

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
        # As vLLM's front end reports its configuration: eager, or compiled with piecewise graphs.
        eager = bool(spec.enforce_eager)
        self.vllm_config = SimpleNamespace(
            compilation_config=SimpleNamespace(
                mode="NONE" if eager else "VLLM_COMPILE", cudagraph_mode="NONE" if eager else "PIECEWISE"
            )
        )
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
