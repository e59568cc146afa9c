"""Which adapter each request of a batch uses, and what it is asked.

Workloads, as in the scripts this harness replaces:

- ``distinct``: ``batch_size`` different adapters, one per request;
- ``uniform``: each request draws (seeded) from the first ``ceil(sqrt(batch_size))`` adapters;
- ``skewed`` (Punica's): the batch is split into groups whose sizes fall off by a Zipf
  law, group ``i`` (from 1) getting the share ``i**-alpha / sum_j j**-alpha`` of the
  ``batch_size`` requests (``j`` up to ``batch_size``), rounded by largest remainder;
  groups that round to no request are dropped, and group ``i`` uses adapter ``i``;
- ``identical``: the first adapter for every request;
- ``mixed``: ``round(batch_size * base_share)`` requests (at least one, and at least one
  left for LoRA) with no adapter, first; the rest distinct adapters.

The no-LoRA scenario sends the same prompts with no adapter at all.

A shared prefix (``matrix.shared_prefix_len`` tokens, on ``matrix.shared_prefix_share`` of
the requests, spread evenly) starts the synthetic prompts of the requests that carry it,
as a system prompt or a RAG context does; the rest of each prompt is its own. With prefix
caching on, each round's own tokens are new (``Batch.round_prompts``), so what a round finds
cached is the prefix the workload shares, not the previous round's prompts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lorabench.load.adapters import Adapter

Prompt = str | list[int]
# vLLM's own latency benchmark draws prompt tokens below this id.
SYNTHETIC_TOKEN_LIMIT = 10_000


@dataclass(frozen=True)
class Request:
    prompt: Prompt
    adapter: Adapter | None


@dataclass(frozen=True)
class SyntheticPrompts:
    """A batch's synthetic prompts, made for any round: the carriers' shared prefix, then
    each request's own tokens, new each round."""

    batch_size: int
    input_len: int
    vocab_size: int
    seed: int
    prefix_len: int = 0
    prefix_share: float = 1.0

    def round(self, index: int) -> list[list[int]]:
        prefix = shared_prefix(self.prefix_len, self.vocab_size, self.seed)
        prompts = []
        for i in range(self.batch_size):
            own = synthetic_prompt(i + index * self.batch_size, self.input_len, self.vocab_size, self.seed)
            prompts.append(prefix + own[len(prefix) :] if carries_prefix(i, self.prefix_share) else own)
        return prompts


@dataclass(frozen=True)
class Batch:
    requests: tuple[Request, ...]
    pool: tuple[Adapter, ...]
    synthetic: SyntheticPrompts | None = None

    def round_prompts(self, index: int) -> list[Prompt]:
        """Round ``index``'s prompts: round 0's are the requests'; later rounds' own tokens
        are new where the prompts are synthetic (text prompts are what they are)."""
        if index == 0 or self.synthetic is None:
            return [r.prompt for r in self.requests]
        return list(self.synthetic.round(index))

    @property
    def adapters(self) -> list[Adapter]:
        """The distinct adapters the batch uses, in order of first use."""
        return list(dict.fromkeys(r.adapter for r in self.requests if r.adapter is not None))


def ceil_sqrt(n: int) -> int:
    return math.isqrt(n - 1) + 1 if n > 0 else 0


@dataclass(frozen=True)
class Shape:
    """The knobs of the skewed and mixed workloads (``matrix.skew_alpha``, ``matrix.mixed_base_share``)."""

    skew_alpha: float = 1.5
    base_share: float = 0.5
    # The shared prefix: its tokens, and the share of the requests that start with it.
    prefix_len: int = 0
    prefix_share: float = 1.0


def zipf_group_sizes(batch_size: int, alpha: float) -> list[int]:
    """Punica's skewed split: group sizes by a Zipf law, summing to ``batch_size``."""
    weights = np.arange(1, batch_size + 1, dtype=float) ** -alpha
    exact = batch_size * weights / weights.sum()
    sizes = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - sizes), kind="stable")[: batch_size - sizes.sum()]:
        sizes[i] += 1
    return [int(n) for n in sizes if n > 0]


