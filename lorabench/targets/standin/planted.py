"""The stand-in's planted multi-LoRA bugs: one switch a class of real bug (``Costs.plant_*``),
each making the stand-in answer wrongly as that class does, so that the correctness canaries'
tests (docs/canaries.md) can see each one caught, and a clean stand-in never flagged.

The stand-in's answer to a request is a hash of its adapter's name and weights and of its
prompt (``llm.StandInLLM.generate``), each token a hash of that and the token's index. A
planted bug changes what goes into the hash:

- ``plant_no_effect``: the adapters with an even LoRA id lose their LoRA on a prompt longer than
  one KV block (16 tokens) and answer as the base model does, as a kernel path that only some
  slots and lengths take would; the build's digest probe (a 16-token prompt) does not see it;
- ``plant_base_changed_by_lora``: a request with no adapter answers otherwise on a build with
  LoRA enabled than on one without;
- ``plant_batch_variance``: a LoRA request in a step beside a request of another adapter (or of
  none) takes each token from a wrong mapping;
- ``plant_stale_after_eviction``: an adapter moved back into a device slot after it left one
  answers with what the slot held before: otherwise each time it comes back;
- ``plant_prompt_logprobs_drop_lora``: a LoRA request that asks for prompt logprobs loses its
  LoRA and answers as the base model does, as a path that computes them apart would;
- ``plant_prompt_logprobs_wrong_lora``: a LoRA request's prompt logprobs are the base model's,
  while its answer and its sampled tokens' logprobs are its own: the LoRA mapping of the
  prompt-logprobs path is wrong, and only that (vLLM #16668, #51594);
- ``plant_rank_padding``: an adapter of a rank below ``max_lora_rank`` is loaded into its slot
  wrongly, as a load that scales it by the padded rank instead of its own, or copies its rows
  to an offset, would: it answers otherwise than its copy padded by lorabench
  (``lorabench.load.padded``), which has nothing to pad and which a clean stand-in answers as
  the adapter it copies;
- ``plant_stale_rows``: an adapter moved into a slot that held one of a higher rank keeps the
  rows above its own rank that the last occupant left (a slot not reset before a load);
- ``plant_spec_decode``: on an n-gram speculation build, a LoRA request's drafts are verified
  without its LoRA, and it answers otherwise than with plain decoding;
- ``plant_chunked_prefill``: a LoRA request whose prompt is longer than the build's token budget
  a step loses its LoRA in the later chunks, and answers otherwise than prefilled whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from lorabench.config.variants import SPEC_NGRAM
from lorabench.targets.standin.scheduler import BLOCK_SIZE, LoraRef, Params, Request

if TYPE_CHECKING:
    from lorabench.targets.standin.adapter_cache import AdapterCache
    from lorabench.targets.standin.costs import Costs


def seen_as(
    costs: Costs,
    lora_enabled: bool,
    lora: LoraRef | None,
    name: str | None,
    weights: str,
    prompt: Sequence[int],
    params: Params,
) -> tuple[str | None, str]:
    """The adapter name and weights a request's answer is hashed from: ``name`` (the adapter
    ``lora`` answers as: itself, or the one it is a padded copy of) and its weights, unless a
    planted bug swaps them."""
    if lora is not None and costs.plant_no_effect and lora.lora_int_id % 2 == 0 and len(prompt) > BLOCK_SIZE:
        return None, "base"
    if lora is not None and costs.plant_prompt_logprobs_drop_lora and params.prompt_logprobs is not None:
        return None, "base"
    if lora is None and costs.plant_base_changed_by_lora and lora_enabled:
        return None, "base+lora-enabled"
    return name, weights


def prompt_logprobs_model(costs: Costs, lora: LoraRef | None, model: str) -> str:
    """The model a request's prompt logprobs come from: ``model``, its sampled tokens' own,
    unless ``plant_prompt_logprobs_wrong_lora`` computes a LoRA request's as the base model's
    (``None|base``: the name and weights ``llm.StandInLLM.generate`` keys a request of no adapter by)."""
    if lora is not None and costs.plant_prompt_logprobs_wrong_lora:
        return "None|base"
    return model


def padding(costs: Costs, padded: bool) -> str:
    """What ``plant_rank_padding`` adds to the weights of an adapter whose rank is below the
    engine's ``max_lora_rank``: a load that pads it wrongly (module docstring)."""
    return "+padded" if costs.plant_rank_padding and padded else ""


def taint(costs: Costs, request: Request, running: Sequence[Request], slots: AdapterCache) -> bytes:
    """What a planted bug adds to the hash of a request's next token; nothing on a clean stand-in.
    ``slots``: how many times each adapter was moved into a device slot, what the slot held."""
    lora = request.lora
    if lora is None:
        return b""
    added, activations, own = b"", slots.activations, slots.ranks.get(lora.lora_int_id, 0)
    if costs.plant_stale_rows and slots.slot_held.get(lora.lora_int_id, 0) > own:
        added += b"rows above its rank left by the slot's last occupant"
    if costs.plant_batch_variance and any(r.lora_name != lora.lora_name for r in running):
        added += b"batch"
    moved_in = activations.get(lora.lora_int_id, 0)
    if costs.plant_stale_after_eviction and moved_in > 1:
        added += b"stale%d" % moved_in
    return added


def variant(costs: Costs, variant: str, budget: int, lora: LoraRef | None, prompt: Sequence[int]) -> str:
    """What ``plant_spec_decode`` and ``plant_chunked_prefill`` add to the weights a LoRA request
    answers with where they break it: speculation on, or a prompt past the token budget a step
    (module docstring)."""
    if lora is None:
        return ""
    if costs.plant_spec_decode and variant == SPEC_NGRAM:
        return "+drafts verified without LoRA"
    if costs.plant_chunked_prefill and len(prompt) > budget:
        return "+later chunks without LoRA"
    return ""
