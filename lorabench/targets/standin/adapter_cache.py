"""The stand-in's adapter caches, as vLLM's LoRA managers keep them: an LRU cache of
``max_cpu_loras`` adapters read from disk, and ``max_loras`` device slots they are activated
into. What a move costs is the test's (``Costs``); which adapter is evicted follows vLLM."""

from __future__ import annotations

import functools
import json
from collections import Counter, OrderedDict
from pathlib import Path

from lorabench.load.padded import PADDED_MARK
from lorabench.targets.standin.costs import Costs
from lorabench.targets.standin.scheduler import LoraRef


class AdapterCache:
    """The CPU cache and the device slots, with the loads from disk counted as vLLM's worker
    counts them (``lorabench.targets.vllm_worker``)."""

    def __init__(self, costs: Costs, max_loras: int, max_cpu_loras: int) -> None:
        self.costs, self.max_loras, self.max_cpu_loras = costs, max_loras, max_cpu_loras
        self.disk_loads = 0
        self.cpu: OrderedDict[int, LoraRef] = OrderedDict()
        self.slots: OrderedDict[int, None] = OrderedDict()
        # How many times each adapter has been moved into a slot, and the rank of what its slot
        # held before it (0: a slot never used), which planted bugs read; ranks of slots emptied.
        self.activations: Counter[int] = Counter()
        self.slot_held: dict[int, int] = {}
        self.ranks: dict[int, int] = {}
        self.vacated: list[int] = []

    def to_slot(self, lora: LoraRef, active: set[int]) -> float:
        """Into a slot, read from disk first unless cached; the milliseconds it costs.
        ``active``: the adapters running requests use, which are not evicted while others are."""
        cached = lora.lora_int_id in self.cpu
        self.disk_loads += not cached
        cost = 0.0 if cached else self.costs.disk_load_ms
        self.ranks[lora.lora_int_id] = adapter_files(lora.lora_path)[1] or 0
        self._cache(lora, active)
        return cost + self._activate(lora.lora_int_id, active)

    def remove(self, lora_id: int) -> bool:
        """Out of its slot and the cache; whether it was cached."""
        self._vacate(lora_id)
        return self.cpu.pop(lora_id, None) is not None

    def forget(self, lora_id: int) -> None:
        """Out of the cache, its slot kept: a load in place reads the weights again."""
        self.cpu.pop(lora_id, None)

    def _activate(self, lora_id: int, active: set[int]) -> float:
        """Into a device slot, evicting the least recently used one that no running request
        uses. With every slot serving (an ``add_lora`` mid-trace), vLLM evicts one anyway and its
        next step takes the slot back: here the activation is paid and the adapter stays out;
        the running adapter's move back into its slot, which vLLM also pays, is not charged."""
        if lora_id in self.slots:
            self.slots.move_to_end(lora_id)
            return 0.0
        if len(self.slots) >= self.max_loras:
            idle = next((i for i in self.slots if i not in active), None)
            if idle is None:
                return self.costs.slot_load_ms
            self._vacate(idle)
        self.slot_held[lora_id] = self.vacated.pop() if self.vacated else 0
        self.slots[lora_id] = None
        self.activations[lora_id] += 1
        return self.costs.slot_load_ms

    def _cache(self, lora: LoraRef, active: set[int]) -> None:
        """Into the CPU cache, evicting the least recently used adapter no running request
        uses; with every one in use (an ``add_lora`` while ``max_cpu_loras`` adapters run),
        the least recently used one, as vLLM's cache does whatever runs."""
        self.cpu[lora.lora_int_id] = lora
        self.cpu.move_to_end(lora.lora_int_id)
        while len(self.cpu) > self.max_cpu_loras:
            others = [i for i in self.cpu if i != lora.lora_int_id]
            victim = next((i for i in others if i not in active), others[0])
            del self.cpu[victim]
            self._vacate(victim)

    def _vacate(self, lora_id: int) -> None:
        """Out of its slot, which keeps the rank it held for the next adapter moved into it."""
        if self.slots.pop(lora_id, 0) is None:
            self.vacated.append(self.ranks.get(lora_id, 0))


@functools.cache
def adapter_files(path: str) -> tuple[str | None, int | None]:
    """What the stand-in reads of an adapter's folder: the adapter it is a padded copy of
    (``lorabench.load.padded`` marks one: the same function, so it answers as that adapter
    does), and its rank (``r`` of its adapter_config.json; None where it has none)."""
    folder = Path(path)
    mark = folder / PADDED_MARK
    of = json.loads(mark.read_text(encoding="utf-8"))["of"] if mark.is_file() else None
    config = folder / "adapter_config.json"
    rank = json.loads(config.read_text(encoding="utf-8")).get("r") if config.is_file() else None
    return of, rank
