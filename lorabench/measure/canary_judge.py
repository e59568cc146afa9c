"""The canaries' verdicts: each check's answers against its reference, compared by digest of
the greedy token ids (``lorabench.measure.canary`` says what each check sends).

Each comparison is judged (``checked``; a failed one is a finding, one line naming the class's
adapters, prompt and both answers) or not judged, where the reference cannot tell: no other
adapter moves the prompt off the base model's answer, the base model's own answers change in a
batch with no LoRA in it, or when it asks for prompt logprobs, an answer changes on a repeat
with nothing evicted, or the other build's answers are not there yet. prompt_logprobs also
judges the logprobs' values (``lorabench.measure.canary_logprobs``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lorabench.measure.canary import AFTER, ALONE, BASE_STEP, BATCHED, CONTROL, FIRST, LOGPROBS, PADDED, REPEAT
from lorabench.measure.canary_logprobs import judge_values
from lorabench.measure.canary_records import BASE, CanaryRecord, shown

PASSES, FAILS, NOT_JUDGED, REFERENCE = "passes", "FAILS", "not judged", "reference"


@dataclass(frozen=True)
class Verdict:
    """A check's comparisons: judged, failed (one line each), and not judged (one line each)."""

    checked: int
    failed: list[str]
    unjudged: list[str]

    @property
    def word(self) -> str:
        """FAILS, passes, not judged; reference where nothing was there to compare yet (a
        lora-off build's base answers, kept for the LoRA builds' cases to be judged against)."""
        if self.failed:
            return FAILS
        if self.checked:
            return PASSES
        return NOT_JUDGED if self.unjudged else REFERENCE

    def columns(self) -> dict[str, object]:
        return {
            "canary_verdict": self.word,
            "canary_checked": self.checked,
            "canary_failed": len(self.failed),
            "canary_unjudged": len(self.unjudged),
        }

    def failure(self, title: str) -> str | None:
        """What fails the case: ``title`` (the class) and every finding; None if none."""
        if not self.failed:
            return None
        also = f"; not judged: {'; '.join(self.unjudged)}" if self.unjudged else ""
        return f"CANARY FAILS: {title}: " + "; ".join(self.failed) + also


def ids(record: CanaryRecord | Mapping[str, str]) -> str:
    tokens = record.token_ids if isinstance(record, CanaryRecord) else record["token_ids"]
    return f"[{tokens}]"


def judge_no_effect(answers: Sequence[CanaryRecord], same_as_base: set[str]) -> Verdict:
    """An adapter answers as the base model does on every prompt, and another adapter answers
    one of them otherwise: its LoRA had no effect. Where every adapter answers a prompt as the
    base model, the prompt cannot tell; an adapter declared ``same_as_base`` is not judged."""
    base = {a.prompt: a for a in answers if a.step == BASE_STEP}
    alone = [a for a in answers if a.step == ALONE]
    checked, failed, unjudged = 0, [], []
    for name in dict.fromkeys(a.adapter for a in alone):
        if name in same_as_base:
            unjudged.append(f"{name} is declared same_as_base: its answers may be the base model's")
            continue
        mine = [a for a in alone if a.adapter == name]
        if any(a.digest != base[a.prompt].digest for a in mine):
            checked += 1
            continue
        tellers = [
            (a, o)
            for a in mine
            for o in alone
            if o.prompt == a.prompt and o.adapter not in (name, *same_as_base) and o.digest != a.digest
        ]
        if not tellers:
            unjudged.append(f"{name} answers every prompt as the base model does, and so does every adapter")
            continue
        checked += 1
        a, other = tellers[0]
        failed.append(
            f"{name} answers every prompt as the base model does: prompt {a.prompt} {ids(a)} (the base model: "
            f"{ids(base[a.prompt])}), where {other.adapter} answers {ids(other)}"
        )
    return Verdict(checked, failed, unjudged)


def judge_base_changed(kept: Sequence[Mapping[str, str]], engine_id: str, lora: bool) -> Verdict:
    """This build's base answers against every answer of the other kind of build (lora-off
    against LoRA) the run kept before it, prompt by prompt (``canary_records.kept_answers``)."""
    mine = {r["prompt"]: r for r in kept if r["engine_id"] == engine_id}
    others = [r for r in kept if (r["enable_lora"] == "True") != lora]
    if not others:
        if not lora:
            return Verdict(0, [], [])  # the reference: the LoRA builds' cases are judged against it
        return Verdict(
            0, [], ["no lora-off build of this run had answered before this one (one that runs later judges it)"]
        )
    checked, failed = 0, []
    for other in others:
        checked += 1
        own = mine[other["prompt"]]
        if own["digest"] != other["digest"]:
            on, off = (own, other) if lora else (other, own)
            failed.append(
                f"the base model answers prompt {own['prompt']} {ids(on)} on {on['engine_id']} (LoRA enabled) "
                f"and {ids(off)} on {off['engine_id']}"
            )
    return Verdict(checked, failed, [])


