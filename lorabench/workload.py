"""Which adapter each request of a batch uses, and what it is asked.

Workloads, as in the scripts this harness replaces:

- ``distinct``: ``batch_size`` different adapters, one per request;
- ``uniform``: each request draws (seeded) from the first ``ceil(sqrt(batch_size))`` adapters;
- ``identical``: the first adapter for every request.

The no-LoRA scenario sends the same prompts with no adapter at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lorabench.adapters import Adapter

Prompt = str | list[int]
# vLLM's own latency benchmark draws prompt tokens below this id.
SYNTHETIC_TOKEN_LIMIT = 10_000


@dataclass(frozen=True)
class Request:
    prompt: Prompt
    adapter: Adapter | None


@dataclass(frozen=True)
class Batch:
    requests: tuple[Request, ...]
    pool: tuple[Adapter, ...]

    @property
    def adapters(self) -> list[Adapter]:
        """The distinct adapters the batch uses, in order of first use."""
        return list(dict.fromkeys(r.adapter for r in self.requests if r.adapter is not None))


def ceil_sqrt(n: int) -> int:
    return math.isqrt(n - 1) + 1 if n > 0 else 0


def pool_size(workload: str, batch_size: int) -> int:
    """How many adapters ``workload`` draws from at ``batch_size``."""
    sizes = {"distinct": batch_size, "uniform": ceil_sqrt(batch_size), "identical": 1}
    if workload not in sizes:
        raise ValueError(f"unknown workload {workload!r}: choose from {', '.join(sizes)}")
    return sizes[workload]


def assign_adapters(workload: str, batch_size: int, adapters: Sequence[Adapter], seed: int) -> list[Adapter]:
    """One adapter per request. Deterministic in ``seed`` and ``batch_size``."""
    need = pool_size(workload, batch_size)
    if len(adapters) < need:
        raise ValueError(f"workload {workload!r} at batch size {batch_size} needs {need} adapters, got {len(adapters)}")
    pool = list(adapters[:need])
    if workload == "uniform":
        rng = np.random.default_rng([seed, batch_size])
        return [pool[i] for i in rng.integers(0, len(pool), size=batch_size)]
    if workload == "identical":
        return pool * batch_size
    return pool


def synthetic_prompt(index: int, length: int, vocab_size: int, seed: int) -> list[int]:
    """Random token ids of exactly ``length`` tokens, as vLLM's latency benchmark sends;
    the same for the same request index, length and seed, in batches and replays alike."""
    rng = np.random.default_rng([seed, index, length])
    return rng.integers(0, min(vocab_size, SYNTHETIC_TOKEN_LIMIT), size=length).tolist()


def synthetic_prompts(batch_size: int, input_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    return [synthetic_prompt(i, input_len, vocab_size, seed) for i in range(batch_size)]


def build_batch(
    workload: str | None,
    batch_size: int,
    *,
    adapters: Sequence[Adapter],
    prompts: Sequence[str],
    input_len: int | None,
    vocab_size: int,
    seed: int,
) -> Batch:
    """The requests of one case; ``workload=None`` is the no-LoRA baseline."""
    chosen: list[Adapter | None]
    if workload is None:
        chosen, pool = [None] * batch_size, ()
    else:
        chosen = list(assign_adapters(workload, batch_size, adapters, seed))
        pool = tuple(adapters[: pool_size(workload, batch_size)])
    if input_len is not None:
        texts: list[Prompt] = list(synthetic_prompts(batch_size, input_len, vocab_size, seed))
    else:
        texts = [a.prompt if a is not None and a.prompt else prompts[i % len(prompts)] for i, a in enumerate(chosen)]
    return Batch(tuple(Request(p, a) for p, a in zip(texts, chosen)), pool)
