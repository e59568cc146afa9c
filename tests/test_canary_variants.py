"""spec_decode and chunked_prefill on the stand-in: each check's answers on its variant build
judged against the plain build's; the planted bug caught in 20 of 20 seeds, a clean stand-in
never flagged; the base model's answers as the control; no drafts, no verdict; the variant
settings as vLLM takes them."""

from __future__ import annotations

import dataclasses

import pytest

from lorabench.config import EngineSpec, engine_specs, read_config_file, resolve_config
from lorabench.config.variants import CHUNK_TOKENS, CHUNKED, SPEC_NGRAM, plain_conflict, variant_kwargs
from lorabench.measure import canary_variants as variants
from lorabench.measure.canary_records import Asker
from lorabench.measure.canary_variants import CHUNKED_PREFILL, SPEC_DECODE, VARIANT_OF, judge_variant
from lorabench.scenarios.canary_cases import scheduled_budget
from lorabench.targets.standin import Costs, StandIn, write_config

SEEDS = range(20)
PLAIN = EngineSpec(True, 2, 8, 4)
PLANTED = {SPEC_DECODE: Costs(plant_spec_decode=True), CHUNKED_PREFILL: Costs(plant_chunked_prefill=True)}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp("variants"), adapters=4)
    return resolve_config(path, read_config_file(path), needs_lora=True)


def kept_on(config, costs, spec, check, seeds):
    """The check's answers for each seed on one stand-in build of ``spec``, as canary.csv keeps
    them, and whether its feature ran on each request. (A stand-in's answers do not depend on
    what it served before unless a planted eviction bug says so: one build serves every seed.)"""
    found = []
    adapters = list(config.adapters)
    with StandIn(costs, virtual_clock=True).engine(config, spec, "cpu", None) as engine:
        budget = scheduled_budget(engine)
        for seed in seeds:
            ask = Asker(engine, variants.variant_prompts(check, engine.vocab_size, seed))
            drafts = variants.send(ask, adapters[:2], adapters[2:4], engine.draft_tokens)
            rows = [
                {"engine_id": spec.id, "adapter": r.adapter, "prompt": str(r.prompt), "digest": r.digest}
                | {"token_ids": r.token_ids, "step": r.step}
                for r in ask.answers
            ]
            found.append((rows, variants.feature_ran(spec.engine_variant, budget, drafts)))
    return found


def judged(config, costs, check, seeds=SEEDS):
    """The check's verdict for each seed: (checked, failed, not judged)."""
    variant = dataclasses.replace(PLAIN, engine_variant=VARIANT_OF[check])
    plain = kept_on(config, costs, PLAIN, check, seeds)
    mine = kept_on(config, costs, variant, check, seeds)
    return [judge_variant(p + m, variant.id, PLAIN.id, VARIANT_OF[check], ran) for (p, _), (m, ran) in zip(plain, mine)]


@pytest.mark.parametrize("check", PLANTED)
def test_each_planted_bug_is_caught_in_20_of_20_seeds_and_a_clean_stand_in_never_flagged(config, check):
    planted, clean = judged(config, PLANTED[check], check), judged(config, Costs(), check)
    assert [(c, len(f), u) for c, f, u in planted] == [(4, 4, [])] * 20, "2 adapters on 2 prompts, each caught"
    assert [(c, f, u) for c, f, u in clean] == [(4, [], [])] * 20
    other = next(c for c in PLANTED if c != check)
    assert [f for _, f, _ in judged(config, PLANTED[check], other, SEEDS[:5])] == [[]] * 5, "its own build only"


def test_a_finding_names_the_adapter_prompt_both_builds_and_both_answers(config):
    ((_, failed, _),) = judged(config, PLANTED[CHUNKED_PREFILL], CHUNKED_PREFILL, [0])
    assert failed[0].startswith("a0 answers prompt 0 [")
    assert f"on loras2-rank8-cpu4-chunked-build0 (prefilled in chunks of {CHUNK_TOKENS} tokens) and [" in failed[0]
    assert failed[0].endswith("] on loras2-rank8-cpu4-build0")


def rows(engine_id, answers):
    return [
        {"engine_id": engine_id, "adapter": a, "prompt": str(k), "digest": d, "token_ids": d, "step": "alone"}
        for (a, k), d in answers.items()
    ]


RAN = {("a", 0): ""}


