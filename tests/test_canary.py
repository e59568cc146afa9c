"""The LoRA correctness canaries on the stand-in: each planted bug (``Costs.plant_*``) caught by
its check in 20 of 20 seeds, a clean stand-in never flagged; and the judges' verdicts on
answers made up to show each case. (The stand-in's answers are hashes of the adapter's name
and weights and the prompt: the seeds vary the prompts.)"""

from __future__ import annotations

import functools

import pytest

from lorabench.config import EngineSpec, read_config_file, resolve_config
from lorabench.load.padded import padded_adapter
from lorabench.measure import canary
from lorabench.measure.canary_judge import (
    FAILS,
    NOT_JUDGED,
    PASSES,
    REFERENCE,
    judge_base_changed,
    judge_batch,
    judge_no_effect,
    judge_prompt_logprobs,
    judge_rank_padding,
    judge_swap,
)
from lorabench.measure.canary_records import Asker, CanaryRecord
from lorabench.measure.correctness import DigestBook
from lorabench.targets.standin import Costs, StandIn, write_config

SEEDS = range(20)
LORA = EngineSpec(True, 2, 8, 4)
LORA_OFF = EngineSpec(False)
RANK16 = EngineSpec(True, 2, 16, 4)  # the rank-8 adapters are padded


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """6 adapters, 2 slots, a CPU cache of 4: swap_eviction can push one out of both."""
    path = write_config(tmp_path_factory.mktemp("canary"), adapters=6)
    return resolve_config(path, read_config_file(path), needs_lora=True)


def answers(config, costs, spec, seed, send):
    """What ``send(engine, ask)`` kept on a fresh stand-in build, prepared as a case's build is
    (the digest probe, then each adapter's load from disk)."""
    with StandIn(costs, virtual_clock=True).engine(config, spec, "cpu", None) as engine:
        if spec.enable_lora:
            provenance = {"run_id": "r", "model": "m", "device_type": "cpu"}
            DigestBook().check_build(engine, config.adapters, provenance)
            engine.measure_adapter_loads(config.adapters)
        ask = Asker(engine, canary.canary_prompts(engine, seed))
        extra = send(engine, ask)
        return ask.answers, extra


def no_effect(config, costs, seed):
    got, _ = answers(config, costs, LORA, seed, lambda e, ask: canary.no_effect(ask, list(config.adapters[:4])))
    return judge_no_effect(got, set())


def batch(config, costs, seed):
    got, _ = answers(config, costs, LORA, seed, lambda e, ask: canary.batch_invariance(ask, list(config.adapters[:2])))
    return judge_batch(got)


def swap(config, costs, seed):
    target, *others = config.adapters[:5]
    got, evicted = answers(config, costs, LORA, seed, lambda e, ask: canary.swap_eviction(e, ask, target, others))
    return judge_swap(got, evicted)


def kept(engine_id, lora, records):
    """Answers as ``kept_answers`` reads them back from the run's canary.csv."""
    return [
        {"engine_id": engine_id, "enable_lora": str(lora), "prompt": str(r.prompt)}
        | {"digest": r.digest, "token_ids": r.token_ids}
        for r in records
    ]


def base_changed(config, costs, seed):
    """The lora-off build's case first (the reference), then the LoRA build's, which judges."""
    send = lambda e, ask: canary.base_answers(ask)  # noqa: E731
    off, _ = answers(config, costs, LORA_OFF, seed, send)
    on, _ = answers(config, costs, LORA, seed, send)
    rows = kept("lora-off-build0", False, off)
    assert judge_base_changed(rows, "lora-off-build0", False).word == REFERENCE
    rows += kept("loras2-rank8-cpu4-build0", True, on)
    return judge_base_changed(rows, "loras2-rank8-cpu4-build0", True)


def logprobs(config, costs, seed):
    got, raised = answers(
        config, costs, LORA, seed, lambda e, ask: canary.prompt_logprobs(ask, list(config.adapters[:2]))
    )
    return judge_prompt_logprobs(got, raised)


@pytest.fixture(scope="module")
def mixed_ranks(tmp_path_factory):
    """6 adapters of ranks 8 and 16 in turn: rank_padding pads a0 and a2, a1 and a3 fill the slots."""
    path = write_config(tmp_path_factory.mktemp("ranks"), adapters=6, ranks=(8, 16), engine={"max_lora_rank": 16})
    return resolve_config(path, read_config_file(path), needs_lora=True)


