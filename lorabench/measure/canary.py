"""LoRA correctness canaries: what each check sends. Greedy answers of a few tokens, one check
a class of real multi-LoRA bug (docs/canaries.md), each judged against a reference the same
session gives (``lorabench.measure.canary_judge``):

- **no_effect**: the base model and each adapter answer each prompt alone, on the same build;
- **base_changed**: the base model answers each prompt alone, on a LoRA build and on the
  lora-off build of the same configuration (two cases; the later one judges);
- **batch_invariance**: the base model and each adapter answer their prompt alone; then all of
  them at once in one batch, base requests and adapters mixed; then the same batch with every
  request on the base model (the control: an engine whose answers change in a batch with no
  LoRA at all cannot blame LoRA);
- **swap_eviction**: one adapter answers each prompt twice (the second time is the control:
  answers that change with nothing evicted cannot tell), then other adapters are served until
  it has left its device slot, and the CPU cache where the config's adapters outnumber
  ``max_cpu_loras``, then it answers again.

Prompts are synthetic, ``PROMPT_LEN`` tokens (twice the digest probe's, so a prefill other
than the probe's is covered), from the run's seed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorabench.config.target import INPROCESS
from lorabench.load.workload import synthetic_prompt
from lorabench.measure.canary_records import Asker

if TYPE_CHECKING:
    from lorabench.load.adapters import Adapter
    from lorabench.targets.engine import Engine

NO_EFFECT, BASE_CHANGED, BATCH, SWAP = "no_effect", "base_changed", "batch_invariance", "swap_eviction"
# Adapters the no_effect and batch_invariance checks use, at most.
CANARY_ADAPTERS = 4
PROMPTS = 2
PROMPT_LEN = 32
PROMPT_SEED = 20261201
BASE_STEP, ALONE, BATCHED, CONTROL = "base", "alone", "batched", "control"
FIRST, REPEAT, EVICTOR, AFTER = "first", "repeat", "evictor", "after"


def canary_prompts(engine: Engine, seed: int) -> list[list[int]]:
    """``PROMPTS`` prompts of ``PROMPT_LEN`` synthetic tokens, from the run's seed."""
    return [synthetic_prompt(i, PROMPT_LEN, engine.vocab_size, PROMPT_SEED + seed) for i in range(PROMPTS)]


def no_effect(ask: Asker, adapters: list[Adapter]) -> None:
    """Each prompt: the base model's answer, then each adapter's, each alone."""
    for k in range(PROMPTS):
        ask.alone(None, k, BASE_STEP)
        for adapter in adapters:
            ask.alone(adapter, k, ALONE)


def base_answers(ask: Asker) -> None:
    """The base model's answer to each prompt, alone."""
    for k in range(PROMPTS):
        ask.alone(None, k, BASE_STEP)


def batch_requests(adapters: list[Adapter]) -> list[tuple[Adapter | None, int]]:
    """The mixed batch: a base request on prompt 0, the adapters on alternate prompts, a base
    request on prompt 1."""
    return [(None, 0), *((a, i % PROMPTS) for i, a in enumerate(adapters)), (None, PROMPTS - 1)]


def batch_invariance(ask: Asker, adapters: list[Adapter]) -> None:
    """Every request of the mixed batch alone, then the batch, then its base-only control."""
    requests = batch_requests(adapters)
    for adapter, k in requests:
        ask.alone(adapter, k, ALONE)
    ask.batch(requests, BATCHED)
    ask.batch([(None, k) for _, k in requests], CONTROL)


def swap_eviction(engine: Engine, ask: Asker, target: Adapter, others: list[Adapter]) -> str:
    """``target``'s first and repeated answers, ``others`` served in waves of ``max_loras``
    (one token each) to evict it, then its answers again; what evicted it, as a finding says it."""
    for step in (FIRST, REPEAT):
        for k in range(PROMPTS):
            ask.alone(target, k, step)
    wave = engine.spec.max_loras or 1
    for i in range(0, len(others), wave):
        ask.batch([(o, 0) for o in others[i : i + wave]], EVICTOR, output_len=1)
    where = f"{len(others)} other adapters took its device slot"
    if engine.target == INPROCESS:
        # vLLM lists its CPU cache (list_loras), not its slots: those follow from its LRU.
        cached = target.name in engine.cached_adapters()
        where += " (it stayed in the CPU cache)" if cached else " and pushed it out of the CPU cache"
    for k in range(PROMPTS):
        ask.alone(target, k, AFTER)
    return where
