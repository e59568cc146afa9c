"""An engine's adapters: vLLM's LoRA requests, and its CPU cache of adapters through
``add_lora``, ``list_loras`` and ``remove_lora``, loaded outside the timings and timed alone."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from lorabench.load.adapters import Adapter
from lorabench.targets.vllm_worker import DISK_LOADS


class AdapterCache:
    """A part of ``lorabench.targets.engine.Engine``, which gives ``llm`` (vLLM's engine), ``run`` (a
    coroutine on the engine's loop) and ``_lora_ids`` (each adapter's LoRA id, from 1)."""

    llm: Any
    run: Callable[[Any], Any]
    _lora_ids: dict[str, int]
    # Whether vLLM's worker runs lorabench's extension that counts its loads (set at the build).
    counts_disk_loads = False

    def lora_request(self, adapter: Adapter | None) -> Any:
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(adapter.name, self._lora_ids[adapter.name], str(adapter.path))

    def load_adapters(self, adapters: Sequence[Adapter]) -> None:
        """Put a case's adapters in the engine's CPU cache before its timing starts.

        The cached ones are added first: vLLM's ``add_lora`` of an adapter it holds only
        makes it the most recent (``LRUCacheWorkerLoRAManager.add_adapter``), so the
        missing ones' loads then evict other adapters, not the case's own. Left alone, a
        cached adapter could be the oldest and be evicted here, and loaded from disk again
        inside the timing. Moving an adapter from the CPU cache into one of the
        ``max_loras`` slots still happens while serving; that is part of multi-LoRA cost
        and stays in the timings.
        """
        if not adapters:
            return
        resident = self.run(self.llm.list_loras())
        for adapter in sorted(adapters, key=lambda a: self._lora_ids[a.name] not in resident):
            self.run(self.llm.add_lora(self.lora_request(adapter)))

    def add_adapter(self, adapter: Adapter) -> float:
        """Seconds to load ``adapter`` from disk into the CPU cache, nothing else timed:
        it is removed first if it is cached, so the load always reads the disk."""
        if adapter.name in self.cached_adapters():
            self.remove_adapter(adapter)
        start = self.loop.time()
        self.run(self.llm.add_lora(self.lora_request(adapter)))
        return self.loop.time() - start

    def measure_adapter_loads(self, adapters: Sequence[Adapter]) -> float:
        """Mean seconds of one adapter's load from disk, over every adapter, each timed alone."""
        return statistics.fmean(self.add_adapter(a) for a in adapters)

    def cached_adapters(self) -> set[str]:
        """The adapters in the engine's CPU cache, by vLLM's own list (``list_loras``)."""
        ids = self.run(self.llm.list_loras())
        return {name for name, i in self._lora_ids.items() if i in ids}

    def disk_loads(self) -> int | None:
        """Adapters vLLM's worker has loaded from disk so far (``add_lora`` and serving alike),
        counted in the worker as it loads them (``lorabench.targets.vllm_worker``); read it
        before and after what it should count. None where the worker does not count."""
        if not self.counts_disk_loads:
            return None
        return self.run(self.llm.collective_rpc(DISK_LOADS))[0]

    def register(self, adapter: Adapter) -> None:
        """Give an adapter the config does not list a LoRA id of its own (the next free one)."""
        self._lora_ids[adapter.name] = max(self._lora_ids.values(), default=0) + 1

    def reload_in_place(self, adapter: Adapter) -> None:
        """Load ``adapter`` again from its folder under its name and LoRA id, replacing the
        weights the engine holds (vLLM's ``load_inplace``): what a training loop does that
        writes new weights to the folder it serves from."""
        import msgspec

        self.run(self.llm.add_lora(msgspec.structs.replace(self.lora_request(adapter), load_inplace=True)))

    def remove_adapter(self, adapter: Adapter) -> None:
        """Drop an adapter from the engine's caches, so that its next use loads it from disk."""
        self.run(self.llm.remove_lora(self._lora_ids[adapter.name]))

    def runtime_api_missing(self) -> str | None:
        """In process, ``add_lora`` and ``remove_lora`` are always there (over HTTP, see
        ``lorabench.targets.http.lora_api``)."""
        return None

    async def load_lora(self, adapter: Adapter) -> None:
        """Load ``adapter`` into the CPU cache while requests are served (the churn scenario
        times it); a refusal (``add_lora`` answering False) is an error."""
        if not await self.llm.add_lora(self.lora_request(adapter)):
            raise RuntimeError(f"add_lora refused adapter {adapter.name}")

    async def unload_lora(self, adapter: Adapter) -> None:
        """Drop ``adapter`` from the engine's caches while requests are served; one already
        evicted (``remove_lora`` answering False) is not an error."""
        await self.llm.remove_lora(self._lora_ids[adapter.name])
