"""lorabench's extension of vLLM's worker (``worker_extension_cls``): the adapters the worker
has loaded from disk, counted where vLLM loads them.

Why count in the worker: vLLM loads a step's adapters in the order of a Python set of LoRA
requests, hashed by name (``LRUCacheWorkerLoRAManager._apply_adapters``), and a load evicts
the oldest adapter of the CPU cache, which may be one of the step's own not yet touched. So
which adapters a step loads, and how many, cannot be told from ``list_loras`` before it: a
wave of 8 with 4 cached loads anywhere from 4 to 8. The count here is what vLLM did.

This module is imported inside vLLM's worker process: it imports nothing but the standard library.
"""

from __future__ import annotations

from typing import Any

QUALNAME = "lorabench.targets.vllm_worker.DiskLoadCounter"
# The method ``collective_rpc`` calls; the stand-in engine answers the same name.
DISK_LOADS = "lorabench_disk_loads"
REPLACED = (
    "engine.worker_extension_cls replaces lorabench's own, which counts vLLM's adapter loads from disk: "
    "timed_adapter_loads and load_share stay blank"
)


class DiskLoadCounter:
    """Mixed into vLLM's worker class by vLLM itself (``WorkerWrapperBase``)."""

    model_runner: Any

    def lorabench_disk_loads(self) -> int | None:
        """Adapters loaded from disk since the first call (which starts the count at 0); None
        where the worker has no LoRA manager to count in (LoRA off, or a worker that keeps
        it elsewhere)."""
        manager = getattr(getattr(self, "model_runner", None), "lora_manager", None)
        if manager is None or not hasattr(manager, "_load_adapter"):
            return None
        if not hasattr(manager, "_lorabench_disk_loads"):
            load = manager._load_adapter

            def counted(request: Any) -> Any:
                lora = load(request)
                manager._lorabench_disk_loads += 1
                return lora

            manager._lorabench_disk_loads = 0
            manager._load_adapter = counted
        return manager._lorabench_disk_loads
