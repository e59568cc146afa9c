"""The stand-in's scheduler step and the stats it reports, as vLLM 0.32's v1 scheduler
(``v1/core/sched/scheduler.py``) and front end (``v1/engine/output_processor.py``) make
what lorabench's columns read:

- the KV cache is ``blocks`` blocks of ``block_size`` tokens; a request holds the blocks its
  prompt and generated tokens fill. Running requests are scheduled first, in order, each
  needing blocks for its next token; when none is free the latest-admitted running request
  is preempted (its blocks freed, back to the front of the waiting queue, its prompt and
  tokens recomputed when admitted again), and a step that preempted admits no waiting request;
- waiting requests are admitted first come first served while ``max_num_seqs`` allows; one
  whose adapter would exceed ``max_loras`` distinct adapters in the step is skipped and
  counted as deferred until admitted; one whose blocks do not fit stops the admissions;
- ``SchedulerStats.num_waiting_reqs`` leaves the deferred requests out and
  ``num_skipped_waiting_reqs`` has them; ``kv_cache_usage`` is used blocks over all blocks;
- ``running_lora_adapters`` / ``waiting_lora_adapters`` are the front end's: a request's
  events reach it with its next output, so an adapter gets an entry (in both, keyed by name)
  once one of its requests has had an output, and its requests count as running until they
  finish; the waiting counts stay 0;
- a preemption is counted (``num_preempted_reqs``) in the step where the preempted request
  has its next output, as vLLM's front end reads it from the events that output carries.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

from lorabench.targets import clock

if TYPE_CHECKING:
    from collections import deque

    from lorabench.targets.standin.prefix_cache import Owner, PrefixCache

# vLLM's default block size on GPUs (its CPU backend defaults to 128).
BLOCK_SIZE = 16
# The stand-in's KV cache by default: 256 blocks, 4096 tokens, more than the tests' requests need.
KV_BLOCKS = 256


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
    prompt_logprobs: int | None = None
    logprobs: int | None = None


@dataclass
class Metrics:
    queued_ts: float
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0


@dataclass(eq=False)
class Request:
    """A request in the stand-in engine, with what vLLM's front end keeps of it (``RequestState``)."""

    id: str
    prompt: list[int]
    params: Params
    lora: LoraRef | None
    seed: bytes
    metrics: Metrics
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    tokens: list[int] = field(default_factory=list)
    finished: bool = False
    preemptions: int = 0  # preemptions not yet reported (with the request's next output)
    # Prefix caching (lorabench.targets.standin.prefix_cache): whose KV the request computes, its
    # prompt's block hashes, and whose cached KV it reused where that was not its own.
    owner: Owner | None = None
    hashes: list[bytes] = field(default_factory=list)
    reused_from: Owner | None = None
    # Of its prompt, found cached when first scheduled (vLLM's RequestOutput.num_cached_tokens).
    cached_tokens: int | None = None
    # The models its sampled tokens' and its prompt's log probabilities come from
    # (lorabench.targets.standin.logprobs): the same one, unless a planted bug says otherwise.
    model: str = ""
    prompt_model: str = ""

    @property
    def lora_name(self) -> str | None:
        return self.lora.lora_name if self.lora else None

    @property
    def is_prefilling(self) -> bool:
        """No output yet."""
        return not self.tokens


class BlockPool:
    """The KV cache in blocks, and the blocks each request holds."""

    def __init__(self, blocks: int, block_size: int = BLOCK_SIZE) -> None:
        self.total, self.block_size = blocks, block_size
        self.held: dict[Request, int] = {}
        self.used = 0

    @property
    def usage(self) -> float:
        return self.used / self.total

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def allocate(self, request: Request, tokens: int) -> bool:
        """Blocks enough for ``tokens`` of ``request``; False, and nothing taken, if they do not fit."""
        need = self.blocks_for(tokens) - self.held.get(request, 0)
        if need > self.total - self.used:
            return False
        if need > 0:
            self.held[request] = self.held.get(request, 0) + need
            self.used += need
        return True

    def free(self, request: Request) -> None:
        self.used -= self.held.pop(request, 0)


class Slots(Protocol):
    """The adapter caches a scheduled request's adapter is moved into (``adapter_cache``)."""

    def to_slot(self, lora: LoraRef, active: set[int]) -> float: ...


class StandInLLM(Protocol):
    """What the scheduler reads and changes of the stand-in engine (``lorabench.targets.standin.llm``),
    named here so that the scheduler does not import the engine that imports it."""

    prefill_ms_per_token: float
    kv: BlockPool
    max_loras: int
    max_num_seqs: int
    requests: dict[str, Request]
    running: list[Request]
    waiting: deque[Request]
    deferred: set[Request]
    prefix_cache: PrefixCache | None
    adapters: Slots


