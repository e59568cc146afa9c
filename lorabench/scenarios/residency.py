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

Over HTTP nothing lists the engine's caches, and nothing removes an adapter from them
(``lorabench.targets.http.lora_api``): the slot and cpu tiers are set up as above and follow from
vLLM's LRU, unchecked. The disk tier goes through the runtime LoRA API: before each timed
request a fresh alias of the adapter (same path, new id) is loaded with
``/v1/load_lora_adapter``, timed alone (``disk_load_ms``), and the request is sent with the
alias. So the load from disk is paid by that call, not by the request, and the disk row's
``tier_extra_ttft_ms`` adds each load's latency to its pair's difference: from the load's
send to the first token, less a slot's TTFT. A server without the API skips the disk tier,
saying how to enable it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import pytest

from lorabench.config.target import INPROCESS, URL
from lorabench.load.workload import Batch, Request
from lorabench.measure.correctness import OUTPUT_LEN, PROMPT_LEN, probe_prompt
from lorabench.measure.latency import MeasurementError, RoundSample, measure_round, summarize
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario
from lorabench.scenarios.batch import METRIC_COLUMNS

if TYPE_CHECKING:
    from lorabench.config import ConfigFile
    from lorabench.load.adapters import Adapter
    from lorabench.targets.engine import Engine
    from lorabench.targets.http.engine import HttpEngine

TIERS = ("slot", "cpu", "disk")


class Residency(Scenario):
    name = "residency"
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
        if tier == "cpu":
            _check_cpu_tier(engine, len(ctx.config.adapters))
            if engine.target == URL and engine.server_lora is None:
                pytest.skip(
                    "tier cpu needs max_cpu_loras > max_loras on the server, and this server does not say its "
                    "max_cpu_loras (unset, it is max_loras: every 'cpu' request would load from disk); start it "
                    "with VLLM_SERVER_DEV_MODE=1 (its /server_info tells), or use --bench-target serve"
                )
        if tier == "disk" and engine.target != INPROCESS:
            _check_runtime_api(engine)
        n = ctx.config.file.residency.requests
        probe = _Probe(ctx, engine, tier)
        ctx.time(lambda: probe.measure(n))
        metrics = summarize(probe.rounds)
        fields = {
            "workload": "single",
            "tier": tier,
            "batch_size": 1,
            "input_len": PROMPT_LEN,
            "output_len": OUTPUT_LEN,
            "num_adapters": 1,
            "rounds": n,
            "warmup_rounds": 0,
            "tier_extra_ttft_ms": float(np.median(probe.extra)),
            "timed_adapter_loads": n if tier == "disk" else 0,
            **metrics,
        }
        if probe.loads:
            fields["disk_load_ms"] = sum(probe.loads) / len(probe.loads) * 1000.0
        samples = [s for r in probe.rounds for s in r.requests]
        return Outcome(fields, samples, extra_info=metrics, digest_mismatches=probe.wrong)


class _Probe:
    """One tier's timed requests, each sent again at once, and the loads timed alone."""

    def __init__(self, ctx: Context, engine: Engine, tier: str) -> None:
        self.ctx, self.engine, self.tier = ctx, engine, tier
        adapters = ctx.config.adapters
        self.target, self.others = adapters[0], list(adapters[1 : 1 + engine.spec.max_loras])
        self.batch = Batch((Request(probe_prompt(engine), self.target),), (self.target,))
        self.over_http = engine.target != INPROCESS
        self.rounds: list[RoundSample] = []
        self.extra: list[float] = []
        self.loads: list[float] = []
        self.wrong = 0

    def request(self, i: int, sent: Adapter, *, judged: bool = True) -> RoundSample:
        """The probe sent with ``sent`` (the target, or its alias), recorded as the target's;
        salted apart with prefix caching on, so that its repeats are not served from its cache.
        ``judged``: its answer is the tier's, and a wrong one counts in ``digest_mismatches``
        (a repeat's adapter is in a slot by then: its answer is not the tier's)."""
        salt = self.engine.cold_salt()
        start = self.engine.loop.time()
        outputs = self.engine.generate(
            [self.batch.requests[0].prompt], [sent], OUTPUT_LEN, greedy=True, cache_salt=salt
        )
        elapsed = self.engine.loop.time() - start
        self.wrong += judged and not self.ctx.digests.matches(self.target, outputs[0].outputs[0].token_ids)
        return measure_round(i, elapsed, outputs, self.batch, OUTPUT_LEN)

    def measure(self, n: int) -> None:
        engine, target = self.engine, self.target
        if self.tier == "slot":
            engine.generate([self.batch.requests[0].prompt], [target], OUTPUT_LEN, greedy=True)
        set_up = _set_up_http if self.over_http else _set_up
        for i in range(n):
            sent, load_s = set_up(engine, self.tier, target, self.others)
            try:
                self.rounds.append(self.request(i, sent))
                again = self.request(i, sent, judged=False).requests[0].ttft_ms
            finally:
                if sent is not target:
                    _drop_alias(engine, sent)
            self.extra.append(self.rounds[-1].requests[0].ttft_ms - again + load_s * 1000.0)
            if sent is not target:
                self.loads.append(load_s)
        for _ in range(n if self.tier == "disk" and not self.over_http else 0):
            self.loads.append(engine.add_adapter(target))


def _drop_alias(engine: Engine, alias: Adapter) -> None:
    """Unload an alias the probe loaded; a failure is a warning, never the case's error: it
    would hide the request's own, and the requests measured do not depend on it."""
    try:
        engine.unload_alias(alias)
    except Exception as exc:  # noqa: BLE001 - said, and the server keeps one name more
        warnings.warn(f"{engine.id}: alias {alias.name} left registered: {exc}", RuntimeWarning, stacklevel=2)


def _check_cpu_tier(engine: Engine, adapters: int) -> None:
    """An adapter is warm in the CPU cache only when the cache outlives the slots, and
    evicting it from every slot takes max_loras other adapters."""
    spec = engine.spec
    if spec.max_cpu_loras <= spec.max_loras or adapters < spec.max_loras + 1:
        pytest.skip(
            f"tier cpu needs max_cpu_loras > max_loras and {spec.max_loras + 1} adapters "
            f"({engine.id} has max_cpu_loras {spec.max_cpu_loras}, the config {adapters} adapters)"
        )


def _check_runtime_api(engine: HttpEngine) -> None:
    """The disk tier over HTTP loads through the runtime LoRA API: skip, saying how to enable
    it, where the server has none."""
    missing = engine.runtime_api_missing()
    if missing:
        pytest.skip(f"tier disk over HTTP loads adapters with /v1/load_lora_adapter, and {missing}")


def _set_up_http(engine: HttpEngine, tier: str, target: Adapter, others: list[Adapter]) -> tuple[Adapter, float]:
    """Over HTTP: what to send, and the seconds a load took before it (0 but for the disk tier).
    ``slot`` and ``cpu`` as in process, unchecked; ``disk``: a fresh alias of ``target`` loaded
    from disk through the runtime API, timed alone."""
    if tier == "cpu":
        engine.generate([[1] * PROMPT_LEN], [target], 2)
        engine.generate([[1] * PROMPT_LEN] * len(others), others, 2)
    if tier == "disk":
        return engine.load_alias(target)
    return target, 0.0


def _set_up(engine: Engine, tier: str, target: Adapter, others: list[Adapter]) -> tuple[Adapter, float]:
    """Put ``target`` in ``tier`` by what is served (or removed) now, and check it; what to
    send (``target``), and no load before it."""
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
    return target, 0.0


SCENARIO = Residency()