def padding(config, costs, seed, mixed_ranks):
    def send(engine, ask):
        low = [a for a in mixed_ranks.adapters if a.rank == 8][:2]
        pairs = [(padded_adapter(a, 8), padded_adapter(a, 16)) for a in low]
        for pair in pairs:
            for copy in pair:
                engine.register(copy)
        canary.rank_padding(ask, pairs, [a for a in mixed_ranks.adapters if a.rank == 16][:2])
        return {padded.name: a.name for a, padded in pairs}

    got, padded_of = answers(mixed_ranks, costs, RANK16, seed, send)
    return judge_rank_padding(got, padded_of)


CHECKS = {
    "no_effect": (no_effect, Costs(plant_no_effect=True), 4),
    "base_changed": (base_changed, Costs(plant_base_changed_by_lora=True), 2),
    "batch_invariance": (batch, Costs(plant_batch_variance=True), 4),
    "swap_eviction": (swap, Costs(plant_stale_after_eviction=True), 2),
    "prompt_logprobs": (logprobs, Costs(plant_prompt_logprobs_drop_lora=True), 8),  # 4 answers, 4 values
    "rank_padding": (padding, Costs(plant_rank_padding=True), 4),
    "rank_padding, stale rows": (padding, Costs(plant_stale_rows=True), 4),
}


def judged(check, config, costs, seed, mixed_ranks):
    judge = CHECKS[check][0]
    return judge(config, costs, seed, mixed_ranks) if judge is padding else judge(config, costs, seed)


@pytest.mark.parametrize("check", CHECKS)
def test_each_planted_bug_is_caught_in_20_of_20_seeds(config, mixed_ranks, check):
    _, planted, checked = CHECKS[check]
    verdicts = [judged(check, config, planted, seed, mixed_ranks) for seed in SEEDS]
    assert [v.word for v in verdicts] == [FAILS] * 20
    assert all(v.checked == checked and not v.unjudged for v in verdicts), verdicts[0]


@pytest.mark.parametrize("check", CHECKS)
def test_a_clean_stand_in_passes_every_check_in_20_of_20_seeds(config, mixed_ranks, check):
    _, _, checked = CHECKS[check]
    verdicts = [judged(check, config, Costs(), seed, mixed_ranks) for seed in SEEDS]
    assert [(v.word, v.checked, v.failed, v.unjudged) for v in verdicts] == [(PASSES, checked, [], [])] * 20


def test_each_finding_names_its_adapters_prompt_and_both_answers(config):
    (line,) = [ln for ln in no_effect(config, Costs(plant_no_effect=True), 0).failed if ln.startswith("a3 ")]
    assert line.startswith("a3 answers every prompt as the base model does: prompt 0 [")
    assert "(the base model: [" in line and "where a0 answers [" in line, "even LoRA ids (a1, a3) lose their LoRA"
    (line,) = base_changed(config, Costs(plant_base_changed_by_lora=True), 0).failed[:1]
    assert line.startswith("the base model answers prompt 0 [") and "on loras2-rank8-cpu4-build0 (LoRA enabled)" in line
    assert line.endswith("on lora-off-build0")
    failed = batch(config, Costs(plant_batch_variance=True), 0).failed
    assert [ln.split(" [")[0] for ln in failed] == ["a0 answers prompt 0", "a1 answers prompt 1"]
    assert failed[0].endswith("in the batch base:0 a0:0 a1:1 base:1")
    failed = swap(config, Costs(plant_stale_after_eviction=True), 0).failed
    assert failed[0].startswith("a0 answers prompt 0 [") and "] first and [" in failed[0]
    assert failed[0].endswith("after 4 other adapters took its device slot and pushed it out of the CPU cache")


record = functools.partial(CanaryRecord, batch="", token_ids="1 2", prompt_token_ids="")


def test_no_effect_judges_an_adapter_only_where_another_moves_the_prompt():
    base = [record(step="base", adapter="", prompt=k, digest=f"b{k}") for k in (0, 1)]
    as_base = [record(step="alone", adapter=a, prompt=k, digest=f"b{k}") for a in ("a0", "a1") for k in (0, 1)]
    verdict = judge_no_effect(base + as_base, set())
    assert verdict.word == NOT_JUDGED and len(verdict.unjudged) == 2, "every adapter answers as the base model"
    moved = [
        record(step="alone", adapter="a2", prompt=0, digest="x"),
        record(step="alone", adapter="a2", prompt=1, digest="b1"),
    ]
    verdict = judge_no_effect(base + as_base + moved, set())
    assert (verdict.word, verdict.checked, len(verdict.failed)) == (FAILS, 3, 2), "a2 passes: it moves prompt 0"
    verdict = judge_no_effect(base + as_base + moved, {"a0", "a1"})
    assert (verdict.word, verdict.checked, len(verdict.unjudged)) == (PASSES, 1, 2), "same_as_base is not judged"