def base_requests(batch_size: int, share: float) -> int:
    if batch_size < 2:
        return 0
    return min(max(round(batch_size * share), 1), batch_size - 1)


def pool_size(workload: str, batch_size: int, shape: Shape = Shape()) -> int:
    """How many adapters ``workload`` draws from at ``batch_size``."""
    sizes = {
        "distinct": lambda: batch_size,
        "uniform": lambda: ceil_sqrt(batch_size),
        "skewed": lambda: len(zipf_group_sizes(batch_size, shape.skew_alpha)),
        "identical": lambda: 1,
        "mixed": lambda: batch_size - base_requests(batch_size, shape.base_share),
    }
    if workload not in sizes:
        raise ValueError(f"unknown workload {workload!r}: choose from {', '.join(sizes)}")
    return sizes[workload]()


def assign_adapters(
    workload: str, batch_size: int, adapters: Sequence[Adapter], seed: int, shape: Shape = Shape()
) -> list[Adapter | None]:
    """One adapter (or, in mixed batches, none) per request. Deterministic in ``seed`` and ``batch_size``."""
    need = pool_size(workload, batch_size, shape)
    if len(adapters) < need:
        raise ValueError(f"workload {workload!r} at batch size {batch_size} needs {need} adapters, got {len(adapters)}")
    pool = list(adapters[:need])
    if workload == "uniform":
        rng = np.random.default_rng([seed, batch_size])
        return [pool[i] for i in rng.integers(0, len(pool), size=batch_size)]
    if workload == "skewed":
        return [a for a, n in zip(pool, zipf_group_sizes(batch_size, shape.skew_alpha)) for _ in range(n)]
    if workload == "identical":
        return pool * batch_size
    if workload == "mixed":
        return [None] * (batch_size - need) + pool
    return pool


def synthetic_prompt(index: int, length: int, vocab_size: int, seed: int) -> list[int]:
    """Random token ids of exactly ``length`` tokens, as vLLM's latency benchmark sends;
    the same for the same request index, length and seed, in batches and replays alike."""
    rng = np.random.default_rng([seed, index, length])
    return rng.integers(0, min(vocab_size, SYNTHETIC_TOKEN_LIMIT), size=length).tolist()


# Tags the shared prefix's seed, so it never equals a request's own tokens.
_PREFIX_TAG = 0x5A5ED


def shared_prefix(length: int, vocab_size: int, seed: int) -> list[int]:
    """The tokens every carrier of a batch's shared prefix starts with."""
    if not length:
        return []
    rng = np.random.default_rng([seed, _PREFIX_TAG, length])
    return rng.integers(0, min(vocab_size, SYNTHETIC_TOKEN_LIMIT), size=length).tolist()


def carries_prefix(index: int, share: float) -> bool:
    """Whether request ``index`` starts with the shared prefix: ``share`` of the requests,
    spread evenly (every request at 1, every other at 0.5), the first among them."""
    # Rounded first: 100 * 0.07 is 7.000000000000001 in floating point, which ceil makes 8.
    return math.ceil(round((index + 1) * share, 9)) > math.ceil(round(index * share, 9))


def build_batch(
    workload: str | None,
    batch_size: int,
    *,
    adapters: Sequence[Adapter],
    prompts: Sequence[str],
    input_len: int | None,
    vocab_size: int,
    seed: int,
    shape: Shape = Shape(),
) -> Batch:
    """The requests of one case; ``workload=None`` is the no-LoRA baseline."""
    chosen: list[Adapter | None]
    if workload is None:
        chosen, pool = [None] * batch_size, ()
    else:
        chosen = assign_adapters(workload, batch_size, adapters, seed, shape)
        pool = tuple(adapters[: pool_size(workload, batch_size, shape)])
    synthetic = None
    if input_len is not None:
        synthetic = SyntheticPrompts(batch_size, input_len, vocab_size, seed, shape.prefix_len, shape.prefix_share)
        texts: list[Prompt] = list(synthetic.round(0))
    else:
        texts = [a.prompt if a is not None and a.prompt else prompts[i % len(prompts)] for i, a in enumerate(chosen)]
    return Batch(tuple(Request(p, a) for p, a in zip(texts, chosen)), pool, synthetic)
