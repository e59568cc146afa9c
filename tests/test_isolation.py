"""The isolation scenario on the stand-in, whose prefix cache keys blocks as vLLM 0.32 does
(``lorabench.targets.standin.prefix_cache``) or, planted, without the adapter."""

from __future__ import annotations

import functools

import pandas as pd
import pytest

from lorabench.config import EngineSpec, read_config_file, resolve_config
from lorabench.measure import isolation
from lorabench.results.records import IsolationRecord, replays_path_for
from lorabench.targets.standin import Costs, StandIn, write_config
from tests.helpers import ROOT, result_files
from tests.test_compare import DATA, DATA2, run_cli


def run_isolation(pytester, costs=None, **sections):
    pytester.makepyfile(test_bench_isolation=(ROOT / "bench" / "test_isolation.py").read_text())
    config = write_config(pytester.path / "run", **sections)
    plugin = StandIn(costs or Costs(), virtual_clock=True)
    result = pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", plugins=[plugin])
    return result, plugin


@pytest.mark.parametrize("planted", [False, True])
def test_a_key_without_the_adapter_is_caught_naming_the_pair(pytester, planted):
    """The stand-in keys blocks as vLLM 0.32 does, by the adapter's name and path: the reload
    in place (same name and path, new weights) finds its old weights' blocks either way."""
    result, plugin = run_isolation(pytester, Costs(blocks_keyed_without_adapter=planted))
    (engine,) = plugin.engines
    assert engine.spec.enable_prefix_caching and engine.spec.name.endswith("-pc")
    (csv,) = result_files(pytester.path / "run" / "results")
    (row,) = pd.read_csv(csv).to_dict("records")
    answers = pd.read_csv(replays_path_for(csv, "isolation"))
    # 4 adapters: a reference each per prompt (8), then per prompt its owner, 3 victims, the
    # control (10); then the reload's reference and owner, its reference and reloaded answer (4).
    assert row["isolation_checked"] == 6 and len(answers) == 22
    assert row["isolation_cached_tokens"] == 2 * 16, "each owner's second request found its block"
    assert result.ret == 1 and row["isolation_reload_broken"] == 1 and row["isolation_control_changed"] == 0
    reload = (
        "lorabench-reloaded[a1, in place] answered prompt 2 with the replaced weights' 16 cached tokens "
        "(lorabench-reloaded[a0]): the KV key is the adapter's name and path, which a reload in place keeps"
    )
    if planted:
        result.stdout.fnmatch_lines(["*ADAPTER ISOLATION BROKEN: a1 answered prompt 0 with a0's cached blocks; *"])
        assert row["isolation_broken"] == 6
    else:
        assert f"ADAPTER ISOLATION BROKEN: {reload} (the row and its records are in " in result.stdout.str()
        assert row["isolation_broken"] == 0


def test_canaries_that_hold_pass_the_case(pytester):
    result, _ = run_isolation(pytester, Costs(blocks_keyed_by_weights=True))
    result.assert_outcomes(passed=1)
    (row,) = pd.read_csv(result_files(pytester.path / "run" / "results")[0]).to_dict("records")
    assert (row["isolation_broken"], row["isolation_reload_broken"], row["isolation_control_changed"]) == (0, 0, 0)


def canary_verdicts(tmp_path, costs, seeds):
    """The canaries' verdict on a fresh stand-in engine with prefix caching, for each seed."""
    path = write_config(tmp_path, adapters=4)
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    spec = EngineSpec(True, 2, 8, 4, enable_prefix_caching=True)
    verdicts = []
    for seed in seeds:
        with StandIn(costs, virtual_clock=True).engine(config, spec, "cpu", None) as engine:
            verdicts.append(
                isolation.judge(isolation.canaries(engine, config.adapters, isolation.canary_prompts(engine, seed)))
            )
    return verdicts


def test_a_planted_key_without_the_adapter_is_flagged_in_20_of_20_seeds_naming_each_pair(tmp_path):
    """Prompt 0 goes a0..a3 (a0 its owner), prompt 1 a3..a0 (a3 its owner): every other adapter
    found the owner's blocks."""
    pairs = {f"a{i} answered prompt 0 with a0's cached blocks" for i in (1, 2, 3)}
    pairs |= {f"a{i} answered prompt 1 with a3's cached blocks" for i in (0, 1, 2)}
    for verdict in canary_verdicts(tmp_path, Costs(blocks_keyed_without_adapter=True), range(20)):
        assert set(verdict.broken) == pairs and not verdict.control_changed and verdict.checked == 6
        assert len(verdict.reload_broken) == 1, "as vLLM 0.32 keys blocks: by name and path"
        assert verdict.failure.startswith("ADAPTER ISOLATION BROKEN: a1 answered prompt 0 with a0's cached blocks")


def test_blocks_keyed_by_adapter_and_weights_flag_nothing_in_20_of_20_seeds(tmp_path):
    for verdict in canary_verdicts(tmp_path, Costs(blocks_keyed_by_weights=True), range(20)):
        assert (verdict.broken, verdict.control_changed, verdict.failure) == ([], [], None) and verdict.checked == 6


def test_blocks_keyed_as_vllm_0_32_keys_them_break_only_the_reload_in_20_of_20_seeds(tmp_path):
    for verdict in canary_verdicts(tmp_path, Costs(), range(20)):
        assert (verdict.broken, verdict.control_changed) == ([], []) and len(verdict.reload_broken) == 1


