"""Variant builds: a configuration built again with one vLLM feature on that the config leaves
off, for a correctness check whose reference is the configuration's own (plain) build.

A variant is built once (build 0) for the first LoRA configuration of the grid, and only for
the scenarios that ask for it (``Scenario.variants``): the canaries' spec_decode and
chunked_prefill checks answer on it and judge against the plain build's answers to the same
requests. Its rows carry the variant in the ``engine_variant`` key column, so they never
stand in for the plain build's.
"""

from __future__ import annotations

from typing import Any

SPEC_NGRAM = "ngram"
CHUNKED = "chunked"
# N-gram speculation as vLLM's docs show it: up to 3 draft tokens a step, looked up from the last
# 2 or 3 tokens of the request so far.
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
# The chunked build's token budget a step: a prompt longer than it is prefilled over several steps
# whatever else is scheduled (vLLM's scheduler cuts a prefill to the budget left in the step).
CHUNK_TOKENS = 32
# The engine settings a variant sets, and the config settings it cannot be built beside.
SETTINGS = {SPEC_NGRAM: ("speculative_config",), CHUNKED: ("max_num_batched_tokens", "max_num_seqs")}


def variant_kwargs(variant: str, settings: dict[str, Any]) -> dict[str, Any]:
    """vLLM's arguments that make ``variant`` of a configuration whose engine arguments are
    ``settings`` so far; {} for the plain build. The chunked build holds ``max_num_seqs`` to its
    budget, as vLLM requires (``max_num_batched_tokens >= max_num_seqs``)."""
    if variant == SPEC_NGRAM:
        return {"speculative_config": dict(NGRAM)}
    if variant == CHUNKED:
        seqs = settings.get("max_num_seqs") or CHUNK_TOKENS
        return {"max_num_batched_tokens": CHUNK_TOKENS, "max_num_seqs": min(int(seqs), CHUNK_TOKENS)}
    return {}


def plain_conflict(variant: str, engine: dict[str, Any], prompt_len: int) -> str:
    """Why the config's own builds cannot be the plain reference of ``variant`` for a prompt of
    ``prompt_len`` tokens (its engine section ``engine`` already speculates, or its budget
    would split the prompt too), or ""."""
    if variant == SPEC_NGRAM and engine.get("speculative_config"):
        return (
            "the config's engine sets speculative_config: its own builds speculate, so none answers as plain decoding"
        )
    if variant == CHUNKED and engine.get("enable_chunked_prefill") is False:
        return "the config's engine turns enable_chunked_prefill off: vLLM builds no chunked variant of it"
    budget = engine.get("max_num_batched_tokens")
    if variant == CHUNKED and budget and int(budget) < prompt_len:
        return (
            f"the config's engine sets max_num_batched_tokens {budget}: its own builds split the check's prompt of "
            f"{prompt_len} tokens too, so none prefills it unsplit"
        )
    return ""
