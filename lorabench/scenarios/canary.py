"""``canary``: LoRA correctness canaries, one case a class of real multi-LoRA bug
(docs/canaries.md). Each check answers greedily with a few tokens and is judged from the
answers' token ids (``lorabench.measure.canary``, ``canary_judge``): it passes, FAILS (the case
fails after its row and every answer, the reproducer, are written), or is not judged where its
reference cannot tell. The classes a CPU engine cannot run are collected, named, and skipped
with the reason.

The scenario runs on the lora-off build too (``with_lora_off``): the base_changed check compares
a LoRA build's base answers with it. pytest shares session-scoped engines by value, so that is
the lora-off build ``no_lora`` builds, in a run that has both, and the LoRA builds are build 0 of
the configurations the other scenarios use: the canaries add no build to such a run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from lorabench.config.target import INPROCESS
from lorabench.config.variants import plain_conflict
from lorabench.load.padded import CannotPad, padded_adapter
from lorabench.measure import canary as send
from lorabench.measure import canary_variants as variants
from lorabench.measure.canary import (
    BASE_CHANGED,
    BATCH,
    CANARY_ADAPTERS,
    LOGPROBS_ADAPTERS,
    NO_EFFECT,
    PADDED_ADAPTERS,
    PROMPT_LEN,
    PROMPT_LOGPROBS,
    RANK_PADDING,
    SWAP,
)
from lorabench.measure.canary_judge import (
    judge_base_changed,
    judge_batch,
    judge_no_effect,
    judge_prompt_logprobs,
    judge_rank_padding,
    judge_swap,
)
from lorabench.measure.canary_records import KIND, Asker, kept_answers
from lorabench.measure.canary_variants import CHUNKED_PREFILL, SPEC_DECODE, VARIANT_OF
from lorabench.measure.correctness import OUTPUT_LEN
from lorabench.scenarios import canary_cases as cases
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario

if TYPE_CHECKING:
    from lorabench.config import ConfigFile, EngineSpec
    from lorabench.load.adapters import Adapter
    from lorabench.targets.engine import Engine

# The checks that run, by the class each names in a finding, in the order they run on a build:
# the ones judged against a variant build first, so that the plain build answers them as fresh
# as the variant build does; swap_eviction last, since it evicts and reloads: a reload that
# serves stale weights then shows in its own case, not as another check's finding.
CLASSES = {
    SPEC_DECODE: "an adapter answers otherwise with n-gram speculative decoding than with plain decoding",
    CHUNKED_PREFILL: "an adapter answers a prompt prefilled in chunks otherwise than prefilled whole",
    NO_EFFECT: "adapter has no effect",
    BASE_CHANGED: "enabling LoRA changes base requests",
    BATCH: "an adapter answers otherwise in a mixed batch",
    PROMPT_LOGPROBS: "an adapter's request that asks for prompt logprobs fails, answers otherwise or gets wrong values",
    RANK_PADDING: "an adapter answers otherwise than itself padded to max_lora_rank",
    SWAP: "an adapter answers otherwise after it was evicted and loaded again",
}
# The classes named and skipped, with the reason.
NOT_RUN = {
    "tensor_parallel": (
        "LoRA slots sharded over tensor-parallel ranks (reported upstream: vLLM PR #20873) need an engine at "
        "tensor_parallel_size 2 or more on 2 devices, and vLLM's CPU backend is run at 1 here. A config whose "
        "engine sets tensor_parallel_size runs the other checks on it"
    ),
    "graph_capture": (
        "a LoRA mapping frozen into a captured CUDA or ACL graph (reported upstream: vLLM #42999, vllm-ascend "
        "PR #14225) cannot show on vLLM's CPU backend, which captures no graphs (cudagraph_capture_sizes is "
        "empty); on a GPU or NPU the batch_invariance check runs on graph-mode engines (enforce_eager false)"
    ),
    "dp_runtime_loading": (
        "adapters loaded at run time into a data-parallel deployment need a vllm serve with data_parallel_size "
        "2 or more and its /v1/load_lora_adapter; in process the canaries build one engine. "
        "scripts/dp_runtime_loading.sh runs the class by hand on the CPU"
    ),
}
COLUMNS = frozenset({"canary_verdict", "canary_checked", "canary_failed", "canary_unjudged"})


class Canary(Scenario):
    name = "canary"
    with_lora_off = True
    columns = COLUMNS | {"input_len", "output_len"}

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        skipped = [pytest.param(n, id=n, marks=pytest.mark.skip(reason=f"{n}: {r}")) for n, r in NOT_RUN.items()]
        return [Parametrization("canary", [*CLASSES, *skipped], ids=[*CLASSES, *NOT_RUN])]

    def builds(self, file: ConfigFile) -> int | None:
        return 1  # a correctness canary: a second build checks nothing a first did not

    def variants_for(self, file: ConfigFile) -> tuple[str, ...]:
        """The variant builds whose plain reference the config's builds can be (a config that
        speculates already cannot be spec_decode's: its check on the plain build says why)."""
        engine = file.engine.model_dump()
        return tuple(v for c, v in VARIANT_OF.items() if not plain_conflict(v, engine, variants.prompt_len(c)))

    def runs_on(self, spec: EngineSpec, params: dict[str, object]) -> bool:
        """A variant build runs its own check only; that check runs there and, for its
        reference, on the LoRA builds of the configurations' own (the variant's among them)."""
        wanted = VARIANT_OF.get(str(params.get("canary")))
        if spec.engine_variant:
            return wanted == spec.engine_variant
        return not wanted or spec.enable_lora

    def run(self, ctx: Context, engine: Engine, *, canary: str) -> Outcome:  # type: ignore[override]
        if canary in VARIANT_OF:
            return cases.variant_check(ctx, engine, canary, CLASSES[canary])
        adapters = _adapters(ctx, engine, canary)
        cases.fits(ctx, canary, PROMPT_LEN, OUTPUT_LEN)
        ask = Asker(engine, send.canary_prompts(engine, ctx.config.matrix.seed))
        pairs = _padded_pairs(engine, adapters) if canary == RANK_PADDING else []
        fillers = _fillers(ctx, engine) if canary == RANK_PADDING else []
        evicted, raised = _send(canary, engine, ask, adapters, pairs, fillers)
        fields = cases.fields(canary, len(adapters), PROMPT_LEN, OUTPUT_LEN)
        # Every answer made durable before any verdict: the reproducer, and base_changed's reference.
        path = ctx.keep(KIND, ask.answers, fields)
        if canary == NO_EFFECT:
            verdict = judge_no_effect(ask.answers, {a.name for a in adapters if a.same_as_base})
        elif canary == BASE_CHANGED:
            verdict = judge_base_changed(kept_answers(path, canary, engine.id), engine.id, engine.spec.enable_lora)
        elif canary == BATCH:
            verdict = judge_batch(ask.answers)
        elif canary == PROMPT_LOGPROBS:
            verdict = judge_prompt_logprobs(ask.answers, raised)
        elif canary == RANK_PADDING:
            verdict = judge_rank_padding(ask.answers, {padded.name: a.name for a, padded in pairs})
        else:
            verdict = judge_swap(ask.answers, evicted)
        cases.say_unjudged(ctx, engine, canary, verdict)
        return Outcome({**fields, **verdict.columns()}, [], failure=verdict.failure(CLASSES[canary]))