def judge_batch(answers: Sequence[CanaryRecord]) -> Verdict:
    """Each request of the mixed batch against its answer alone. Where the base-only control
    batch changed a base answer, the engine's answers change in a batch with no LoRA at all:
    nothing in the mixed batch is judged."""
    alone = {(a.adapter, a.prompt): a for a in answers if a.step == ALONE}
    moved = [a for a in answers if a.step == CONTROL and a.digest != alone[(BASE, a.prompt)].digest]
    batched = [a for a in answers if a.step == BATCHED]
    if moved:
        first = moved[0]
        why = (
            f"the base model answers prompt {first.prompt} {ids(alone[(BASE, first.prompt)])} alone and "
            f"{ids(first)} in a batch of base requests only ({first.batch}): the engine is not batch-invariant "
            "without LoRA"
        )
        return Verdict(0, [], [f"{shown(a.adapter)} on prompt {a.prompt}: {why}" for a in batched])
    failed = [
        f"{shown(a.adapter)} answers prompt {a.prompt} {ids(alone[(a.adapter, a.prompt)])} alone and {ids(a)} "
        f"in the batch {a.batch}"
        for a in batched
        if a.digest != alone[(a.adapter, a.prompt)].digest
    ]
    return Verdict(len(batched), failed, [])


def judge_swap(answers: Sequence[CanaryRecord], evicted: str) -> Verdict:
    """The adapter's answers after it was evicted and loaded again against its first ones,
    prompt by prompt; a prompt whose repeat (nothing evicted) changed is not judged."""
    by_step = {(a.step, a.prompt): a for a in answers if a.step in (FIRST, REPEAT, AFTER)}
    checked, failed, unjudged = 0, [], []
    for (step, k), first in by_step.items():
        if step != FIRST:
            continue
        repeat, after = by_step[(REPEAT, k)], by_step[(AFTER, k)]
        name = first.adapter
        if repeat.digest != first.digest:
            unjudged.append(
                f"{name}'s answer to prompt {k} changed with nothing evicted ({ids(first)}, then {ids(repeat)})"
            )
            continue
        checked += 1
        if after.digest != first.digest:
            failed.append(f"{name} answers prompt {k} {ids(first)} first and {ids(after)} after {evicted}")
    return Verdict(checked, failed, unjudged)


def judge_prompt_logprobs(answers: Sequence[CanaryRecord], raised: Sequence[tuple[str, str]]) -> Verdict:
    """Each adapter's answer when it asks for prompt logprobs against its answer without, the
    positions that came back against the prompt's (in process), and its teacher-forced prompt
    logprobs' values against its decoded ones (``canary_logprobs.judge_values``). An adapter's
    request that raised is a finding. Where the base model's own request raised, or its answer
    changed when it asked, no adapter's is judged: that is no LoRA's doing."""
    alone = {(a.adapter, a.prompt): a for a in answers if a.step == ALONE}
    asked = [a for a in answers if a.step == LOGPROBS]
    moved = [a for a in asked if a.adapter == BASE and a.digest != alone[(BASE, a.prompt)].digest]
    adapters = [a for a in asked if a.adapter != BASE]
    by_adapter = [line for name, line in raised if name != BASE]
    base_raised = [line for name, line in raised if name == BASE]
    if moved or base_raised:
        why = (
            base_raised[0]
            if base_raised
            else (
                f"the base model answers prompt {moved[0].prompt} {ids(alone[(BASE, moved[0].prompt)])} and "
                f"{ids(moved[0])} when it asks for prompt logprobs"
            )
        )
        unjudged = [f"{a.adapter} on prompt {a.prompt}: {why}: not an adapter's doing" for a in adapters]
        return Verdict(0, [], unjudged + [f"{line}: not an adapter's doing" for line in by_adapter])
    failed = list(by_adapter)
    for a in adapters:
        ref, positions = alone[(a.adapter, a.prompt)], len(a.prompt_token_ids.split())
        if a.digest != ref.digest:
            failed.append(
                f"{a.adapter} answers prompt {a.prompt} {ids(ref)} and {ids(a)} when it asks for prompt logprobs"
            )
        elif a.prompt_logprobs not in ("", str(positions)):
            failed.append(
                f"{a.adapter} asked for prompt {a.prompt}'s logprobs and got {a.prompt_logprobs} of its "
                f"{positions} positions"
            )
    values_checked, values_failed, unjudged = judge_values(answers)
    return Verdict(len(adapters) + len(by_adapter) + values_checked, failed + values_failed, unjudged)


def judge_rank_padding(answers: Sequence[CanaryRecord], padded_of: Mapping[str, str]) -> Verdict:
    """Each padded copy's answer against the copy at the adapter's own rank, prompt by prompt
    (``padded_of``: a padded copy's name to the other's). The two are the same function, vLLM's
    buffers hold the same numbers for both, and both were loaded fresh at the same point of the
    session, so any difference is vLLM's padding's. A pair where either answers as the base
    model does is not judged: a LoRA not applied at all is no_effect's class."""
    base = {a.prompt: a for a in answers if a.step == BASE_STEP}
    alone = {(a.adapter, a.prompt): a for a in answers if a.step == ALONE}
    checked, failed, unjudged = 0, [], []
    for a in (a for a in answers if a.step == PADDED):
        other = alone[(padded_of[a.adapter], a.prompt)]
        as_base = [r.adapter for r in (other, a) if r.digest == base[a.prompt].digest]
        if as_base:
            unjudged.append(f"{' and '.join(as_base)} answer prompt {a.prompt} as the base model does")
            continue
        checked += 1
        if a.digest != other.digest:
            failed.append(
                f"{other.adapter} (padded by vLLM) answers prompt {a.prompt} {ids(other)} and {a.adapter} (padded "
                f"by lorabench) {ids(a)}"
            )
    return Verdict(checked, failed, unjudged)
