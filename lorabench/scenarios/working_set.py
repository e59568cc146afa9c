"""``working_set``: requests cycling through W adapters, for each W of ``working_set.sizes``,
so the cliffs at ``max_loras`` (adapters that share a step) and at ``max_cpu_loras``
(adapters the CPU cache holds) show in throughput and TTFT.

The engine starts each size cold (every adapter removed), serves the W adapters once,
untimed, then sends the timed requests in waves of ``max_loras`` (request i uses adapter
i mod W), one wave after the other. ``timed_adapter_loads`` is the adapters vLLM's worker
loaded from disk during the waves, counted in the worker (``Engine.disk_loads``, read
outside the timing), and ``load_share`` those loads per timed request. Not a prediction
from the cache's list before a wave: vLLM loads a step's adapters in a set's order, and a
load may evict one of the wave's own cached adapters before its turn, to be loaded again.

Over HTTP nothing lists or empties the engine's cache, and the sweep needs neither: it starts
from whatever the cache holds, and the untimed pass over the W adapters leaves them in the
cache and the slots as a cold start would (an LRU keeps the last used; what was there before
is older, and goes first). The timed waves still load from disk in their requests past
``max_cpu_loras``; ``load_share`` and ``timed_adapter_loads``, which the worker counts,
stay blank (``schema.ENGINE_ONLY``), and so does the runtime LoRA API: not needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lorabench.config.target import INPROCESS
from lorabench.load.workload import Batch, Request, synthetic_prompt
from lorabench.measure.latency import RoundSample, measure_round, summarize
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario
from lorabench.scenarios.batch import COUNTED_COLUMNS, METRIC_COLUMNS

if TYPE_CHECKING:
    from lorabench.config import ConfigFile
    from lorabench.load.adapters import Adapter
    from lorabench.targets.engine import Engine

DEFAULT_INPUT_LEN = 32


class WorkingSet(Scenario):
    name = "working_set"
    columns = METRIC_COLUMNS | {"batch_size", "input_len", "output_len", "working_set"}
    # Counted in vLLM's worker: blank where the config brings its own worker extension.
    maybe_columns = COUNTED_COLUMNS | {"load_share"}

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        if file.working_set is None:
            return [Parametrization("working_set", [None], ["no-sweep"], skip_reason="the config has no 'working_set'")]
        sizes = file.working_set.sizes
        return [Parametrization("working_set", sizes, [f"ws{w}" for w in sizes])]

    def run(self, ctx: Context, engine: Engine, *, working_set: int) -> Outcome:  # type: ignore[override]
        sweep, m = ctx.config.file.working_set, ctx.config.matrix
        pool = list(ctx.config.adapters[:working_set])
        wave = engine.spec.max_loras
        count = -(-max(sweep.cycles * working_set, sweep.min_requests) // wave) * wave
        input_len = m.input_len or DEFAULT_INPUT_LEN
        prompts = [synthetic_prompt(i, input_len, engine.vocab_size, m.seed) for i in range(wave)]
        rounds: list[RoundSample] = []
        # vLLM's list of cached adapters: in process only (over HTTP nothing lists it).
        listed = engine.target == INPROCESS
        loads: list[int] = []

        def measure() -> None:
            by_name = {a.name: a for a in ctx.config.adapters}
            for name in engine.cached_adapters() if listed else ():
                engine.remove_adapter(by_name[name])
            for start in range(0, working_set, wave):
                chunk = pool[start : start + wave]
                engine.generate(prompts[: len(chunk)], chunk, 2)
            for w, first in enumerate(range(working_set, working_set + count, wave)):
                adapters = [pool[i % working_set] for i in range(first, first + wave)]
                before = engine.disk_loads()
                rounds.append(_timed_wave(engine, w, prompts, adapters, sweep.output_len))
                if before is not None:
                    loads.append(engine.disk_loads() - before)

        ctx.time(measure)
        metrics = summarize(rounds)
        counted = {"load_share": sum(loads) / count, "timed_adapter_loads": sum(loads)} if loads else {}
        fields: dict[str, Any] = {
            "workload": "cycle",
            "working_set": working_set,
            **counted,
            "batch_size": wave,
            "input_len": input_len,
            "output_len": sweep.output_len,
            "num_adapters": working_set,
            "rounds": len(rounds),
            "warmup_rounds": 0,
            **metrics,
        }
        samples = [s for r in rounds for s in r.requests]
        share = {"load_share": counted["load_share"]} if counted else {}
        return Outcome(fields, samples, extra_info={**metrics, **share})


def _timed_wave(engine: Engine, index: int, prompts: list, adapters: list[Adapter], output_len: int) -> RoundSample:
    """One wave, salted apart with prefix caching on: the waves repeat their prompts, and a
    later wave served from an earlier one's cache would hide the adapter loads it measures."""
    batch = Batch(tuple(Request(p, a) for p, a in zip(prompts, adapters)), tuple(adapters))
    salt = engine.cold_salt()
    start = engine.loop.time()
    outputs = engine.generate(prompts, adapters, output_len, cache_salt=salt)
    return measure_round(index, engine.loop.time() - start, outputs, batch, output_len)


SCENARIO = WorkingSet()