def _adapters(ctx: Context, engine: Engine, canary: str) -> list[Adapter]:
    """The adapters ``canary`` uses on ``engine``; a skip, saying why, where it cannot run."""
    adapters = list(ctx.config.adapters)
    if not engine.spec.enable_lora:
        if canary != BASE_CHANGED:
            pytest.skip(f"{canary} runs on LoRA engines: {engine.id} answers the base_changed check's reference only")
        return []
    if canary == NO_EFFECT and len(adapters) < 2:
        pytest.skip(
            f"{ctx.config.path}: no_effect needs 2 adapters at least (another adapter shows a prompt can tell), "
            f"the config has {len(adapters)}"
        )
    if canary == SWAP:
        slots, cached = engine.spec.max_loras or 1, engine.spec.max_cpu_loras or 0
        if len(adapters) <= slots:
            pytest.skip(
                f"{ctx.config.path}: swap_eviction needs more adapters than max_loras ({slots}) to evict one from "
                f"its slot; the config has {len(adapters)}"
            )
        # Enough others to push it out of the CPU cache too, where the config has them.
        return adapters[: 1 + (cached if len(adapters) > cached else slots)]
    if canary == BATCH:
        return adapters[: min(CANARY_ADAPTERS, engine.spec.max_loras or 1)]
    if canary == PROMPT_LOGPROBS:
        if engine.target != INPROCESS:
            pytest.skip(
                "prompt_logprobs runs in process: vLLM refuses prompt_logprobs on a streamed completion, and "
                f"lorabench's requests to {engine.target} stream"
            )
        return adapters[:LOGPROBS_ADAPTERS]
    if canary == RANK_PADDING:
        return _below_max_rank(ctx, engine, adapters)
    return adapters[:CANARY_ADAPTERS] if canary == NO_EFFECT else []


