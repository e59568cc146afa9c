"""Shared prefixes from a trace's block hash ids (Mooncake's ``hash_ids``).

A Mooncake request lists one id per block of its prompt (512 tokens each in the
published traces), the id standing for the block and everything before it: two
requests whose lists start alike share those leading blocks of prompt. The ids are
held as one ragged array (``HashIds``), turned into real tokens at replay
(``prompt``: each id gives the same block of tokens wherever it appears) and read for
the hit rate they predict (``predict``): what an infinite prefix cache keyed as vLLM's
would find, in the engine's own blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from lorabench.load.traces.synthetic import TraceRequest

# Token ids drawn below this, as the replay's own synthetic prompts are.
_TOKEN_LIMIT = 10_000
# Tags the spans' seeds, so a span never equals a request's own synthetic tokens.
_SPAN_TAG = 0x5EED


@dataclass(frozen=True, eq=False)
class HashIds:
    """Request ``k``'s ids are ``values[offsets[k]:offsets[k + 1]]``."""

    offsets: np.ndarray
    values: np.ndarray

    @classmethod
    def from_lists(cls, lists: Sequence[Sequence[int]]) -> HashIds:
        lengths = np.fromiter((len(ids) for ids in lists), dtype=np.int64, count=len(lists))
        offsets = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter((i for ids in lists for i in ids), dtype=np.int64, count=int(offsets[-1]))
        return cls(offsets, values)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def rows(self) -> list[tuple[int, ...]]:
        values, offsets = self.values.tolist(), self.offsets.tolist()
        return [tuple(values[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]

    def take(self, keep: np.ndarray | slice) -> HashIds:
        """The rows ``keep`` picks (a mask, indices or a slice), in that order."""
        picked = np.arange(len(self))[keep]
        return self.cut(picked, np.diff(self.offsets)[picked])

    def clipped(self, input_len: np.ndarray, block_tokens: int) -> HashIds:
        """Each row cut to the blocks its (possibly shortened) prompt still reaches."""
        reach = -(-np.asarray(input_len, dtype=np.int64) // block_tokens)
        return self.cut(np.arange(len(self)), np.minimum(np.diff(self.offsets), reach))

    def cut(self, rows: np.ndarray, lengths: np.ndarray) -> HashIds:
        """Rows ``rows``, each kept to its first ``lengths`` ids."""
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = self.offsets[rows]
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))
        return HashIds(offsets, self.values[index])


@lru_cache(maxsize=4096)
def _span(hash_id: int, block_tokens: int, vocab_size: int, seed: int) -> tuple[int, ...]:
    rng = np.random.default_rng([seed, _SPAN_TAG, hash_id & (2**63 - 1), block_tokens])
    return tuple(rng.integers(0, min(vocab_size, _TOKEN_LIMIT), size=block_tokens).tolist())


def prompt(hash_ids: Sequence[int], block_tokens: int, own: list[int], vocab_size: int, seed: int) -> list[int]:
    """A prompt of ``len(own)`` tokens: a span of ``block_tokens`` for each id, the same
    wherever the id appears, then ``own`` (the request's own tokens) past the ids' reach."""
    tokens: list[int] = []
    for hash_id in hash_ids:
        if len(tokens) >= len(own):
            break
        tokens.extend(_span(int(hash_id), block_tokens, vocab_size, seed))
    return (tokens + own[len(tokens) :])[: len(own)]


def predict(
    hash_ids: HashIds, input_len: np.ndarray, adapter: np.ndarray | None, block_tokens: int, engine_block: int
) -> np.ndarray:
    """Prompt tokens each request would find cached, in arrival order, in an infinite cache
    keyed as vLLM 0.32 keys KV blocks: by the tokens before and within each block and, unless
    ``adapter`` is None, by the request's adapter (``docs/scenarios.md#isolation``).

    vLLM caches a request's full blocks of ``engine_block`` tokens and reuses a chain of them
    from the prompt's start, leaving at least the last prompt token to compute. A trace block
    of ``block_tokens`` is shared up to the tokens an earlier prompt of the same chain left
    cached in it, and a hit ends on an engine block's edge."""
    nodes: dict[tuple[int, int], int] = {}
    seen: list[int] = []
    hits = np.zeros(len(hash_ids), dtype=np.int64)
    groups = adapter.tolist() if adapter is not None else [0] * len(hash_ids)
    for k, (ids, length, group) in enumerate(zip(hash_ids.rows(), input_len.tolist(), groups)):
        # A chain of blocks is a path from its group's root: node ids stand for whole prefixes.
        node, found, matching = -1 - group, 0, True
        full = length // engine_block * engine_block  # the tokens of its prompt it leaves cached
        for b, hash_id in enumerate(ids):
            start = b * block_tokens
            span = min(block_tokens, length - start)
            if span <= 0:
                break
            node = nodes.setdefault((node, hash_id), len(nodes))
            if node == len(seen):
                seen.append(0)
            cached = seen[node]
            if matching:
                found = start + min(cached, span)
                matching = cached >= span
            seen[node] = max(cached, min(span, full - start))
        limit = (length - 1) // engine_block * engine_block
        hits[k] = min(found // engine_block * engine_block, limit)
    return hits


def predict_requests(requests: Sequence[TraceRequest], engine_block: int) -> list[int]:
    """``predict`` over replayed requests, in their order, keyed by their adapters."""
    if not requests or not requests[0].block_tokens:
        return [0] * len(requests)
    names: dict[str, int] = {}
    adapter = np.array([names.setdefault(r.adapter, len(names)) for r in requests], dtype=np.int64)
    ids = HashIds.from_lists([r.hash_ids for r in requests])
    lengths = np.array([r.input_len for r in requests], dtype=np.int64)
    return predict(ids, lengths, adapter, requests[0].block_tokens, engine_block).tolist()


def copies(requests: Sequence[TraceRequest], period_s: float, count: int) -> list[TraceRequest]:
    """``count`` copies of ``requests`` back to back, each ``period_s`` after the one before.
    Copy k > 0 has block ids of its own, shared within it as in the original: with the same
    ids a later copy found the earlier one's prompts cached, so a faster capacity probe (more
    copies) skipped most of its prefill (62 % of measured tokens at 2 copies, 92 % at 4)."""
    return [
        replace(r, arrival_s=r.arrival_s + k * period_s, hash_ids=tuple(_in_copy(h, k) for h in r.hash_ids))
        for k in range(count)
        for r in requests
    ]


def _in_copy(hash_id: int, copy: int) -> int:
    """``hash_id`` in copy ``copy``'s namespace (itself in copy 0); a tuple of ints hashes the
    same in every process."""
    return int(hash_id) if copy == 0 else hash((int(hash_id), copy)) & (2**63 - 1)
