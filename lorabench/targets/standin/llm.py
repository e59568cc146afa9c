"""The simulated engine core: vLLM's ``AsyncLLM`` as far as lorabench's ``Engine`` calls it,
with a scheduler, adapter caches and costs the test sets (see ``lorabench.targets.standin``), and
the stat loggers vLLM's front end calls after each step, given what the stand-in models."""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from lorabench.config import EngineSpec
from lorabench.config.variants import CHUNK_TOKENS, CHUNKED, NGRAM, SPEC_NGRAM
from lorabench.targets import clock
from lorabench.targets.failures import EngineDied
from lorabench.targets.standin import logprobs, planted
from lorabench.targets.standin.adapter_cache import AdapterCache, adapter_files
from lorabench.targets.standin.costs import Costs
from lorabench.targets.standin.prefix_cache import Owner, PrefixCache
from lorabench.targets.standin.scheduler import (
    BLOCK_SIZE,
    BlockPool,
    LoraRef,
    Metrics,
    Params,
    Request,
    schedule,
    stats,
)
from lorabench.targets.standin.virtual_clock import block
from lorabench.targets.vllm_worker import DISK_LOADS

VOCAB_SIZE = 1000
# The steps whose stats the stand-in keeps, the last ones: enough for a test, and few enough
# that they die young. A real engine's client keeps none; 10,000 steps' (60,000 objects) reached
# the collector's oldest generation and its passes blocked a replay's loop for 15 ms and more.
STATS_KEPT = 500
# How late a step's end may be and still be made up by the next step: the event loop's rounding.
LATE_MADE_UP_S = 0.001


@dataclass
class Completion:
    token_ids: list[int]
    # As vLLM's: one entry a token of ``token_ids``, where the request asked for them.
    logprobs: list[dict[int, logprobs.Logprob]] | None = None


@dataclass
class Output:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[Completion]
    finished: bool
    metrics: Metrics
    num_cached_tokens: int = 0
    # As vLLM's: one entry a prompt position (the first None) where the request asked for them.
    prompt_logprobs: list[dict[int, logprobs.Logprob] | None] | None = None


