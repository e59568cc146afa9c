"""``pytest bench -k canary`` on real CPU engines: every check judged on vLLM's CPU backend, its
answers kept. No real-engine session the other tests share runs the lora-off build at build 0
with a LoRA configuration small enough to evict from (tests/engine_sessions.py), so this one
runs its own, with the sessions' machinery: 2 builds (lora-off, loras1) and the two variant
builds of loras1 (n-gram speculation, chunked prefill), a few greedy answers each.

What vLLM's CPU backend does on each check is what docs/canaries.md's detection matrix records;
this test holds the scenario to its contract (a verdict per check, every answer kept, the rest
skipped by name, a failure only as a finding) and prints the verdicts for that matrix."""

from __future__ import annotations

import pandas as pd
import pytest

from lorabench.results.records import replays_path_for
from lorabench.scenarios.canary import CLASSES, NOT_RUN
from tests.engine_sessions import bench_session
from tests.helpers import write_tiny_config

pytestmark = pytest.mark.engine


def test_the_canaries_judge_every_check_on_real_cpu_engines(tmp_path_factory):
    folder = tmp_path_factory.mktemp("canary-engine")
    # 4 adapters, 1 slot, a CPU cache of 2: swap_eviction evicts its adapter from both.
    config = write_tiny_config(folder, engine={"max_loras": 1, "max_cpu_loras": 2, "max_model_len": 128})
    args = ("--bench-config", str(config), "-k", "canary", "-p", "no:cacheprovider", "-rfEs")  # f, E: session.failed()
    session = bench_session(folder, ("test_canary",), *args, timeout=900)
    rows = session.rows.set_index(["engine_id", "workload"])
    print(rows[["canary_verdict", "canary_checked", "canary_failed", "canary_unjudged"]].to_string())
    assert session.result.ret in (0, 1), session.result.errlines[-20:]
    # A case fails only on a finding, after its row: one CANARY FAILS line and one FAILS row each.
    failed = session.failed()
    assert not [line for line in failed if line.startswith("ERROR ")], failed
    findings = [line for line in session.result.outlines if line.startswith("CANARY FAILS: ")]
    assert len(findings) == len(failed) == (rows["canary_verdict"] == "FAILS").sum(), failed
    assert (session.result.ret == 1) == bool(findings)
    variants = {
        "spec_decode": "loras1-rank16-cpu2-ngram-build0",
        "chunked_prefill": "loras1-rank16-cpu2-chunked-build0",
    }
    assert sorted(rows.index) == sorted(
        [("lora-off-build0", "base_changed")]
        + [("loras1-rank16-cpu2-build0", check) for check in CLASSES]
        + [(build, check) for check, build in variants.items()]
    )
    # Each variant build judged against the LoRA build's answers (the reference there), speculation drafting.
    for check, build in variants.items():
        assert rows.loc[("loras1-rank16-cpu2-build0", check), "canary_verdict"] == "reference"
        assert rows.loc[(build, check), "canary_verdict"] in ("passes", "FAILS"), rows.loc[(build, check)]
    # Judged on every adapter request: the n-gram build drafted for each, the chunked build split each prompt.
    for build in variants.values():
        assert rows.loc[build, "canary_checked"].item() == 4 and rows.loc[build, "canary_unjudged"].item() == 0
    assert set(rows["canary_verdict"]) <= {"passes", "FAILS", "not judged", "reference"}
    assert rows.loc[("lora-off-build0", "base_changed"), "canary_verdict"] == "reference", "lora-off runs first"
    assert rows.loc[("loras1-rank16-cpu2-build0", "base_changed"), "canary_checked"] == 2, "judged against it"
    assert (rows["digest_mismatches"].dropna() == 0).all()
    answers = pd.read_csv(replays_path_for(session.csv, "canary"))
    assert answers.groupby("workload").size().to_dict() == {
        "base_changed": 4,
        "no_effect": 10,
        "batch_invariance": 9,  # base, 1 adapter (max_loras 1), base: alone, mixed, base-only
        "swap_eviction": 8,  # 2 first, 2 repeats, 2 evictors (1 slot), 2 after
        "prompt_logprobs": 22,  # the base model and 2 adapters on 2 prompts, without and with, teacher-forced
        "rank_padding": 18,  # on 2 prompts: the base model; 2 rank-8 adapters at 8 and 16, each after 1 filler
        # 1 filler (1 slot), the base model and 2 adapters on 2 prompts: on the LoRA build and the n-gram one
        "spec_decode": 14,
        "chunked_prefill": 14,  # the same on the LoRA build and the chunked one
    }
    asked = answers[answers["step"] == "logprobs"]
    assert (asked["prompt_logprobs"] == asked["prompt_token_ids"].str.split().str.len()).all(), "one a position"
    # The values judged for both adapters on both prompts (the base control held, and each adapter told apart).
    assert rows.loc[("loras1-rank16-cpu2-build0", "prompt_logprobs"), "canary_checked"] == 4 + 4
    for name in NOT_RUN:
        session.result.stdout.fnmatch_lines([f"SKIPPED * {name}: *"])
