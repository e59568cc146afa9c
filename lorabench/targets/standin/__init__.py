"""A stand-in for vLLM's engine whose costs a test sets, so every scenario runs in the quick
loop and a cost put in comes out in its column (ground truth).

It keeps what the scenarios rely on in vLLM, and nothing else:

- a step loop: every running request gets one token a step; a request scheduled in a step
  does its prefill there and gets its first token at the step's end;
- at most ``max_num_seqs`` running requests, with at most ``max_loras`` distinct adapters
  among them; the rest wait, first come first served, as vLLM's scheduler does, those
  skipped for a LoRA slot counted as deferred (``lorabench.targets.standin.scheduler``);
- a KV cache of ``Costs.kv_blocks`` blocks of 16 tokens: a request waits until its blocks
  fit, and a running request that needs a block none has free preempts the latest admitted;
- an LRU CPU cache of ``max_cpu_loras`` adapters (``add_lora``, ``list_loras``,
  ``remove_lora``) and LRU device slots for ``max_loras`` of them; an ``add_lora`` runs
  between two steps and holds the next back, as vLLM's engine core does, for its
  ``disk_load_ms`` (none when cached) and, as vLLM activates what it adds, ``slot_load_ms``;
- with ``enable_prefix_caching``, a prefix cache keyed as vLLM 0.32 keys its KV blocks
  (``lorabench.targets.standin.prefix_cache``): a cached prefix is not prefilled again, and
  KV another adapter computed changes the answer of a request that reuses it;
- the engine core's timestamps (queued, scheduled, first and last token) on its event
  loop's clock (monotonic, or virtual: ``StandIn(virtual_clock=True)``), streamed or
  final-only outputs, aborts, and death on demand.

A step lasts ``prefill_ms_per_token`` for each prompt token it schedules, plus
``disk_load_ms`` for each adapter it reads from disk and ``slot_load_ms`` for each it
moves into a slot, plus ``decode_ms_per_step`` and ``lora_ms_per_adapter`` for each
distinct adapter in the step. Steps keep to their schedule: the event loop wakes a sleep
up to a millisecond late, and the next step makes that up, so a batch of many steps is
late by about a millisecond in all, not one per step. Use it with ``pytester.runpytest(plugins=[StandIn(costs)])``,
or from a conftest that returns a ``StandIn`` from ``pytest_lorabench_backend``.
"""

from lorabench.targets.standin.backend import StandIn, StandInEngine, write_config
from lorabench.targets.standin.costs import Costs
from lorabench.targets.standin.llm import StandInLLM

__all__ = ["Costs", "StandIn", "StandInEngine", "StandInLLM", "write_config"]
