"""The canaries judged across two builds of one configuration: its own (plain) build and a
variant build with one vLLM feature on (``lorabench.config.variants``).

- **spec_decode**: with n-gram speculation, greedy decoding must answer token for token as plain
  decoding does: a draft is kept only where it is what the target model would have sampled. The
  prompts repeat a short run of tokens, so the n-gram lookup finds drafts from the first step.
- **chunked_prefill**: a prompt longer than the chunked build's token budget a step is prefilled
  over several steps there; it must answer as the plain build, which prefills it in one.

Each check sends the base model and a few adapters, each alone, on each prompt, on both builds
(the plain build's case keeps the reference; the variant build's case judges against it). The
base model's answers are the control: where they change too, the feature changes answers with
no LoRA in the request, and the adapters are not judged for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from lorabench.config.variants import CHUNK_TOKENS, CHUNKED, SPEC_NGRAM
from lorabench.load.workload import synthetic_prompt
from lorabench.measure.canary_records import BASE, shown

if TYPE_CHECKING:
    from lorabench.load.adapters import Adapter
    from lorabench.measure.canary_records import Asker

SPEC_DECODE, CHUNKED_PREFILL = "spec_decode", "chunked_prefill"
# The variant build each check judges.
VARIANT_OF = {SPEC_DECODE: SPEC_NGRAM, CHUNKED_PREFILL: CHUNKED}
WHAT = {SPEC_NGRAM: "with n-gram speculation", CHUNKED: f"prefilled in chunks of {CHUNK_TOKENS} tokens"}
VARIANT_ADAPTERS = 2
PROMPTS = 2
# Answers long enough that speculation drafts over many steps.
OUTPUT_LEN = 16
# spec_decode's prompts: a run of tokens repeated, which the n-gram lookup finds in the prompt.
RUN_LEN, RUNS = 8, 4
# chunked_prefill's prompts: two full chunks and a part of one.
CHUNKED_LEN = 2 * CHUNK_TOKENS + CHUNK_TOKENS // 2
PROMPT_SEED = 20261202
ALONE, FILL = "alone", "fill"


def variant_prompts(check: str, vocab_size: int, seed: int) -> list[list[int]]:
    """The check's ``PROMPTS`` prompts from the run's seed: the same on both builds."""
    if check == SPEC_DECODE:
        return [synthetic_prompt(i, RUN_LEN, vocab_size, PROMPT_SEED + seed) * RUNS for i in range(PROMPTS)]
    return [synthetic_prompt(i, CHUNKED_LEN, vocab_size, PROMPT_SEED + seed) for i in range(PROMPTS)]


def prompt_len(check: str) -> int:
    return RUN_LEN * RUNS if check == SPEC_DECODE else CHUNKED_LEN


def send(
    ask: Asker, adapters: Sequence[Adapter], fillers: Sequence[Adapter], draft_tokens: Callable[[], int | None]
) -> dict[tuple[str, int], int | None]:
    """``fillers`` one token each first (so that the check's adapters start out of the device
    slots on every build, whatever ran before), then each prompt: the base model, then each
    adapter, each alone. The draft tokens each request got (None where the engine counts none)."""
    if fillers:
        ask.batch([(f, 0) for f in fillers], FILL, output_len=1)
    drafts = {}
    for k in range(PROMPTS):
        for adapter in (None, *adapters):
            before = draft_tokens()
            ask.batch([(adapter, k)], ALONE, output_len=OUTPUT_LEN)
            after = draft_tokens()
            drafts[(adapter.name if adapter else BASE, k)] = None if None in (before, after) else after - before
    return drafts


def feature_ran(variant: str, budget: int | None, drafts: Mapping[tuple[str, int], int | None]) -> dict:
    """For each request, why the variant's feature cannot be shown to have run on it ("" where it
    did): the n-gram build's drafts for that request, the chunked build's budget against the prompt."""
    if variant == CHUNKED:
        why = (
            "the build's scheduler settings are not known"
            if budget is None
            else f"the build prefills {budget} tokens a step: the prompt of {CHUNKED_LEN} is not split"
            if budget >= CHUNKED_LEN
            else ""
        )
        return dict.fromkeys(drafts, why)
    return {
        key: "the engine counts no drafts" if n is None else "speculation drafted no token for it" if n == 0 else ""
        for key, n in drafts.items()
    }


def judge_variant(
    kept: Sequence[Mapping[str, str]], engine_id: str, plain_id: str, variant: str, ran: Mapping[tuple[str, int], str]
) -> tuple[int, list[str], list[str]]:
    """The variant build ``engine_id``'s answers against the plain build ``plain_id``'s, request
    by request: (checked, failed lines, not-judged lines). ``ran``: by (adapter, prompt), why
    the feature cannot be shown to have run on that request ("" where it did)."""
    mine = {(r["adapter"], int(r["prompt"])): r for r in kept if r["engine_id"] == engine_id and r["step"] == ALONE}
    plain = {(r["adapter"], int(r["prompt"])): r for r in kept if r["engine_id"] == plain_id and r["step"] == ALONE}
    if not plain:
        return 0, [], [f"the plain build {plain_id} kept no answer in this run before {engine_id}"]
    moved = [key for key in mine if key[0] == BASE and key in plain and mine[key]["digest"] != plain[key]["digest"]]
    if moved:
        k = moved[0][1]
        return (
            0,
            [],
            [
                f"the base model answers prompt {k} otherwise {WHAT[variant]} ({_ids(mine[moved[0]])} against "
                f"{_ids(plain[moved[0]])}): the feature changes answers with no LoRA, so no adapter is judged"
            ],
        )
    checked, failed, unjudged = 0, [], []
    for key, row in mine.items():
        why = ran.get(key, "") if key[0] != BASE else None
        if why is None:
            continue
        if why or key not in plain:
            unjudged.append(
                f"{shown(key[0])} on prompt {key[1]}: {why or f'the plain build {plain_id} did not answer it'}"
            )
            continue
        checked += 1
        if row["digest"] != plain[key]["digest"]:
            failed.append(
                f"{shown(key[0])} answers prompt {key[1]} {_ids(row)} on {engine_id} ({WHAT[variant]}) and "
                f"{_ids(plain[key])} on {plain_id}"
            )
    return checked, failed, unjudged


def _ids(row: Mapping[str, str]) -> str:
    return f"[{row['token_ids']}]"