def test_a_batch_whose_base_only_control_changes_is_not_judged():
    alone = [record(step="alone", adapter=a, prompt=k, digest=f"{a}{k}") for a, k in (("", 0), ("a0", 0), ("", 1))]
    mixed = [record(step="batched", adapter=a, prompt=k, digest=f"{a}{k}x") for a, k in (("", 0), ("a0", 0), ("", 1))]
    control = [record(step="control", adapter="", prompt=k, digest="numerics") for k in (0, 0, 1)]
    verdict = judge_batch(alone + mixed + control)
    assert (verdict.word, verdict.checked, len(verdict.unjudged)) == (NOT_JUDGED, 0, 3)
    assert "the engine is not batch-invariant without LoRA" in verdict.unjudged[0]
    held = [record(step="control", adapter="", prompt=k, digest=f"{k}") for k in (0, 0, 1)]
    verdict = judge_batch(alone + mixed + held)
    assert (verdict.word, len(verdict.failed)) == (FAILS, 3), "base requests changed by LoRA neighbours fail too"
    assert verdict.failed[0].startswith("the base model answers prompt 0 [1 2] alone and [1 2] in the batch")


def test_a_swap_whose_repeat_changed_with_nothing_evicted_is_not_judged():
    steps = [
        record(step=s, adapter="a0", prompt=0, digest=d) for s, d in (("first", "f"), ("repeat", "r"), ("after", "x"))
    ]
    verdict = judge_swap(steps, "2 other adapters took its device slot")
    assert (verdict.word, verdict.checked, verdict.failure("t")) == (NOT_JUDGED, 0, None)
    assert verdict.unjudged == ["a0's answer to prompt 0 changed with nothing evicted ([1 2], then [1 2])"]


def test_base_changed_is_judged_by_whichever_of_the_two_builds_answers_second():
    on = [{"engine_id": "loras2", "enable_lora": "True", "prompt": "0", "digest": "d", "token_ids": "1"}]
    off = [{"engine_id": "lora-off", "enable_lora": "False", "prompt": "0", "digest": "e", "token_ids": "2"}]
    first = judge_base_changed(on, "loras2", True)
    assert first.word == NOT_JUDGED and "one that runs later judges it" in first.unjudged[0]
    second = judge_base_changed(on + off, "lora-off", False)
    assert second.word == FAILS and second.failure("enabling LoRA changes base requests") == (
        "CANARY FAILS: enabling LoRA changes base requests: the base model answers prompt 0 [1] on loras2 "
        "(LoRA enabled) and [2] on lora-off"
    )


def test_prompt_logprobs_fails_a_changed_answer_a_short_count_and_a_crash_and_trusts_no_moved_base():
    ids = "1 2 3"
    alone = [record(step="alone", adapter=a, prompt=0, digest=f"{a}0", prompt_token_ids=ids) for a in ("", "a0", "a1")]
    asked = [
        record(step="logprobs", adapter="", prompt=0, digest="0", prompt_token_ids=ids, prompt_logprobs="3"),
        record(step="logprobs", adapter="a0", prompt=0, digest="a00", prompt_token_ids=ids, prompt_logprobs="2"),
        record(step="logprobs", adapter="a1", prompt=0, digest="moved", prompt_token_ids=ids, prompt_logprobs="3"),
    ]
    crash = [("a2", "a2 on prompt 0 with prompt_logprobs=1 raised RuntimeError: boom")]
    verdict = judge_prompt_logprobs(alone + asked, crash)
    assert (verdict.word, verdict.checked) == (FAILS, 3)
    assert verdict.failed == [
        crash[0][1],
        "a0 asked for prompt 0's logprobs and got 2 of its 3 positions",
        "a1 answers prompt 0 [1 2] and [1 2] when it asks for prompt logprobs",
    ]
    over_http = [record(**{**r.__dict__, "prompt_logprobs": ""}) for r in asked[:2]]
    assert judge_prompt_logprobs(alone + over_http, []).word == PASSES, "no count over HTTP: the answers judge"
    base_moved = [record(**{**asked[0].__dict__, "digest": "x"}), asked[2]]
    verdict = judge_prompt_logprobs(alone + base_moved, [])
    assert (verdict.word, verdict.checked, len(verdict.unjudged)) == (NOT_JUDGED, 0, 1)
    assert "not an adapter's doing" in verdict.unjudged[0]
    base_crash = [("", "the base model on prompt 0 with prompt_logprobs=1 raised ValueError: no")]
    verdict = judge_prompt_logprobs(alone + asked, base_crash + crash)
    assert (verdict.word, verdict.checked, len(verdict.unjudged)) == (NOT_JUDGED, 0, 3), "the base model's own error"
    assert verdict.unjudged[0].startswith("a0 on prompt 0: the base model on prompt 0 with prompt_logprobs=1 raised")


