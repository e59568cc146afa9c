"""``isolation``: with prefix caching on, does an adapter reuse KV another adapter (or its own
earlier weights) cached? On every LoRA configuration, built once with
``enable_prefix_caching`` on whatever the config says, the canaries of
``lorabench.measure.isolation`` run with up to ``CANARY_ADAPTERS`` adapters. A breach, or
caching that changes outputs, fails the case after its row and every answer (the reproducer)
are written."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from lorabench.config.traces import length_limit
from lorabench.measure.correctness import OUTPUT_LEN
from lorabench.measure.isolation import TAIL, canaries, canary_prompts, judge
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario
from lorabench.targets.http import RequestFailed

if TYPE_CHECKING:
    from lorabench.config import ConfigFile
    from lorabench.targets.engine import Engine

CANARY_ADAPTERS = 4
COLUMNS = frozenset(
    {
        "isolation_checked",
        "isolation_broken",
        "isolation_reload_broken",
        "isolation_control_changed",
        "isolation_unjudged",
        "isolation_uncached",
    }
)
# Blank where the engine does not say how many prompt tokens it found cached.
MAYBE_COLUMNS = frozenset({"isolation_cached_tokens"})


class Isolation(Scenario):
    name = "isolation"
    needs = ("engine", "lora", "reload_in_place", "cache_salt")
    columns = COLUMNS | {"input_len", "output_len"}
    maybe_columns = MAYBE_COLUMNS
    # Caching on whatever the config says: the scenario is about the cache.
    prefix_caching = True
    # The reload canary hands the server folders it writes on this machine.
    local_only = True

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        return []

    def builds(self, file: ConfigFile) -> int | None:
        return 1  # a correctness canary: a second build checks nothing a first did not

    def run(self, ctx: Context, engine: Engine) -> Outcome:  # type: ignore[override]
        adapters = list(ctx.config.adapters[:CANARY_ADAPTERS])
        if len(adapters) < 2:
            pytest.skip(f"{ctx.config.path}: the isolation canaries need 2 adapters at least, the config has 1")
        length = engine.block_size + TAIL
        limit, where = length_limit(ctx.config.file, ctx.config.model)
        if limit is not None and length + OUTPUT_LEN > limit:
            pytest.skip(
                f"the isolation canaries send prompts of a full KV block and {TAIL} tokens ({length}) and answers "
                f"of {OUTPUT_LEN}: {where} is {limit}; raise it to {length + OUTPUT_LEN} or more"
            )
        _check_target(engine)
        try:
            answers = canaries(engine, adapters, canary_prompts(engine, ctx.config.matrix.seed))
        except RequestFailed as exc:
            pytest.skip(
                f"{engine.endpoint} failed a canary's request or adapter load ({exc}): the reload canary needs "
                "a server that reads this machine's disk (not a container's own)"
            )
        verdict = judge(answers)
        fields = {
            "workload": "isolation",
            "num_adapters": len(adapters),
            "input_len": length,
            "output_len": OUTPUT_LEN,
            "rounds": 1,
            "warmup_rounds": 0,
            "isolation_checked": verdict.checked,
            "isolation_broken": len(verdict.broken),
            "isolation_reload_broken": len(verdict.reload_broken),
            "isolation_control_changed": len(verdict.changed),
            "isolation_unjudged": len(verdict.unjudged),
            "isolation_uncached": len(verdict.uncached),
            "isolation_cached_tokens": verdict.control_cached_tokens,
        }
        return Outcome(fields, [], records={"isolation": answers}, failure=verdict.failure)


def _check_target(engine: Engine) -> None:
    """Skip, saying why, where the canaries could not judge: a server without the runtime LoRA
    API (the reload canary loads through it), or one that does not say its KV block size (the
    prompts must be a full block for anything to be cached)."""
    missing = engine.runtime_api_missing()
    if missing:
        pytest.skip(f"the isolation canaries load adapters at run time: {missing}")
    if not engine.block_size:
        pytest.skip(
            f"{engine.endpoint} does not say its KV block size (vllm:cache_config_info on /metrics): the canaries' "
            "prompts must be a full block"
        )


SCENARIO = Isolation()
