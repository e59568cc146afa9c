"""The prompt_logprobs canary's values (issue 51): each adapter's teacher-forced prompt logprobs
against the logprobs it sampled its answer with, on the stand-in, whose log probabilities are a
hash of (model, context, token), so the two paths agree exactly when clean. A prompt-logprobs
path that computes an adapter's values as the base model's (vLLM #16668), while its answers are
right, is caught in 20 of 20 seeds and by the values only; a clean stand-in is never flagged;
the base model's own pair off, or an adapter the values cannot tell from the base model, leaves
it not judged, and says so."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from lorabench.measure import canary
from lorabench.measure.canary import ALONE, BASE_FORCED, FORCED, LOGPROBS_TOLERANCE
from lorabench.measure.canary_judge import FAILS, PASSES, judge_prompt_logprobs
from lorabench.measure.canary_logprobs import FAR, NOISE_FACTOR, apart, floats, judge_values
from lorabench.measure.canary_records import BASE, CanaryRecord
from lorabench.results.records import CANARY_COLUMNS
from lorabench.targets.standin import Costs
from tests.test_canary import LORA, SEEDS, answers, config  # noqa: F401 - config: the module's fixture

WRONG_LORA = Costs(plant_prompt_logprobs_wrong_lora=True)


def sent(config, costs, seed):  # noqa: F811 - the fixture's value
    """The prompt_logprobs check's answers on a fresh stand-in build, and what raised."""
    return answers(config, costs, LORA, seed, lambda e, ask: canary.prompt_logprobs(ask, list(config.adapters[:2])))


def moved(records: list[CanaryRecord], step: str, adapter: str, prompt: int, by: float) -> list[CanaryRecord]:
    """``records`` with the logprob at answer position 3 of one record moved by ``by``."""

    def move(r: CanaryRecord) -> CanaryRecord:
        if (r.step, r.adapter, r.prompt) != (step, adapter, prompt):
            return r
        values = floats(r.logprobs)
        values[3] += by
        return replace(r, logprobs=" ".join(map(repr, values)))

    return [move(r) for r in records]


def test_a_wrong_lora_in_the_prompt_logprobs_only_is_caught_in_20_of_20_seeds_by_the_values(config):  # noqa: F811
    for seed in SEEDS:
        got, raised = sent(config, WRONG_LORA, seed)
        verdict = judge_prompt_logprobs(got, raised)
        assert (verdict.word, verdict.checked, verdict.unjudged) == (FAILS, 8, []), seed
        assert len(verdict.failed) == 4, "2 adapters, 2 prompts: the values only (the answers are right)"
        assert all("which it matches instead" in line for line in verdict.failed), verdict.failed


def test_a_clean_stand_in_is_never_flagged_and_its_two_paths_agree_exactly(config):  # noqa: F811
    for seed in SEEDS:
        got, raised = sent(config, Costs(), seed)
        verdict = judge_prompt_logprobs(got, raised)
        assert (verdict.word, verdict.checked, verdict.failed, verdict.unjudged) == (PASSES, 8, [], []), seed
    decoded = {(r.adapter, r.prompt): r for r in got if r.step == ALONE}
    for r in (r for r in got if r.step == FORCED):
        assert r.logprobs == decoded[(r.adapter, r.prompt)].logprobs, "the same floats, exactly"


def test_a_finding_names_the_adapter_prompt_position_both_values_and_the_base_models(config):  # noqa: F811
    got, raised = sent(config, WRONG_LORA, 0)
    line = judge_prompt_logprobs(got, raised).failed[0]
    d = floats(next(r for r in got if (r.step, r.adapter, r.prompt) == (ALONE, "a0", 0)).logprobs)
    f = floats(next(r for r in got if (r.step, r.adapter, r.prompt) == (FORCED, "a0", 0)).logprobs)
    token = next(r for r in got if (r.step, r.adapter, r.prompt) == (ALONE, "a0", 0)).token_ids.split()[0]
    assert line == (
        f"a0 on prompt 0, answer position 0 (token {token}): teacher-forced prompt logprob {f[0]:.6g}, decoded "
        f"{d[0]:.6g} (tolerance {LOGPROBS_TOLERANCE}); the base model's on the same tokens: {f[0]:.6g}, which it "
        "matches instead"
    )
    clean, _ = sent(config, Costs(), 0)
    (line,) = judge_prompt_logprobs(moved(clean, FORCED, "a0", 0, 1.5 * FAR), []).failed
    assert line.startswith("a0 on prompt 0, answer position 3 ") and line.endswith("which it does not match either")


def test_the_tolerance_is_the_line_between_float_noise_and_a_finding(config):  # noqa: F811
    clean, _ = sent(config, Costs(), 0)
    within = moved(clean, FORCED, "a1", 1, 0.8 * LOGPROBS_TOLERANCE)
    assert judge_prompt_logprobs(within, []).word == PASSES
    # Past it, matching no other value and less than FAR off (a float step of a large logit): not judged.
    past = moved(clean, FORCED, "a1", 1, 1.2 * LOGPROBS_TOLERANCE)
    verdict = judge_prompt_logprobs(past, [])
    assert (verdict.word, verdict.failed, verdict.checked) == (PASSES, [], 8 - 1)
    (line,) = verdict.unjudged
    assert line.startswith("a1's prompt logprobs on prompt 1: a1 on prompt 1, answer position 3 ")
    assert line.endswith("which it does not match either: a float step, or another bug")
    (line,) = judge_prompt_logprobs(moved(clean, FORCED, "a1", 1, 1.2 * FAR), []).failed
    assert line.startswith("a1 on prompt 1, answer position 3 ")
    assert apart([1.0, math.nan], [1.0]) == [0.0, math.inf], "a value missing is never within the tolerance"


