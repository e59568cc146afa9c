"""``pytest bench -k canary`` through the plugin on the stand-in: one case a check on every LoRA
build, base_changed on the lora-off build too, spec_decode and chunked_prefill on their variant
builds (and, for the reference, on the LoRA build), the classes a CPU engine cannot run skipped
with their reason; a planted bug fails its check's case only, after the rows and every answer
(the reproducer) are written, and the session exits 1."""

from __future__ import annotations

import pandas as pd
import pytest

from lorabench.results.records import CANARY_COLUMNS, replays_path_for
from lorabench.scenarios.canary import CLASSES, NOT_RUN
from lorabench.targets.standin import Costs, StandIn, write_config
from tests.helpers import ROOT, result_files

PLANTED = {
    "no_effect": Costs(plant_no_effect=True),
    "base_changed": Costs(plant_base_changed_by_lora=True),
    "batch_invariance": Costs(plant_batch_variance=True),
    "swap_eviction": Costs(plant_stale_after_eviction=True),
    "prompt_logprobs": Costs(plant_prompt_logprobs_drop_lora=True),
    "rank_padding": Costs(plant_rank_padding=True),
    "spec_decode": Costs(plant_spec_decode=True),
    "chunked_prefill": Costs(plant_chunked_prefill=True),
}
LORA_BUILD = "loras2-rank16-cpu4-build0"
# The answers each check keeps on a clean run: its reproducer.
ANSWERS = {
    "base_changed": 4,  # 2 prompts on each build
    "no_effect": 10,  # the base model and 4 adapters, 2 prompts
    "batch_invariance": 12,  # 4 requests alone, in the mixed batch, in its base-only control
    "swap_eviction": 10,  # 2 first, 2 repeats, 4 evictors in 2 waves (2 slots), 2 after
    "prompt_logprobs": 22,  # the base model and 2 adapters on 2 prompts, without and with, and teacher-forced
    "rank_padding": 26,  # on 2 prompts: the base model; 2 adapters at 8 and at 16, each after 2 fillers
    # 2 fillers (one a slot), then the base model and 2 adapters on 2 prompts: on the LoRA build and the n-gram one
    "spec_decode": 16,
    "chunked_prefill": 16,  # the same on the LoRA build and the chunked one
}
VARIANT_BUILDS = {
    "spec_decode": "loras2-rank16-cpu4-ngram-build0",
    "chunked_prefill": "loras2-rank16-cpu4-chunked-build0",
}
# On the lora-off build: base_changed (the reference) runs, the variant checks are left out, the
# other LoRA checks skipped; on each variant build its check only; the classes not run skip on
# the lora-off and LoRA builds.
PASSED = 1 + len(CLASSES) + len(VARIANT_BUILDS)
SKIPPED = len(CLASSES) - 1 - len(VARIANT_BUILDS) + 2 * len(NOT_RUN)
DESELECTED = len(VARIANT_BUILDS) * (1 + len(CLASSES) - 1 + len(NOT_RUN))


def run_canaries(pytester, costs, *args):
    pytester.makepyfile(test_bench_canary=(ROOT / "bench" / "test_canary.py").read_text())
    # Ranks 8 and 16 in turn at max_lora_rank 16: rank_padding has adapters to pad and to fill slots with.
    config = write_config(pytester.path / "run", adapters=6, ranks=(8, 16), engine={"max_lora_rank": 16})
    plugin = StandIn(costs, virtual_clock=True)
    result = pytester.runpytest(
        "--bench-config", str(config), "-p", "no:cacheprovider", "-rfs", *args, plugins=[plugin]
    )
    (csv,) = result_files(pytester.path / "run" / "results")
    return result, plugin, pd.read_csv(csv), pd.read_csv(replays_path_for(csv, "canary"))


def bench_modules(pytester, *names):
    """The bench modules, under names of their own: this file's test_canary is imported already."""
    for name in names:
        pytester.makepyfile(**{f"test_bench_{name[5:]}": (ROOT / "bench" / f"{name}.py").read_text()})