def _below_max_rank(ctx: Context, engine: Engine, adapters: list[Adapter]) -> list[Adapter]:
    """The adapters rank_padding pads: of a rank below ``max_lora_rank``; a skip where none is,
    or where the engine cannot load a copy at run time."""
    top = engine.spec.max_lora_rank
    if not top:
        pytest.skip(f"{ctx.config.path}: rank_padding pads to max_lora_rank, which the config leaves to vLLM")
    below = [a for a in adapters if a.rank and a.rank < top]
    if not below:
        pytest.skip(
            f"{ctx.config.path}: rank_padding needs an adapter of a rank below max_lora_rank ({top}): the "
            f"config's are of rank {sorted({a.rank for a in adapters})}"
        )
    missing = engine.runtime_api_missing()
    if missing:
        pytest.skip(f"rank_padding loads a padded copy of an adapter at run time: {missing}")
    return below


def _padded_pairs(engine: Engine, adapters: list[Adapter]) -> list[tuple[Adapter, Adapter]]:
    """Up to ``PADDED_ADAPTERS`` adapters, each as a copy at its own rank and a copy padded to
    ``max_lora_rank``, both registered with the engine; a skip, with the reasons, where none can
    be padded exactly."""
    pairs, refused = [], []
    for adapter in adapters:
        try:
            pair = padded_adapter(adapter, adapter.rank or 0), padded_adapter(adapter, engine.spec.max_lora_rank or 0)
        except CannotPad as exc:
            refused.append(f"{adapter.name}: {exc}")
            continue
        for copy in pair:
            engine.register(copy)
        pairs.append(pair)
        if len(pairs) == PADDED_ADAPTERS:
            break
    if not pairs:
        pytest.skip(f"rank_padding cannot pad any adapter to the same function: {'; '.join(refused)}")
    return pairs


def _fillers(ctx: Context, engine: Engine) -> list[Adapter]:
    """The config's adapters of rank ``max_lora_rank``, one a device slot (fewer if it has
    fewer): what rank_padding fills the slots with before each copy. None: the slots' leftover
    rows are not tried, which the terminal says."""
    top, slots = engine.spec.max_lora_rank, engine.spec.max_loras or 1
    full = [a for a in ctx.config.adapters if top and a.rank == top][:slots]
    if not full and ctx.progress is not None:
        ctx.progress(f"canary rank_padding on {engine.id}: no adapter of rank {top} fills the slots first")
    return full


def _send(
    canary: str,
    engine: Engine,
    ask: Asker,
    adapters: list[Adapter],
    pairs: list[tuple[Adapter, Adapter]],
    fillers: list[Adapter],
) -> tuple[str, list[tuple[str, str]]]:
    """Send ``canary``'s requests; what evicted the adapter (swap_eviction's findings say it),
    and the requests that raised (prompt_logprobs's findings)."""
    if canary == NO_EFFECT:
        send.no_effect(ask, adapters)
    elif canary == BASE_CHANGED:
        send.base_answers(ask)
    elif canary == BATCH:
        send.batch_invariance(ask, adapters)
    elif canary == PROMPT_LOGPROBS:
        return "", send.prompt_logprobs(ask, adapters)
    elif canary == RANK_PADDING:
        send.rank_padding(ask, pairs, fillers)
    else:
        return send.swap_eviction(engine, ask, adapters[0], adapters[1:]), []
    return "", []


SCENARIO = Canary()
