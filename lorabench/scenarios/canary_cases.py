"""What every canary case does around its check (its fields, whether its requests fit the
model, what it could not judge), and the checks judged across two builds of one configuration:
spec_decode and chunked_prefill (``lorabench.measure.canary_variants``), whose plain build's
case keeps the reference answers and whose variant build's case judges against them."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from lorabench.config.target import URL
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
    the reference answers, kept; on the variant build, its answers judged against them."""
    variant, spec = VARIANT_OF[canary], engine.spec
    if engine.target == URL:
        pytest.skip(f"{canary} needs a build of its own ({variant}); the server at {engine.endpoint} runs as started")
    conflict = plain_conflict(variant, ctx.config.file.engine.model_dump(), variants.prompt_len(canary))
    if conflict:
        pytest.skip(f"{ctx.config.path}: {canary}: {conflict}")
    fits(ctx, canary, variants.prompt_len(canary), variants.OUTPUT_LEN)
    adapters = list(ctx.config.adapters)[: variants.VARIANT_ADAPTERS]
    ask = Asker(engine, variants.variant_prompts(canary, engine.vocab_size, ctx.config.matrix.seed))
    drafted = engine.draft_tokens()
    variants.send(ask, adapters)
    if drafted is not None:
        drafted = (engine.draft_tokens() or 0) - drafted
    known = fields(canary, len(adapters), variants.prompt_len(canary), variants.OUTPUT_LEN)
    path = ctx.keep(KIND, ask.answers, known)
    if not spec.engine_variant:
        verdict = Verdict(0, [], [])  # the reference: the variant build's case is judged against it
    else:
        plain = replace(spec, engine_variant="").id
        kept = kept_answers(path, canary, engine.id)
        verdict = Verdict(*variants.judge_variant(kept, engine.id, plain, variant, drafted))
    say_unjudged(ctx, engine, canary, verdict)
    return Outcome({**known, **verdict.columns()}, [], failure=verdict.failure(title))


def say_unjudged(ctx: Context, engine: Engine, canary: str, verdict: Verdict) -> None:
    """A check that passed or was not judged says on the terminal what it could not judge."""
    if verdict.unjudged and not verdict.failed and ctx.progress is not None:
        ctx.progress(f"canary {canary} on {engine.id}: not judged: {'; '.join(verdict.unjudged)}")