def test_an_owner_whose_own_cached_answer_changes_is_not_called_an_isolation_bug():
    """Caching that changes outputs whatever the adapter (numerics): the control says so, and
    the victims' differing answers are not blamed on a missing adapter key."""
    record = functools.partial(IsolationRecord, prompt=0, cached_tokens=16, token_ids="", prompt_token_ids="")
    answers = [
        record(adapter="a0", step="reference", digest="r0"),
        record(adapter="a1", step="reference", digest="r1"),
        record(adapter="a0", step="owner", digest="r0"),
        record(adapter="a1", step="victim", digest="x1"),
        record(adapter="a0", step="control", digest="x0"),
    ]
    verdict = isolation.judge(answers)
    assert verdict.failure.startswith("PREFIX CACHING CHANGED OUTPUTS: a0's control answer to prompt 0 differs")
    assert "cannot be judged" in verdict.failure and "ISOLATION BROKEN" not in verdict.failure


def answers_of(victim_cached=0, control_cached=16):
    record = functools.partial(IsolationRecord, prompt=0, token_ids="", prompt_token_ids="")
    return [
        record(adapter="a0", step="reference", digest="r0", cached_tokens=0),
        record(adapter="a1", step="reference", digest="r1", cached_tokens=0),
        record(adapter="a0", step="owner", digest="r0", cached_tokens=0),
        record(adapter="a1", step="victim", digest="r1", cached_tokens=victim_cached),
        record(adapter="a0", step="control", digest="r0", cached_tokens=control_cached),
    ]


def test_a_victim_that_reused_another_adapters_tokens_is_broken_even_where_its_answer_matched():
    verdict = isolation.judge(answers_of(victim_cached=16))
    assert verdict.failure == (
        "ADAPTER ISOLATION BROKEN: a1 reused 16 cached tokens of prompt 0, which a0 had sent (its answer happened "
        "to match)"
    )
    assert isolation.judge(answers_of()).failure is None


def test_canaries_whose_owners_found_nothing_cached_proved_nothing_and_say_so():
    """Prefix caching that does not take effect with LoRA (vLLM #23301 reports it): no victim
    could have found anything either."""
    verdict = isolation.judge(answers_of(control_cached=0))
    assert verdict.control_cached_tokens == 0 and verdict.failure.startswith("PREFIX CACHING NOT IN EFFECT")
    assert isolation.judge(answers_of(control_cached=None)).failure is None, "an engine that does not say"


def isolation_run(tmp_path, name, source, broken=0, changed=0, reload=0):
    """``source`` with an isolation row beside each build's distinct bs4 batch row: the last
    with ``broken`` and ``changed``, every one with ``reload``."""
    rows = pd.read_csv(source)
    canary = rows[(rows.scenario == "multilora") & (rows.workload == "distinct") & (rows.batch_size == 4)].copy()
    canary["scenario"], canary["workload"], canary["enable_prefix_caching"] = "isolation", "isolation", True
    canary["isolation_checked"], canary["isolation_broken"], canary["isolation_control_changed"] = 6, 0, 0
    canary["isolation_reload_broken"], canary["rounds"] = reload, 1
    canary.iloc[-1, canary.columns.get_loc("isolation_broken")] = broken
    canary.iloc[-1, canary.columns.get_loc("isolation_control_changed")] = changed
    csv = tmp_path / f"{name}.csv"
    pd.concat([rows, canary], ignore_index=True).to_csv(csv, index=False)
    return csv


def test_compare_fails_on_a_new_sides_broken_isolation_and_says_where(tmp_path, capsys):
    base = isolation_run(tmp_path, "base", DATA)
    new = isolation_run(tmp_path, "new", DATA2, broken=2)
    assert run_cli(base, new) == 1
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("ADAPTER ISOLATION BROKEN")]
    assert "scenario: isolation" in line and "enable_prefix_caching: True" in line
    assert "2 of 24 answers of adapters sent a prompt another adapter had cached were not their own" in line
    assert "(base: 0 of 24)" in line, "the canaries of its 4 builds"
    assert run_cli(new, base) == 0, "broken on the base side only: the new side fixed it"
    changed = isolation_run(tmp_path, "changed", DATA2, changed=1)
    assert run_cli(base, changed) == 1
    assert "PREFIX CACHING CHANGED OUTPUTS: " in capsys.readouterr().out
    assert run_cli(base, isolation_run(tmp_path, "same", DATA2)) == 0


def test_a_reload_broken_on_both_sides_is_known_and_one_broken_anew_fails(tmp_path, capsys):
    """vLLM 0.32's own reload behaviour on both sides is no change; a new side where it
    started is."""
    held = isolation_run(tmp_path, "held", DATA)
    known = isolation_run(tmp_path, "known", DATA, reload=1)
    anew = isolation_run(tmp_path, "anew", DATA2, reload=1)
    assert run_cli(known, anew) == 0
    capsys.readouterr()
    assert run_cli(held, anew) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("ADAPTER ISOLATION BROKEN")]
    assert len(lines) == 2, "one a configuration"
    why = "4 of 4 reloads in place answered from the old weights' cached blocks, which the base side's did not"
    assert all(why in line for line in lines)
