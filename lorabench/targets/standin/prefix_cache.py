"""The stand-in's prefix cache, keyed as vLLM 0.32 keys its KV blocks (``v1/core/kv_cache_utils.py``):

- only full blocks of a prompt are cached; a block's hash chains its parent's, its tokens and
  its extra keys: the request's adapter, as ``(name, path)``, on every block, and the
  request's ``cache_salt`` on the first;
- a request admitted for the first time reuses its longest run of leading cached blocks, but
  computes its last prompt token at least (a hit is at most ``(len(prompt) - 1) // block_size``
  blocks); the blocks its prompt fills are cached as it is admitted, as vLLM caches a block
  when it allocates it (``KVCacheManager.allocate_slots``), so a request admitted next in the
  same step reuses them;
- cached blocks stay until the cache needs the room, least recently used first and, within
  a request's blocks, its last first (vLLM frees a request's blocks tail first), so that a
  prompt's head, which other prompts share, stays longest. Here the cache holds as many
  blocks as the KV cache has, apart from the blocks requests hold: vLLM keeps cached blocks
  among its free ones, so they never count in ``kv_cache_usage``. Blocks filled by decoded
  tokens are not cached here (vLLM caches them too): no column reads them.

Each cached block remembers whose KV it holds: the adapter and weights that computed it. A
request that reuses a block another adapter (or other weights) computed answers with that
KV, so its output is not its own: the stand-in derives its tokens from both. With the key
right that happens only where vLLM's key misses a difference (weights replaced under the same
name and path); ``keyed_by_adapter=False`` plants the bug of a key without the adapter.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Owner:
    """Whose KV a block holds: the adapter (None: the base model) and its weights."""

    adapter: str | None
    weights: str


class PrefixCache:
    """Block hashes to their owners, least recently used first, with vLLM's token counters."""

    def __init__(self, capacity: int, block_size: int, *, keyed_by_adapter: bool = True) -> None:
        self.capacity, self.block_size, self.keyed_by_adapter = capacity, block_size, keyed_by_adapter
        self.blocks: OrderedDict[bytes, Owner] = OrderedDict()
        # As vLLM's PrefixCacheStats: prompt tokens looked up, and those found cached.
        self.queries = 0
        self.hits = 0

    def hashes(self, prompt: Sequence[int], adapter: tuple[str, ...] | None, salt: str | None) -> list[bytes]:
        """The chained hashes of the prompt's full blocks."""
        extra = repr(adapter if self.keyed_by_adapter else None).encode()
        parent, out = b"", []
        for index in range(len(prompt) // self.block_size):
            tokens = prompt[index * self.block_size : (index + 1) * self.block_size]
            first = repr(salt).encode() if index == 0 and salt else b""
            parent = hashlib.sha256(parent + repr(list(tokens)).encode() + extra + first).digest()
            out.append(parent)
        return out

    def lookup(self, hashes: Sequence[bytes], prompt_len: int) -> list[Owner]:
        """The owners of the leading cached blocks a request of ``prompt_len`` tokens reuses."""
        found: list[Owner] = []
        for block in hashes[: (prompt_len - 1) // self.block_size]:
            owner = self.blocks.get(block)
            if owner is None:
                break
            found.append(owner)
        for block in reversed(hashes[: len(found)]):  # the head most recently used
            self.blocks.move_to_end(block)
        self.queries += prompt_len
        self.hits += len(found) * self.block_size
        return found

    def insert(self, hashes: Sequence[bytes], owner: Owner, room: int) -> None:
        """Cache the blocks a request computed (those cached already keep their owner), in
        ``room`` blocks at most: the KV cache's blocks no request holds."""
        for block in reversed(hashes):  # the head most recently used
            if block in self.blocks:
                self.blocks.move_to_end(block)
            else:
                self.blocks[block] = owner
        while len(self.blocks) > max(0, min(room, self.capacity)):
            self.blocks.popitem(last=False)