def test_a_clean_engine_passes_every_check_and_names_the_rest(pytester):
    result, plugin, rows, answers = run_canaries(pytester, Costs())
    result.assert_outcomes(passed=PASSED, skipped=SKIPPED, deselected=DESELECTED)
    builds = [e.spec.id for e in plugin.engines]
    assert builds == ["lora-off-build0", LORA_BUILD, *VARIANT_BUILDS.values()], "one build each, variants last"
    for name in NOT_RUN:
        result.stdout.fnmatch_lines([f"SKIPPED * {name}: *"])
    result.stdout.fnmatch_lines(["SKIPPED * no_effect runs on LoRA engines: lora-off-build0 answers the base_changed*"])
    verdicts = {(r["engine_id"], r["workload"]): r["canary_verdict"] for r in rows.to_dict("records")}
    assert verdicts == (
        {("lora-off-build0", "base_changed"): "reference"}
        | {(LORA_BUILD, check): "passes" for check in CLASSES if check not in VARIANT_BUILDS}
        | {(LORA_BUILD, check): "reference" for check in VARIANT_BUILDS}
        | {(build, check): "passes" for check, build in VARIANT_BUILDS.items()}
    )
    assert (rows["scenario"] == "canary").all() and (rows["canary_failed"] == 0).all()
    assert rows.set_index("workload").loc["swap_eviction", "num_adapters"] == 5, "4 others: the CPU cache's size"
    # The reproducer: every answer with its engine's settings, prompt ids and token ids.
    assert tuple(answers.columns) == CANARY_COLUMNS
    assert {"max_loras", "max_cpu_loras", "enable_lora", "prompt_token_ids", "token_ids", "batch"} <= set(answers)
    assert answers.groupby("workload").size().to_dict() == ANSWERS
    lengths = answers.groupby("workload")["prompt_token_ids"].first().str.split().str.len()
    assert (lengths["chunked_prefill"], lengths["spec_decode"]) == (80, 32), "2.5 chunks of 32; 4 runs of 8"
    asked = answers[answers["step"] == "logprobs"]
    assert (asked["prompt_logprobs"] == 32).all(), "every prompt position's, in process"


@pytest.mark.parametrize("check", PLANTED)
def test_a_planted_bug_fails_its_checks_case_only_with_every_answer_kept(pytester, check):
    result, _, rows, answers = run_canaries(pytester, PLANTED[check])
    result.assert_outcomes(passed=PASSED - 1, failed=1, skipped=SKIPPED, deselected=DESELECTED)
    assert result.ret == 1
    build = VARIANT_BUILDS.get(check, LORA_BUILD)
    result.stdout.fnmatch_lines(
        [f"CANARY FAILS: {CLASSES[check]}: * (the row and its records are in *", f"FAILED *{build}-{check}]*"]
    )
    assert "LoRA was not applied" not in result.stdout.str(), "the digest probe did not see it: the canary did"
    result.stdout.fnmatch_lines([f"{build} * canary * {check} * FAILS *"])  # the summary's verdict
    judged = rows.set_index(["engine_id", "workload"])
    assert judged.loc[(build, check), "canary_verdict"] == "FAILS"
    assert (judged["canary_verdict"] != "FAILS").sum() == PASSED - 1
    assert len(answers) == sum(ANSWERS.values()), "every answer kept, the failing case's among them"


def test_the_canaries_add_only_their_variant_builds_to_a_run_with_the_baselines_and_the_batches(pytester):
    """pytest shares session-scoped engines by value: the lora-off build is no_lora's, the LoRA
    build is the batches' build 0 (the canaries run one build of each configuration); the
    canaries add the two variant builds of the first LoRA configuration, and nothing else does."""
    bench_modules(pytester, "test_no_lora", "test_multilora", "test_canary")
    config = write_config(pytester.path / "run", adapters=6, matrix={"builds": 2})

    def built(*args):
        plugin = StandIn(Costs(), virtual_clock=True)
        pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", *args, plugins=[plugin])
        return sorted(e.spec.id for e in plugin.engines)

    builds = [f"{engine}-build{b}" for engine in ("lora-off", "loras2-rank8-cpu4") for b in (0, 1)]
    variants = ["loras2-rank8-cpu4-chunked-build0", "loras2-rank8-cpu4-ngram-build0"]
    assert built("-k", "not canary") == builds
    assert built() == sorted(builds + variants)


def test_the_default_selection_leaves_the_canaries_out(pytester):
    """``-k multilora``, the quick start's run, does not build the lora-off engine the canaries need."""
    bench_modules(pytester, "test_multilora", "test_canary")
    config = write_config(pytester.path / "run", adapters=6)
    collect = ("--bench-config", str(config), "-p", "no:cacheprovider", "--collect-only", "-q")
    result = pytester.runpytest(*collect, "-k", "multilora", plugins=[StandIn()])
    assert not any("canary" in line for line in result.outlines)
    result = pytester.runpytest(*collect, "-k", "canary", plugins=[StandIn()])
    result.stdout.fnmatch_lines(["test_bench_canary.py::test_canary[lora-off-build0-base_changed]"])
    cases = [line for line in result.outlines if line.startswith("test_bench_canary.py::")]
    assert len(cases) == 2 * (len(CLASSES) + len(NOT_RUN))