class StandInLLM:
    """The part of vLLM's ``AsyncLLM`` that lorabench's ``Engine`` calls."""

    def __init__(
        self,
        costs: Costs,
        spec: EngineSpec,
        max_num_seqs: int,
        weights: Mapping[str, str],
        stat_loggers: Sequence[Callable[..., Any]] = (),
    ) -> None:
        self.costs, self.max_num_seqs, self.weights = costs, max_num_seqs, weights
        self.max_loras, self.max_lora_rank = spec.max_loras or 0, spec.max_lora_rank or 0
        self.lora_enabled = bool(spec.enable_lora)
        # A variant build (lorabench.config.variants), and the draft tokens an n-gram one proposed.
        self.variant, self.drafted = spec.engine_variant, 0
        self.adapters = AdapterCache(costs, self.max_loras, spec.max_cpu_loras or 0)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.deferred: set[Request] = set()  # waiting requests skipped for a LoRA slot
        self.kv = BlockPool(costs.kv_blocks)
        keyed = not costs.blocks_keyed_without_adapter
        cache = PrefixCache(costs.kv_blocks, BLOCK_SIZE, keyed_by_adapter=keyed)
        self.prefix_cache = cache if spec.enable_prefix_caching else None
        # The requests in the engine by id, as vLLM's front end holds them (output_processor.request_states).
        self.requests: dict[str, Request] = {}
        self.output_processor = SimpleNamespace(request_states=self.requests)
        self.dead: str | None = None
        self.die_after: int | None = None
        self.sent = 0
        # As vLLM's front end reports its configuration: eager, or compiled with piecewise graphs.
        eager = bool(spec.enforce_eager)
        # ... and its scheduler's token budget a step: the chunked variant's, else vLLM's in-process CPU default.
        budget = CHUNK_TOKENS if self.variant == CHUNKED else 2048
        self.vllm_config = SimpleNamespace(
            compilation_config=SimpleNamespace(
                mode="NONE" if eager else "VLLM_COMPILE", cudagraph_mode="NONE" if eager else "PIECEWISE"
            ),
            scheduler_config=SimpleNamespace(enable_chunked_prefill=True, max_num_batched_tokens=budget),
        )
        self._wake = asyncio.Event()
        # Held by a step and by a load from disk: one at a time, as in vLLM's engine core.
        self._core = asyncio.Lock()
        self._loop: asyncio.Task | None = None
        # Stat loggers made and called as vLLM's front end does, and the (scheduler, iteration)
        # stats of the last steps they were given: the ground truth of a timeline.
        self.loggers = [factory(self.vllm_config, 0) for factory in stat_loggers]
        for logger in self.loggers:
            logger.log_engine_initialized()
        self.stats_sent: deque[tuple[SimpleNamespace, SimpleNamespace]] = deque(maxlen=STATS_KEPT)
        # Prompt tokens queried and found cached by the requests first scheduled since the last
        # step's stats (vLLM's PrefixCacheStats queries and hits).
        self.prefix_queries = self.prefix_hits = 0

    @property
    def prefill_ms_per_token(self) -> float:
        """What the scheduler charges a prefilled token (``Costs.prefill_ms_per_token``)."""
        return self.costs.prefill_ms_per_token

    async def add_lora(self, lora: LoraRef, load_inplace: bool = False) -> bool:
        """Between two steps, holding the next one back (vLLM's engine core runs a load in its
        busy loop, so a load while serving stalls every request): read from disk unless cached,
        then into a slot, as vLLM's LRU worker manager activates every adapter it adds. In
        place, the weights are read again (they change the adapter's answers), as from disk."""
        if load_inplace:
            self.weights = {**self.weights, lora.lora_name: f"{self.weights.get(lora.lora_name, '')}+reloaded"}
            self.adapters.forget(lora.lora_int_id)
        async with self._core:
            await asyncio.sleep(self.adapters.to_slot(lora, self._running_adapters()) / 1000.0)
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        return self.adapters.remove(lora_id)

    async def list_loras(self) -> set[int]:
        return set(self.adapters.cpu)

    def draft_tokens(self) -> int:
        """As vLLM's ``vllm:spec_decode_num_draft_tokens`` counts them (``Engine.draft_tokens``)."""
        return self.drafted

    def get_num_unfinished_requests(self) -> int:
        """Waiting and running requests, aborted ones not yet dropped among them."""
        return len(self.waiting) + len(self.running)

    def kill(self, reason: str) -> None:
        """The engine dies: every request in it, and every one sent later, fails."""
        self.dead = reason
        for request in [*self.waiting, *self.running]:
            request.queue.put_nowait(EngineDied(reason))
        self.waiting.clear()
        self.running.clear()
        self.requests.clear()

    def shutdown(self) -> None:
        if self._loop is not None:
            self._loop.cancel()

    async def generate(
        self, prompt: list[int] | dict, params: Params, request_id: str, lora_request: LoraRef | None = None
    ) -> AsyncIterator[Output]:
        """A request; ``prompt`` as vLLM's ``TokensPrompt`` (a dict, with a ``cache_salt`` or not) or its ids."""
        if self.dead:
            raise EngineDied(self.dead)
        if self.costs.send_block_ms:
            block(self.costs.send_block_ms / 1000.0)
        salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
        prompt = list(prompt["prompt_token_ids"]) if isinstance(prompt, dict) else prompt
        of, rank = adapter_files(lora_request.lora_path) if lora_request else (None, None)
        name = lora_request and (of or lora_request.lora_name)
        weights = self.weights.get(name, "") if lora_request else "base"
        padded = rank is not None and rank < self.max_lora_rank
        seen, seen_weights = planted.seen_as(self.costs, self.lora_enabled, lora_request, name, weights, prompt, params)
        seen_weights += planted.padding(self.costs, padded)
        budget = self.vllm_config.scheduler_config.max_num_batched_tokens
        seen_weights += planted.variant(self.costs, self.variant, budget, lora_request, prompt)
        if self.variant == SPEC_NGRAM:  # a draft of the most tokens after each sampled one
            self.drafted += int(NGRAM["num_speculative_tokens"]) * (params.max_tokens - 1)
        model = f"{seen}|{seen_weights}"
        seed = hashlib.sha256(f"{model}|{prompt}".encode()).digest()
        if self.kv.blocks_for(len(prompt) + params.max_tokens) > self.kv.total:
            raise ValueError(f"{len(prompt)} + {params.max_tokens} tokens do not fit the stand-in's KV cache")
        request = Request(
            request_id, prompt, params, lora_request, seed, Metrics(clock.now()), owner=Owner(name, weights)
        )
        request.model, request.prompt_model = model, planted.prompt_logprobs_model(self.costs, lora_request, model)
        if self.prefix_cache is not None:
            key = (lora_request.lora_name, lora_request.lora_path) if lora_request else None
            if key and self.costs.blocks_keyed_by_weights:
                key += (weights,)
            request.hashes = self.prefix_cache.hashes(prompt, key, salt)
        self.waiting.append(request)
        self.requests[request_id] = request
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
            # A cancelled stream aborts its request, as in vLLM: dropped at once, or after abort_ms.
            if not request.finished and self.costs.abort_ms:
                asyncio.get_running_loop().call_later(self.costs.abort_ms / 1000.0, self._drop, request)
            elif not request.finished:
                self._drop(request)

    def _drop(self, request: Request) -> None:
        """A request leaves the engine, aborted or finished, and frees its blocks."""
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
        self.deferred.discard(request)
        self.kv.free(request)
        self.requests.pop(request.id, None)

    async def _steps(self) -> None:
        loop = asyncio.get_running_loop()
        due: float | None = None  # when the last step was due to end, on the loop's clock
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                due = None
                continue
            async with self._core:
                cost, prompt_tokens = schedule(self)
                in_step = {r.lora.lora_int_id for r in self.running if r.lora}
                cost += self.costs.decode_ms_per_step + self.costs.lora_ms_per_adapter * len(in_step)
                # Steps keep to their schedule: the loop wakes a sleep up to a millisecond late (its
                # timeout is rounded up to the millisecond), and the next step makes that up, so the
                # rounding does not add up over a batch's steps. A longer stall (a blocked loop, a
                # busy host, a load) is not made up: a step never lasts less than its cost minus LATE_MADE_UP_S.
                now = loop.time()
                start = now if due is None else max(due, now - LATE_MADE_UP_S)
                due = start + cost / 1000.0
                await asyncio.sleep(max(0.0, due - loop.time()))
                generated = len(self.running)
                preempted = self._emit(loop.time())
            if self.loggers:
                self._report(stats(self, prompt_tokens, generated, preempted))

    def _report(self, step: tuple[Any, Any]) -> None:
        """The step's stats to every stat logger, after its outputs, as vLLM's front end does."""
        self.stats_sent.append(step)
        for logger in self.loggers:
            logger.record(scheduler_stats=step[0], iteration_stats=step[1], engine_idx=0)

    async def collective_rpc(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """vLLM's call to a method on every worker; the one worker here has the method
        lorabench's worker extension adds (``lorabench.targets.vllm_worker``) and no other."""
        if method != DISK_LOADS:
            raise AttributeError(f"the stand-in's worker has no method {method!r}")
        return [self.adapters.disk_loads]

    def _running_adapters(self) -> set[int]:
        return {r.lora.lora_int_id for r in self.running if r.lora}

    def _emit(self, now: float) -> int:
        """A token to every running request; the preemptions their outputs report."""
        preempted = 0
        for request in list(self.running):
            preempted, request.preemptions = preempted + request.preemptions, 0
            index = len(request.tokens)
            taint = planted.taint(self.costs, request, self.running, self.adapters)
            digest = hashlib.sha256(request.seed + index.to_bytes(4, "little") + taint).digest()
            request.tokens.append(int.from_bytes(digest[:4], "little") % VOCAB_SIZE)
            if index == 0:
                request.metrics.first_token_ts = now
            request.metrics.last_token_ts = now
            request.finished = len(request.tokens) >= request.params.max_tokens
            if request.finished:
                self._drop(request)
            if request.params.stream or request.finished:
                tokens = request.tokens[-1:] if request.params.stream else list(request.tokens)
                output = Output(
                    request.id,
                    request.prompt,
                    [Completion(tokens, logprobs.of_sampled(request, len(tokens)))],
                    request.finished,
                    request.metrics,
                    request.cached_tokens or 0,
                    logprobs.of_prompt(request) if request.finished else None,
                )
                request.queue.put_nowait(output)
        return preempted