def test_a_base_model_that_answers_otherwise_on_the_variant_build_leaves_every_adapter_unjudged():
    plain = rows("p", {("", 0): "1", ("a", 0): "2"})
    moved = rows("v", {("", 0): "9", ("a", 0): "8"})
    checked, failed, unjudged = judge_variant(plain + moved, "v", "p", CHUNKED, RAN)
    assert (checked, failed) == (0, [])
    assert unjudged == [
        "the base model answers prompt 0 otherwise prefilled in chunks of 32 tokens ([9] against [1]): the feature "
        "changes answers with no LoRA, so no adapter is judged"
    ]


def test_a_request_the_feature_did_not_run_on_or_no_reference_is_no_verdict():
    plain = rows("p", {("", 0): "1", ("a", 0): "2"})
    changed = rows("v", {("", 0): "1", ("a", 0): "8"})
    none = {("a", 0): "speculation drafted no token for it"}
    assert judge_variant(plain + changed, "v", "p", SPEC_NGRAM, none) == (
        0,
        [],
        ["a on prompt 0: speculation drafted no token for it"],
    )
    assert judge_variant(plain + changed, "v", "p", SPEC_NGRAM, RAN)[:2] == (
        1,
        ["a answers prompt 0 [8] on v (with n-gram speculation) and [2] on p"],
    )
    assert judge_variant(changed, "v", "p", SPEC_NGRAM, RAN) == (
        0,
        [],
        ["the plain build p kept no answer in this run before v"],
    )


def test_the_feature_ran_where_the_drafts_and_the_budget_say_so():
    drafts = {("", 0): 9, ("a", 0): 0, ("b", 0): None, ("c", 0): 3}
    assert variants.feature_ran(SPEC_NGRAM, None, drafts) == {
        ("", 0): "",
        ("a", 0): "speculation drafted no token for it",
        ("b", 0): "the engine counts no drafts",
        ("c", 0): "",
    }
    assert set(variants.feature_ran(CHUNKED, 32, drafts).values()) == {""}
    assert set(variants.feature_ran(CHUNKED, 2048, drafts).values()) == {
        "the build prefills 2048 tokens a step: the prompt of 80 is not split"
    }
    assert set(variants.feature_ran(CHUNKED, None, drafts).values()) == {"the build's scheduler settings are not known"}


def test_the_prompts_repeat_for_the_n_gram_lookup_and_span_chunks_for_the_chunked_build():
    spec = variants.variant_prompts(SPEC_DECODE, 32000, 0)
    assert all(p == p[: variants.RUN_LEN] * variants.RUNS for p in spec) and spec[0] != spec[1]
    chunked = variants.variant_prompts(CHUNKED_PREFILL, 32000, 0)
    assert [len(p) for p in chunked] == [80, 80] and 2 * CHUNK_TOKENS < 80 < 3 * CHUNK_TOKENS


def test_the_variant_builds_settings_and_what_keeps_a_config_from_being_their_reference(tmp_path):
    assert variant_kwargs(SPEC_NGRAM, {})["speculative_config"]["method"] == "ngram"
    # vLLM refuses max_num_batched_tokens below max_num_seqs.
    assert variant_kwargs(CHUNKED, {"max_num_seqs": 256}) == {"max_num_batched_tokens": 32, "max_num_seqs": 32}
    assert variant_kwargs(CHUNKED, {"max_num_seqs": 16}) == {"max_num_batched_tokens": 32, "max_num_seqs": 16}
    assert variant_kwargs("", {"max_num_seqs": 16}) == {}
    assert plain_conflict(SPEC_NGRAM, {"speculative_config": {"method": "ngram"}}, 32).startswith("the config's")
    assert plain_conflict(CHUNKED, {"max_num_batched_tokens": 64}, 80).startswith("the config's engine sets")
    assert plain_conflict(CHUNKED, {"max_num_batched_tokens": 2048}, 80) == ""
    assert "enable_chunked_prefill off" in plain_conflict(CHUNKED, {"enable_chunked_prefill": False}, 80)
    path = write_config(tmp_path, adapters=2, engine={"max_loras": [2, 4]})
    file = read_config_file(path)
    specs = engine_specs(file, with_lora_off=True, builds=2, variants=(SPEC_NGRAM, CHUNKED))
    assert [s.id for s in specs[-2:]] == ["loras2-rank8-cpu4-ngram-build0", "loras2-rank8-cpu4-chunked-build0"]
    assert len(specs) == 2 * 3 + 2, "one of each variant, of the first LoRA configuration"
    kwargs = resolve_config(path, file, needs_lora=True).llm_kwargs(specs[-1])
    assert (kwargs["max_num_batched_tokens"], kwargs["enable_lora"], kwargs["max_loras"]) == (32, True, 2)