def test_the_base_models_own_pairs_set_the_noise_and_a_missing_one_leaves_its_prompt_not_judged(config):  # noqa: F811
    """A base pair 3 tolerances apart (a model with coarser float steps) widens the tolerance to
    NOISE_FACTOR times that: an adapter off by less passes, by more is a finding; a base pair
    with no values (its request raised) leaves its prompt's adapters not judged."""
    clean, raised = sent(config, Costs(), 0)
    noisy = moved(clean, FORCED, BASE, 0, 3 * LOGPROBS_TOLERANCE)
    wide = NOISE_FACTOR * 3 * LOGPROBS_TOLERANCE
    assert judge_prompt_logprobs(moved(noisy, FORCED, "a1", 1, 0.9 * wide), raised).unjudged == []
    (line,) = judge_prompt_logprobs(moved(noisy, FORCED, "a1", 1, 1.1 * wide), raised).unjudged
    assert line.startswith("a1's prompt logprobs on prompt 1: a1 on prompt 1, answer position 3 ")
    assert f"(tolerance {wide:.3g})" in line, line
    blank = [replace(a, logprobs="") if (a.step, a.adapter, a.prompt) == (FORCED, BASE, 0) else a for a in clean]
    verdict = judge_prompt_logprobs(blank, raised)
    assert [line.split(":")[0] for line in verdict.unjudged] == [
        "a0's prompt logprobs on prompt 0",
        "a1's prompt logprobs on prompt 0",
    ]


def test_an_adapter_the_values_cannot_tell_from_the_base_model_is_not_judged(config):  # noqa: F811
    # plant_no_effect: a1 (an even LoRA id) answers as the base model on these prompts, in both paths.
    got, raised = sent(config, Costs(plant_no_effect=True), 0)
    checked, failed, unjudged = judge_values(got)
    assert (checked, failed) == (2, []), "a0 judged on both prompts"
    assert [line.split(":")[0] for line in unjudged] == [
        "a1's prompt logprobs on prompt 0",
        "a1's prompt logprobs on prompt 1",
    ]
    assert all(line.endswith("apart): the values cannot tell it from the base model") for line in unjudged)
    # a1's values are the base model's in both paths: a wrong LoRA there leaves nothing the values can see.
    got, raised = sent(config, Costs(plant_no_effect=True, plant_prompt_logprobs_wrong_lora=True), 0)
    checked, failed, unjudged = judge_values(got)
    assert (checked, len(failed), len(unjudged)) == (2, 2, 2) and all(ln.startswith("a0 ") for ln in failed)


def test_the_kept_records_redo_the_check(config):  # noqa: F811
    """A reader of canary.csv has each teacher-forced prompt (the prompt and the answer's ids)
    and both sets of values, exact: the check redone from the record alone finds the same."""
    got, _ = sent(config, WRONG_LORA, 3)
    assert "logprobs" in CANARY_COLUMNS
    steps = [r.step for r in got if r.prompt == 0]
    assert steps == [ALONE, "logprobs", FORCED] + [ALONE, "logprobs", FORCED, BASE_FORCED] * 2
    prompt = next(r for r in got if r.step == ALONE).prompt_token_ids
    for r in (r for r in got if r.step in (FORCED, BASE_FORCED)):
        answered = next(
            a
            for a in got
            if a.step == ALONE
            and a.prompt == r.prompt
            and r.prompt_token_ids == f"{a.prompt_token_ids} {a.token_ids}"
            and (r.adapter == a.adapter or r.step == BASE_FORCED)
        )
        assert len(floats(r.logprobs)) == len(answered.token_ids.split()) == 8
        assert r.prompt_logprobs == str(len(r.prompt_token_ids.split()))
    assert len(prompt.split()) == canary.PROMPT_LEN
    a0 = [floats(r.logprobs) for r in got if r.adapter == "a0" and r.prompt == 0 and r.step in (ALONE, FORCED)]
    assert max(apart(*a0)) > LOGPROBS_TOLERANCE, "the finding, from the records alone"


@pytest.mark.parametrize("costs", [Costs(), WRONG_LORA])
def test_answers_are_the_same_with_or_without_the_plant(config, costs):  # noqa: F811
    """The plant moves the prompt logprobs only: the answers and sampled values are the clean ones."""
    clean, _ = sent(config, Costs(), 5)
    got, _ = sent(config, costs, 5)
    assert [(r.token_ids, r.step) for r in got] == [(r.token_ids, r.step) for r in clean]
    assert [r.logprobs for r in got if r.step == ALONE] == [r.logprobs for r in clean if r.step == ALONE]
