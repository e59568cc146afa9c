"""The closed-loop estimate a capacity search starts from (``lorabench.scenarios.capacity_probes``):
what the engine serves with no latency target."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from lorabench.load.workload import synthetic_prompt
from lorabench.targets.clock import now

if TYPE_CHECKING:
    from lorabench.load.adapters import Adapter
    from lorabench.load.traces.synthetic import TraceRequest
    from lorabench.targets.engine import Engine


async def closed_loop(
    engine: Engine, requests: Sequence[TraceRequest], adapters: Mapping[str, Adapter], concurrency: int
) -> float:
    """Requests per second with ``concurrency`` in flight, each sent as soon as one finishes:
    what the engine serves with no latency target, the upper bound the search starts under."""
    queue = list(enumerate(requests))[::-1]
    vocab = engine.vocab_size

    async def worker() -> None:
        while queue:
            index, r = queue.pop()
            prompt = synthetic_prompt(index, r.input_len, vocab, seed=0)
            async for _ in engine.stream(
                prompt, engine.sampling_params(r.output_len, stream=True), adapters[r.adapter]
            ):
                pass

    started = now()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    return len(requests) / (now() - started)