def kv_tokens(request: Request) -> int:
    """The tokens whose KV a request needs this step: its prompt and the tokens it generated."""
    return len(request.prompt) + len(request.tokens)


def schedule(llm: StandInLLM) -> tuple[float, int]:
    """One step's scheduling: the milliseconds its prefills (and recomputes) and adapter moves
    add to the step, and the prompt tokens of the requests it admits for the first time."""
    if _schedule_running(llm):
        return 0.0, 0
    active = {r.lora.lora_int_id for r in llm.running if r.lora}
    return _admit_waiting(llm, active, clock.now())


def _schedule_running(llm: StandInLLM) -> bool:
    """Blocks for every running request's next token, in order, preempting the latest-admitted
    running request while they do not fit; True if any was preempted."""
    preempted = False
    for request in list(llm.running):
        if request not in llm.running:
            break  # preempted for an earlier one, as everything after it was
        while not llm.kv.allocate(request, kv_tokens(request)):
            victim = llm.running.pop()
            llm.kv.free(victim)
            llm.waiting.appendleft(victim)
            victim.preemptions += 1
            preempted = True
            if victim is request:
                return True
    return preempted


def _admit_waiting(llm: StandInLLM, active: set[int], now: float) -> tuple[float, int]:
    cost, prompt_tokens = 0.0, 0
    for request in list(llm.waiting):
        if len(llm.running) >= llm.max_num_seqs:
            break
        lora = request.lora
        if lora is not None and lora.lora_int_id not in active and len(active) >= llm.max_loras:
            llm.deferred.add(request)
            continue
        if not llm.kv.allocate(request, kv_tokens(request)):
            break
        llm.waiting.remove(request)
        llm.deferred.discard(request)
        llm.running.append(request)
        request.metrics.scheduled_ts = request.metrics.scheduled_ts or now
        cached = 0 if request.tokens else _reuse(llm, request)
        if not request.tokens and llm.prefix_cache is not None:
            # vLLM caches a block as it allocates it (KVCacheManager.allocate_slots), so the
            # next request admitted in this same step already finds it.
            llm.prefix_cache.insert(request.hashes, request.owner, llm.kv.total - llm.kv.used)
        prompt_tokens += 0 if request.tokens else len(request.prompt)
        cost += llm.prefill_ms_per_token * (kv_tokens(request) - cached)
        if lora is not None:
            cost += llm.adapters.to_slot(lora, active)
            active.add(lora.lora_int_id)
    return cost, prompt_tokens


def _reuse(llm: StandInLLM, request: Request) -> int:
    """The prompt tokens a request admitted before its first output finds cached. KV another
    adapter (or other weights) computed makes its answer another: its tokens' seed takes the
    owner in."""
    cache = llm.prefix_cache
    if cache is None:
        return 0
    owners = cache.lookup(request.hashes, len(request.prompt))
    foreign = next((owner for owner in owners if owner != request.owner), None)
    if foreign is not None and request.reused_from is None:
        request.reused_from = foreign
        request.seed = hashlib.sha256(request.seed + repr(foreign).encode()).digest()
    hits = len(owners) * cache.block_size
    if request.cached_tokens is None:
        request.cached_tokens = hits
        llm.prefix_queries += len(request.prompt)
        llm.prefix_hits += hits
    return hits


def stats(llm: StandInLLM, prompt_tokens: int, generated: int, preempted: int) -> tuple[Any, Any]:
    """The step's ``SchedulerStats`` and ``IterationStats`` as vLLM's front end hands them to its
    stat loggers (see the module's docstring for what each counts)."""
    with_output = [r for r in llm.requests.values() if r.lora and r.tokens]
    running = Counter(r.lora.lora_name for r in with_output)
    scheduler = SimpleNamespace(
        kv_cache_usage=llm.kv.usage,
        num_running_reqs=len(llm.running),
        num_waiting_reqs=len(llm.waiting) - len(llm.deferred),
        num_skipped_waiting_reqs=len(llm.deferred),
        running_lora_adapters=dict(running),
        waiting_lora_adapters=dict.fromkeys(running, 0),
        prefix_cache_stats=SimpleNamespace(queries=llm.prefix_queries, hits=llm.prefix_hits),
    )
    llm.prefix_queries = llm.prefix_hits = 0
    iteration = SimpleNamespace(
        num_preempted_reqs=preempted, num_prompt_tokens=prompt_tokens, num_generation_tokens=generated
    )
    return scheduler, iteration
