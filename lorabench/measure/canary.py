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
  ``max_cpu_loras``, then it answers again;
- **prompt_logprobs**: the base model and each adapter answer each prompt alone, then again
  asking for the prompt's log probabilities (the base model's pair is the control), then
  teacher-forced on their answers, whose prompt logprobs must be the sampled ones;
- **rank_padding**: a copy of each adapter of a rank below ``max_lora_rank`` answers each
  prompt alone, and so does a copy padded to ``max_lora_rank`` by lorabench
  (``lorabench.load.padded``), which vLLM loads with nothing to pad.

Prompts are synthetic, ``PROMPT_LEN`` tokens (twice the digest probe's, so a prefill other
than the probe's is covered), from the run's seed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from lorabench.config.target import INPROCESS
from lorabench.load.workload import synthetic_prompt
from lorabench.measure.canary_records import BASE, Asker

if TYPE_CHECKING:
    from lorabench.load.adapters import Adapter
    from lorabench.targets.engine import Engine

NO_EFFECT, BASE_CHANGED, BATCH, SWAP = "no_effect", "base_changed", "batch_invariance", "swap_eviction"
PROMPT_LOGPROBS, RANK_PADDING = "prompt_logprobs", "rank_padding"
# Adapters the no_effect and batch_invariance checks use, at most.
CANARY_ADAPTERS = 4
PROMPTS = 2
PROMPT_LEN = 32
PROMPT_SEED = 20261201
BASE_STEP, ALONE, BATCHED, CONTROL = "base", "alone", "batched", "control"
FIRST, REPEAT, EVICTOR, AFTER = "first", "repeat", "evictor", "after"
LOGPROBS, PADDED, FILL = "logprobs", "padded", "fill"
# The prompt_logprobs check's adapters, and the top log probabilities it asks for at each position.
LOGPROBS_ADAPTERS, LOGPROBS_TOP = 2, 1
# Its teacher-forced requests (on the model's own answer; the base model on an adapter's), and the
# top log probabilities it asks for at each sampled token besides the token's own.
FORCED, BASE_FORCED, SAMPLED_TOP = "forced", "base_forced", 0
# How far a teacher-forced logprob may be off the same token's logprob when decoded (the prefill
# and decode paths add in other orders): measured on vLLM 0.32's CPU backend (docs/canaries.md).
LOGPROBS_TOLERANCE = 0.05
# Adapters the rank_padding check pads, at most.
PADDED_ADAPTERS = 2


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


def prompt_logprobs(ask: Asker, adapters: list[Adapter]) -> list[tuple[str, str]]:
    """Each prompt: the base model and each adapter alone (with each sampled token's logprob),
    then again asking for prompt logprobs; then teacher-forced on its own answer (FORCED), and
    the base model teacher-forced on each adapter's answer (BASE_FORCED: what a LoRA left out of
    the prompt-logprobs path gives, and whether the values can tell the adapter from the base
    model at all). A request that raises is the class's other face (a crash, vLLM #29955):
    returned for the verdict as (its adapter, BASE for the base model; a line), and the check
    goes on."""
    raised: list[tuple[str, str]] = []

    def asking(adapter: Adapter | None, k: int, what: str, send: Callable[[], object]) -> None:
        try:
            send()
        except Exception as exc:  # noqa: BLE001 - any error of the engine's is the finding
            name = adapter.name if adapter else "the base model"
            line = f"{name} on prompt {k}{what} with prompt_logprobs={LOGPROBS_TOP} raised {type(exc).__name__}: {exc}"
            raised.append((adapter.name if adapter else BASE, line))

    for k in range(PROMPTS):
        for adapter in (None, *adapters):
            answer = ask.alone(adapter, k, ALONE, logprobs=SAMPLED_TOP)
            asking(adapter, k, "", partial(ask.alone, adapter, k, LOGPROBS, prompt_logprobs=LOGPROBS_TOP))
            own = " teacher-forced on its answer"
            asking(adapter, k, own, partial(ask.forced, adapter, k, answer, FORCED, LOGPROBS_TOP))
            if adapter is not None:
                on = f" teacher-forced on {adapter.name}'s answer"
                asking(None, k, on, partial(ask.forced, None, k, answer, BASE_FORCED, LOGPROBS_TOP))
    return raised


def rank_padding(ask: Asker, pairs: list[tuple[Adapter, Adapter]], fillers: list[Adapter]) -> None:
    """Each prompt: the base model alone (a copy that answers as if no LoRA were applied, which
    is no_effect's to judge), each adapter's copy at its own rank alone, then its padded copy;
    before each copy, ``fillers`` (adapters of rank ``max_lora_rank``, one a slot) one token
    each, so that the copy goes into a slot that held every row: rows a load leaves there show."""
    for k in range(PROMPTS):
        ask.alone(None, k, BASE_STEP)
        for adapter, padded in pairs:
            for copy, step in ((adapter, ALONE), (padded, PADDED)):
                if fillers:
                    ask.batch([(f, 0) for f in fillers], FILL, output_len=1)
                ask.alone(copy, k, step)