def test_rank_padding_names_the_adapter_its_padded_copy_the_prompt_and_both_answers(config, mixed_ranks):
    failed = padding(config, Costs(plant_rank_padding=True), 0, mixed_ranks).failed
    assert failed[0].startswith("a0~r8 (padded by vLLM) answers prompt 0 [")
    assert "] and a0~r16 (padded by lorabench) [" in failed[0]


def test_rank_padding_leaves_a_pair_that_answers_as_the_base_model_to_no_effect():
    base = record(step="base", adapter="", prompt=0, digest="b")
    own = record(step="alone", adapter="a0~r8", prompt=0, digest="x")
    padded = record(step="padded", adapter="a0~r16", prompt=0, digest="b")
    verdict = judge_rank_padding([base, own, padded], {"a0~r16": "a0~r8"})
    assert (verdict.word, verdict.unjudged) == (NOT_JUDGED, ["a0~r16 answer prompt 0 as the base model does"])
    verdict = judge_rank_padding([base, own, record(**{**padded.__dict__, "digest": "y"})], {"a0~r16": "a0~r8"})
    assert (verdict.word, verdict.checked, len(verdict.failed)) == (FAILS, 1, 1)


def test_prompt_logprobs_runs_in_process_only(config):
    """vLLM refuses prompt_logprobs on a streamed completion, and lorabench's HTTP requests
    stream: over HTTP the check skips, rather than fail on the server's refusal."""
    from types import SimpleNamespace

    from lorabench.scenarios.canary import _adapters

    ctx = SimpleNamespace(config=config)
    served = SimpleNamespace(target="url", spec=LORA)
    with pytest.raises(pytest.skip.Exception, match="prompt_logprobs runs in process: vLLM refuses"):
        _adapters(ctx, served, "prompt_logprobs")
    assert len(_adapters(ctx, SimpleNamespace(target="inprocess", spec=LORA), "prompt_logprobs")) == 2


def test_rows_a_higher_rank_left_show_only_where_the_slots_were_filled_first(mixed_ranks):
    """Without fillers the copies go into slots no rank-16 adapter held: the stale rows the
    plant leaves are not tried (the check says so on the terminal), and it passes."""

    def send(engine, ask):
        low = [a for a in mixed_ranks.adapters if a.rank == 8][:1]
        pairs = [(padded_adapter(a, 8), padded_adapter(a, 16)) for a in low]
        for copy in pairs[0]:
            engine.register(copy)
        canary.rank_padding(ask, pairs, [])
        return {pairs[0][1].name: pairs[0][0].name}

    with StandIn(Costs(plant_stale_rows=True), virtual_clock=True).engine(mixed_ranks, RANK16, "cpu", None) as engine:
        ask = Asker(engine, canary.canary_prompts(engine, 0))
        padded_of = send(engine, ask)
    assert judge_rank_padding(ask.answers, padded_of).word == PASSES


def test_an_adapters_request_that_raises_on_prompt_logprobs_is_a_finding_and_the_check_goes_on(config):
    """The class's crash (vLLM #29955): each raising request one line of the failure."""
    with StandIn(Costs(), virtual_clock=True).engine(config, LORA, "cpu", None) as engine:
        real = engine.generate

        def generate(prompts, adapters, output_len, **kwargs):
            if kwargs.get("prompt_logprobs") is not None and adapters[0] is not None:
                raise RuntimeError("boom")
            return real(prompts, adapters, output_len, **kwargs)

        engine.generate = generate
        ask = Asker(engine, canary.canary_prompts(engine, 0))
        raised = canary.prompt_logprobs(ask, list(config.adapters[:2]))
    verdict = judge_prompt_logprobs(ask.answers, raised)
    assert (verdict.word, verdict.checked, len(verdict.failed)) == (FAILS, 8, 8), "2 adapters, 2 prompts, 2 asks"
    assert verdict.failed[0] == "a0 on prompt 0 with prompt_logprobs=1 raised RuntimeError: boom"
    assert verdict.failed[1] == (
        "a0 on prompt 0 teacher-forced on its answer with prompt_logprobs=1 raised RuntimeError: boom"
    )
