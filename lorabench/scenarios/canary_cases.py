"""What every canary case does around its check (its fields, whether its requests fit the
model, what it could not judge), and the checks judged across two builds of one configuration:
spec_decode and chunked_prefill (``lorabench.measure.canary_variants``), whose plain build's
case keeps the reference answers and whose variant build's case judges against them."""

from __future__ import annotations

import weakref
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from lorabench.config.target import INPROCESS
from lorabench.config.traces import length_limit
from lorabench.config.variants import plain_conflict
from lorabench.measure import canary_variants as variants
from lorabench.measure.canary_judge import Verdict
from lorabench.measure.canary_records import KIND, Asker, kept_answers
from lorabench.measure.canary_variants import VARIANT_OF
from lorabench.scenarios.base import Context, Outcome

if TYPE_CHECKING:
    from lorabench.targets.engine import Engine


def fits(ctx: Context, canary: str, input_len: int, output_len: int) -> None:
    """A skip, saying why, where the check's prompts and answers do not fit the model."""
    limit, where = length_limit(ctx.config.file, ctx.config.model)
    if limit is not None and input_len + output_len > limit:
        pytest.skip(f"{canary} sends prompts of {input_len} tokens and answers of {output_len}: {where} is {limit}")


def fields(canary: str, adapters: int, input_len: int, output_len: int) -> dict[str, object]:
    """A check's row fields known before its verdict: it answers once, unwarmed."""
    return {
        "workload": canary,
        "num_adapters": adapters,
        "input_len": input_len,
        "output_len": output_len,
        "rounds": 1,
        "warmup_rounds": 0,
    }


def variant_check(ctx: Context, engine: Engine, canary: str, title: str) -> Outcome:
    """spec_decode or chunked_prefill (``lorabench.measure.canary_variants``): on a plain build,
    the reference answers, kept; on the variant build, its answers judged against them. In
    process only: there lorabench reads what the build's scheduler and draft counter did."""
    variant, spec = VARIANT_OF[canary], engine.spec
    if engine.target != INPROCESS:
        pytest.skip(
            f"{canary} runs in process, where lorabench reads the {variant} build's scheduler settings and "
            f"draft counter; {engine.target} does not build it"
        )
    conflict = plain_conflict(variant, ctx.config.file.engine.model_dump(), variants.prompt_len(canary))
    if conflict:
        pytest.skip(f"{ctx.config.path}: {canary}: {conflict}")
    fits(ctx, canary, variants.prompt_len(canary), variants.OUTPUT_LEN)
    budget = scheduled_budget(engine)
    if not spec.engine_variant and budget is not None and budget < variants.prompt_len(canary):
        pytest.skip(f"{canary}: {engine.id} prefills at most {budget} tokens a step: it cannot answer unsplit")
    adapters = list(ctx.config.adapters)
    checked = adapters[: variants.VARIANT_ADAPTERS]
    fillers = adapters[variants.VARIANT_ADAPTERS :][: engine.spec.max_loras or 1]
    for earlier in _sent_before(ctx, engine, canary):  # the plain build's history, replayed: equal starts
        replay = Asker(engine, variants.variant_prompts(earlier, engine.vocab_size, ctx.config.matrix.seed))
        variants.send(replay, checked, fillers, engine.draft_tokens)
    ask = Asker(engine, variants.variant_prompts(canary, engine.vocab_size, ctx.config.matrix.seed))
    drafts = variants.send(ask, checked, fillers, engine.draft_tokens)
    known = fields(canary, len(checked), variants.prompt_len(canary), variants.OUTPUT_LEN)
    path = ctx.keep(KIND, ask.answers, known)
    if not spec.engine_variant:
        verdict = Verdict(0, [], [])  # the reference: the variant build's case is judged against it
    else:
        plain = replace(spec, engine_variant="").id
        ran = variants.feature_ran(variant, budget, drafts)
        kept = kept_answers(path, canary, engine.id)
        verdict = Verdict(*variants.judge_variant(kept, engine.id, plain, variant, ran))
    say_unjudged(ctx, engine, canary, verdict)
    return Outcome({**known, **verdict.columns()}, [], failure=verdict.failure(title))


# By session (its wall clock, alive as long as the session), the variant checks each plain
# build answered, in order: a variant build replays those before its own, so that it starts
# from the adapter slots and caches the plain build's reference started from.
_SENT: dict[int, tuple[weakref.ref, dict[str, list[str]]]] = {}


def _sent_before(ctx: Context, engine: Engine, canary: str) -> list[str]:
    """On the plain build, record ``canary`` as sent (nothing to replay); on a variant build, the
    checks its plain build answered before ``canary``'s reference."""
    key = id(ctx.clock)
    if key not in _SENT or _SENT[key][0]() is not ctx.clock:
        _SENT[key] = (weakref.ref(ctx.clock), {})
    sent = _SENT[key][1]
    if not engine.spec.engine_variant:
        sent.setdefault(engine.id, []).append(canary)
        return []
    plain = sent.get(replace(engine.spec, engine_variant="").id, [])
    return plain[: plain.index(canary)] if canary in plain else []


def scheduled_budget(engine: Engine) -> int | None:
    """The most prompt tokens the build prefills a step, as its scheduler was configured (vLLM
    may change what it was given: on the CPU it turns chunking off for some models); None
    where the engine does not say."""
    scheduler = getattr(getattr(engine.llm, "vllm_config", None), "scheduler_config", None)
    if scheduler is None:
        return None
    if not getattr(scheduler, "enable_chunked_prefill", True):
        return 1 << 30  # no chunking: a prompt is prefilled whole
    return int(scheduler.max_num_batched_tokens)


def say_unjudged(ctx: Context, engine: Engine, canary: str, verdict: Verdict) -> None:
    """A check that passed or was not judged says on the terminal what it could not judge."""
    if verdict.unjudged and not verdict.failed and ctx.progress is not None:
        ctx.progress(f"canary {canary} on {engine.id}: not judged: {'; '.join(verdict.unjudged)}")
