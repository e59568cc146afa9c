"""The environment a vLLM engine is built in, for the plugin's engines and for every script
that builds one (``scripts/repro_reload_in_place.py``, ``scripts/crosscheck_vllm_latency.py``):
one function, so a script run on another host gets what the plugin would have given it (the
config's ``VLLM_CPU_KVCACHE_SPACE``, say: unset, vLLM's CPU backend asks for most of memory
and refuses to start on a host with less free).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from lorabench.host.memory import ACCELERATORS

SPAWN = "VLLM_WORKER_MULTIPROC_METHOD"
# vLLM loads a step's adapters in the order of a set of requests hashed by name: with the
# engine's processes' string hashes seeded alike, every build loads them in one order (a
# random one per process made timed_adapter_loads, and the waves' times, differ by build).
HASH_SEED = "PYTHONHASHSEED"


def engine_environment(env: Mapping[str, Any], device_type: str) -> dict[str, str]:
    """The config's variables (``env``), plus spawn for the engine's processes on an accelerator
    and their string hashes seeded (``HASH_SEED``).

    vLLM forks its engine core unless something forces spawn; it forces it for an
    initialized CUDA context and on the CPU, not on Ascend, where a forked child
    cannot initialize torch_npu again. Spawn is safe everywhere; a value the user set
    (in the environment or the config's ``env``) wins.
    """
    found = {k: str(v) for k, v in env.items()}
    if device_type in ACCELERATORS and SPAWN not in found and SPAWN not in os.environ:
        found[SPAWN] = "spawn"
    if HASH_SEED not in found and HASH_SEED not in os.environ:
        found[HASH_SEED] = "0"
    return found


@contextmanager
def applied(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` set in this process's environment, and what was there before put back after."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
