"""What an engine is sent: sampling parameters for exactly so many tokens, prompts as vLLM
takes them, one request's stream of outputs, and a batch sent at once and gathered."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from lorabench.config import EngineSpec
from lorabench.load.adapters import Adapter
from lorabench.load.workload import Prompt

# Every sampling setting but the temperature, at the value that turns it off, on both
# targets: a server fills what a request leaves out from the model's generation_config.json
# (Llama-2's top_p 0.9, Qwen2.5-Instruct's repetition_penalty 1.05, even for greedy
# requests), and an in-process engine would not.
NEUTRAL_SAMPLING = {
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


class Requests:
    """A part of ``lorabench.targets.engine.Engine``, which gives ``llm`` (vLLM's engine), ``run`` (a
    coroutine on the engine's loop), ``spec`` (its configuration), ``lora_request`` (an
    adapter's LoRA request) and ``_request_ids`` (a counter for request ids)."""

    llm: Any
    run: Callable[[Any], Any]
    spec: EngineSpec
    lora_request: Callable[[Adapter | None], Any]
    _request_ids: itertools.count

    @property
    def vocab_size(self) -> int:
        return int(self.llm.vllm_config.model_config.get_vocab_size())

    @property
    def block_size(self) -> int:
        """Tokens in a KV block: what prefix caching shares, a block at a time."""
        return int(self.llm.vllm_config.cache_config.block_size)

    def sampling_params(
        self,
        max_tokens: int,
        *,
        stream: bool = False,
        greedy: bool = False,
        prompt_logprobs: int | None = None,
        logprobs: int | None = None,
    ) -> Any:
        """Exactly ``max_tokens`` tokens (``ignore_eos``): sampled, or with ``greedy`` the most likely.

        ``stream``: each output carries the tokens new since the last; otherwise the
        request yields one final output. ``prompt_logprobs``: the top that many log
        probabilities of each prompt position come back too (the canaries ask for them);
        ``logprobs``: those of each sampled token, and the top that many besides.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
        temperature = 0.0 if greedy else 1.0
        return SamplingParams(
            n=1,
            temperature=temperature,
            **NEUTRAL_SAMPLING,
            ignore_eos=True,
            max_tokens=max_tokens,
            output_kind=kind,
            prompt_logprobs=prompt_logprobs,
            logprobs=logprobs,
        )

    def prompt_input(self, prompt: Prompt, cache_salt: str | None = None) -> Any:
        """What the engine is sent for ``prompt``: token ids as vLLM's TokensPrompt, text as
        is; with a ``cache_salt`` (vLLM hashes it into the first KV block, so the request shares
        no cached prefix with a request without it) as a prompt dict that carries it."""
        from vllm.inputs import TextPrompt, TokensPrompt

        if cache_salt is None:
            return TokensPrompt(prompt_token_ids=prompt) if isinstance(prompt, list) else prompt
        if isinstance(prompt, list):
            return TokensPrompt(prompt_token_ids=prompt, cache_salt=cache_salt)
        return TextPrompt(prompt=prompt, cache_salt=cache_salt)

    def stream(
        self, prompt: Prompt, params: Any, adapter: Adapter | None, cache_salt: str | None = None
    ) -> AsyncIterator[Any]:
        """One request's outputs as the engine produces them (on this engine's loop)."""
        lora = self.lora_request(adapter) if self.spec.enable_lora else None
        request_id = f"req-{next(self._request_ids)}"
        sent = self.prompt_input(prompt, cache_salt)
        return self.llm.generate(sent, params, request_id=request_id, lora_request=lora)

    def generate(
        self,
        prompts: Sequence[Prompt],
        adapters: Sequence[Adapter | None],
        output_len: int,
        *,
        greedy: bool = False,
        cache_salt: str | None = None,
        prompt_logprobs: int | None = None,
        logprobs: int | None = None,
    ) -> list[Any]:
        """Serve one batch: every request sent at once, the final outputs gathered in order;
        ``cache_salt`` keeps the batch off every cached prefix but its own (prefix caching)."""
        params = self.sampling_params(output_len, greedy=greedy, prompt_logprobs=prompt_logprobs, logprobs=logprobs)

        async def one(prompt: Prompt, adapter: Adapter | None) -> Any:
            final = None
            async for output in self.stream(prompt, params, adapter, cache_salt):
                final = output
            return final

        async def batch() -> list[Any]:
            return list(await asyncio.gather(*(one(p, a) for p, a in zip(prompts, adapters))))

        return self.run(batch())
