"""``residency``: what a request costs when its adapter is in a device slot, in the CPU
cache only, or on disk.

One adapter is measured, one request at a time (the correctness probe: a fixed prompt,
answered greedily, so each answer is also checked against the adapter's digest). Before
each timed request the tier is set up by what is served just before it, and checked with
vLLM's own list of the adapters in its CPU cache (``list_loras``):

- ``slot``: the adapter was served just before, so it still holds one of the
  ``max_loras`` device slots (vLLM lists slots nowhere; this follows from its LRU);
- ``cpu``: ``max_loras`` other adapters were served together just before, taking every
  slot, while the adapter stays in the CPU cache (listed); needs ``max_cpu_loras > max_loras``;
- ``disk``: the adapter was removed (``remove_lora``; not listed), so the request loads it.

Each timed request is sent again at once (its adapter now in a slot), and
``tier_extra_ttft_ms`` is the median of the differences: what the tier costs over a slot,
measured back to back, so the drift of the machine between cases (larger than a tiny
adapter's load on a CPU) cancels. The repeats are not samples of the tier. The ``disk``
row also carries ``disk_load_ms``: ``add_lora`` of the removed adapter, timed on its own,
as many times as there are requests. ``timed_adapter_loads`` counts the timed requests
that loaded their adapter from disk: all of them in the disk tier, none in the others.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import pytest

from lorabench.correctness import OUTPUT_LEN, PROMPT_LEN, probe_prompt
from lorabench.measure import MeasurementError, RoundSample, measure_round, summarize
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario
from lorabench.scenarios.batch import METRIC_COLUMNS
from lorabench.workload import Batch, Request

if TYPE_CHECKING:
    from lorabench.adapters import Adapter
    from lorabench.config import ConfigFile
    from lorabench.engine import Engine

TIERS = ("slot", "cpu", "disk")


class Residency(Scenario):
    name = "residency"
    # It moves adapters between the engine's caches (add_lora, remove_lora, list_loras): over
    # HTTP that needs the runtime load API, not done yet.
    http_skip_reason = "needs the engine's adapter caches; over HTTP that is the runtime load API, not supported yet"
    columns = METRIC_COLUMNS | {
        "batch_size",
        "input_len",
        "output_len",
        "tier",
        "tier_extra_ttft_ms",
        "timed_adapter_loads",
    }
    maybe_columns = frozenset({"disk_load_ms"})

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        if file.residency is None:
            return [Parametrization("tier", [None], ["no-residency"], skip_reason="the config has no 'residency'")]
        return [Parametrization("tier", TIERS, TIERS)]

    def run(self, ctx: Context, engine: Engine, *, tier: str) -> Outcome:  # type: ignore[override]
        spec, adapters = engine.spec, ctx.config.adapters
        target, others = adapters[0], list(adapters[1 : 1 + spec.max_loras])
        if tier == "cpu":
            _check_cpu_tier(engine, len(adapters))
        n = ctx.config.file.residency.requests
        batch = Batch((Request(probe_prompt(engine), target),), (target,))
        rounds: list[RoundSample] = []
        extra: list[float] = []
        loads: list[float] = []
        wrong = 0

        def request(i: int) -> RoundSample:
            nonlocal wrong
            start = time.perf_counter()
            outputs = engine.generate([batch.requests[0].prompt], [target], OUTPUT_LEN, greedy=True)
            elapsed = time.perf_counter() - start
            wrong += not ctx.digests.matches(target, outputs[0].outputs[0].token_ids)
            return measure_round(i, elapsed, outputs, batch, OUTPUT_LEN)

        def measure() -> None:
            if tier == "slot":
                engine.generate([batch.requests[0].prompt], [target], OUTPUT_LEN, greedy=True)
            for i in range(n):
                _set_up(engine, tier, target, others)
                rounds.append(request(i))
                extra.append(rounds[-1].requests[0].ttft_ms - request(i).requests[0].ttft_ms)
            for _ in range(n if tier == "disk" else 0):
                loads.append(engine.add_adapter(target))

        ctx.time(measure)
        metrics = summarize(rounds)
        fields = {
            "workload": "single",
            "tier": tier,
            "batch_size": 1,
            "input_len": PROMPT_LEN,
            "output_len": OUTPUT_LEN,
            "num_adapters": 1,
            "rounds": n,
            "warmup_rounds": 0,
            "tier_extra_ttft_ms": float(np.median(extra)),
            "timed_adapter_loads": n if tier == "disk" else 0,
            **metrics,
        }
        if loads:
            fields["disk_load_ms"] = sum(loads) / len(loads) * 1000.0
        samples = [s for r in rounds for s in r.requests]
        return Outcome(fields, samples, extra_info=metrics, digest_mismatches=wrong)


def _check_cpu_tier(engine: Engine, adapters: int) -> None:
    """An adapter is warm in the CPU cache only when the cache outlives the slots, and
    evicting it from every slot takes max_loras other adapters."""
    spec = engine.spec
    if spec.max_cpu_loras <= spec.max_loras or adapters < spec.max_loras + 1:
        pytest.skip(
            f"tier cpu needs max_cpu_loras > max_loras and {spec.max_loras + 1} adapters "
            f"({engine.id} has max_cpu_loras {spec.max_cpu_loras}, the config {adapters} adapters)"
        )


def _set_up(engine: Engine, tier: str, target: Adapter, others: list[Adapter]) -> None:
    """Put ``target`` in ``tier`` by what is served (or removed) now, and check it."""
    if tier == "cpu":
        if target.name not in engine.cached_adapters():
            engine.generate([[1] * PROMPT_LEN], [target], 2)
        engine.generate([[1] * PROMPT_LEN] * len(others), others, 2)
    elif tier == "disk" and target.name in engine.cached_adapters():
        engine.remove_adapter(target)
    cached = target.name in engine.cached_adapters()
    if cached != (tier != "disk"):
        raise MeasurementError(
            f"tier {tier}: vLLM lists adapter {target.name} as {'' if cached else 'not '}in its CPU cache"
        )


SCENARIO = Residency()
