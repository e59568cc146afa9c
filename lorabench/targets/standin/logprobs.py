"""The stand-in's log probabilities, as vLLM returns them: a sampled token's (``logprobs``) and
each prompt position's (``prompt_logprobs``).

A token's log probability is a hash of the model that computes it (the adapter's name and
weights, as the answer's hash has them: ``llm.StandInLLM.generate``), the tokens before it and
the token itself: a deterministic function of (model, context, token), as a real model's is.
So the decode path (a sampled token after the prompt and the tokens sampled before it) and the
prefill path (the same token as a prompt position, teacher-forced) agree exactly on a clean
stand-in, and two adapters' values differ, which is what the prompt_logprobs canary judges.
A planted bug hands the prompt path another model (``planted.prompt_logprobs_model``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lorabench.targets.standin.scheduler import Request

# Log probabilities fall in [-SPREAD - 1, -1): far apart for two models, as random adapters' are.
SPREAD = 10.0
LEVELS = 100_000


@dataclass
class Logprob:
    """As vLLM's ``vllm.logprobs.Logprob``: what a position's dict holds for each token id."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def _value(context: Any, token: int) -> float:
    """``token``'s log probability after ``context`` (a hashlib hash of the model and the tokens
    so far, copied: the caller goes on updating it)."""
    h = context.copy()
    h.update(b"|%d" % token)
    level = int.from_bytes(h.digest()[:4], "little") % LEVELS
    return -1.0 - SPREAD * level / LEVELS


def _context(model: str) -> Any:
    return hashlib.sha256(model.encode())


def prompt_logprobs(model: str, prompt: Sequence[int]) -> list[dict[int, Logprob] | None]:
    """One entry a prompt position, None for the first (no token before it), each the
    prompt's own token's log probability under ``model`` after the tokens before it."""
    context, entries = _context(model), [None]
    for i, token in enumerate(prompt):
        context.update(b",%d" % token)
        if i + 1 < len(prompt):
            entries.append({prompt[i + 1]: Logprob(_value(context, prompt[i + 1]), rank=1)})
    return entries


def sampled_logprobs(model: str, prompt: Sequence[int], tokens: Sequence[int], start: int) -> list[dict[int, Logprob]]:
    """The log probability of each sampled token from ``tokens[start]`` on, under ``model``,
    after the prompt and the tokens sampled before it: the same context the prompt path gives
    that token when the prompt and answer are sent back as a prompt."""
    context, entries = _context(model), []
    for token in prompt:
        context.update(b",%d" % token)
    for i, token in enumerate(tokens):
        if i >= start:
            entries.append({token: Logprob(_value(context, token), rank=1)})
        context.update(b",%d" % token)
    return entries


def of_prompt(request: Request) -> list[dict[int, Logprob] | None] | None:
    """What vLLM's final output carries where the request asked for prompt logprobs: an entry a
    prompt position, None for the first (no token before it), each the prompt's own token."""
    if request.params.prompt_logprobs is None:
        return None
    return prompt_logprobs(request.prompt_model, request.prompt)


def of_sampled(request: Request, sent: int) -> list[dict[int, Logprob]] | None:
    """The log probabilities of the last ``sent`` sampled tokens, where the request asked for them."""
    if request.params.logprobs is None:
        return None
    return sampled_logprobs(request.model, request.prompt, request.tokens, len(request.tokens) - sent)
