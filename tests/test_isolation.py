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
from lorabench.targets.standin.server import StandInServer
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
    # control (10); then the reload's reference and owner, its reference and reloaded answer,
    # the same name at a new path's reference and answer, a victim (6).
    assert row["isolation_checked"] == 7 and len(answers) == 24
    assert row["isolation_cached_tokens"] == 16, "each control found its block"
    assert result.ret == 1 and row["isolation_reload_broken"] == 1
    assert (row["isolation_control_changed"], row["isolation_unjudged"]) == (0, 0)
    out = result.stdout.str()
    assert "lorabench-reloaded[a1, in place] found 16 tokens of prompt 2 cached by the weights it replaced" in out
    if planted:
        assert "ADAPTER ISOLATION BROKEN: a1 found 16 tokens of prompt 0 cached after a0 sent it; " in out
        assert row["isolation_broken"] == 7, "the 6 victims and the new path, all keyed alike"
    else:
        assert "ADAPTER ISOLATION BROKEN: lorabench-reloaded[a1, in place] found 16 tokens" in out
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
            answers = isolation.canaries(engine, config.adapters, isolation.canary_prompts(engine, seed))
            verdicts.append(isolation.judge(answers))
    return verdicts


def test_a_planted_key_without_the_adapter_is_flagged_in_20_of_20_seeds_naming_each_pair(tmp_path):
    """Prompt 0 goes a0..a3 (a0 its owner), prompt 1 a3..a0 (a3 its owner): every other adapter
    found the owner's blocks. (The stand-in's answers are hashes: the seeds vary the prompts.)"""
    pairs = {f"a{i} found 16 tokens of prompt 0 cached after a0 sent it" for i in (1, 2, 3)}
    pairs |= {f"a{i} found 16 tokens of prompt 1 cached after a3 sent it" for i in (0, 1, 2)}
    for verdict in canary_verdicts(tmp_path, Costs(blocks_keyed_without_adapter=True), range(20)):
        assert set(verdict.broken) == pairs | {
            "lorabench-reloaded[a1, new path] found 16 tokens of prompt 2 cached after lorabench-reloaded[a0] sent it"
        }
        assert verdict.checked == 7
        assert not (verdict.changed or verdict.unjudged or verdict.uncached)
        assert len(verdict.reload_broken) == 1, "as vLLM 0.32 keys blocks: by name and path"


def test_blocks_keyed_by_adapter_and_weights_flag_nothing_in_20_of_20_seeds(tmp_path):
    for verdict in canary_verdicts(tmp_path, Costs(blocks_keyed_by_weights=True), range(20)):
        assert (verdict.broken, verdict.reload_broken, verdict.failure) == ([], [], None) and verdict.checked == 7


def test_blocks_keyed_as_vllm_0_32_keys_them_break_only_the_reload_in_20_of_20_seeds(tmp_path):
    for verdict in canary_verdicts(tmp_path, Costs(), range(20)):
        assert (verdict.broken, verdict.changed, verdict.unjudged) == ([], [], []) and len(verdict.reload_broken) == 1


def answers_of(victim=("r1", 0), control=("r0", 16), reference0=0, reload_after="n2"):
    """One prompt's canary (a0 its owner, a1 its victim) and a reload's, as (digest, cached tokens)."""
    record = functools.partial(IsolationRecord, token_ids="", prompt_token_ids="")
    return [
        record(prompt=0, adapter="a0", step="reference", digest="r0", cached_tokens=reference0),
        record(prompt=0, adapter="a1", step="reference", digest="r1", cached_tokens=0),
        record(prompt=0, adapter="a0", step="owner", digest="r0", cached_tokens=0),
        record(prompt=0, adapter="a1", step="victim", digest=victim[0], cached_tokens=victim[1]),
        record(prompt=0, adapter="a0", step="control", digest=control[0], cached_tokens=control[1]),
        record(prompt=2, adapter="old", step="reference", digest="o2", cached_tokens=0),
        record(prompt=2, adapter="old", step="owner", digest="o2", cached_tokens=0),
        record(prompt=2, adapter="new", step="reference", digest=reload_after, cached_tokens=0),
        record(prompt=2, adapter="new", step="reloaded", digest=reload_after, cached_tokens=0),
    ]


def test_canaries_that_hold_say_nothing():
    assert isolation.judge(answers_of()).failure is None


def test_a_victim_that_found_another_adapters_tokens_is_broken_even_where_its_answer_matched():
    verdict = isolation.judge(answers_of(victim=("r1", 16)))
    assert (
        verdict.failure
        == "ADAPTER ISOLATION BROKEN: a1 found 16 tokens of prompt 0 cached after a0 sent it (its answer matched)"
    )


def test_a_breach_shows_even_where_caching_also_changed_the_owners_answer():
    verdict = isolation.judge(answers_of(victim=("x1", 16), control=("x0", 16)))
    assert verdict.failure.startswith("ADAPTER ISOLATION BROKEN: a1 found 16 tokens of prompt 0 cached after a0")
    assert "; also: a0's control answer to prompt 0 differs from its uncached one" in verdict.failure


def test_answers_that_change_with_nothing_of_anothers_cached_are_not_called_a_breach():
    """An engine whose outputs change for another reason (numerics): said, not blamed on the key."""
    verdict = isolation.judge(answers_of(victim=("x1", 0), control=("x0", 16)))
    assert verdict.broken == [] and verdict.failure.startswith("PREFIX CACHING CHANGED OUTPUTS: a1's victim answer")


def test_a_salted_request_that_found_something_cached_leaves_the_canaries_unable_to_judge():
    """A salt the engine ignores (an older vLLM, a proxy): each victim would find its own
    reference's blocks, which is no breach."""
    verdict = isolation.judge(answers_of(reference0=16))
    assert verdict.failure.startswith("ISOLATION NOT JUDGED: a0's reference request for prompt 0 found 16 tokens")


def test_a_reload_that_changed_no_answer_cannot_show_stale_kv():
    verdict = isolation.judge(answers_of(reload_after="o2"))
    assert (
        verdict.failure
        == "ISOLATION NOT JUDGED: the reload in place changed no uncached answer: stale KV could not show"
    )


def test_a_control_that_found_nothing_cached_means_the_canaries_proved_nothing():
    """Prefix caching that does not take effect with LoRA (vLLM #23301 reports it): each
    control is held to it, not their sum."""
    both = answers_of()
    both.insert(
        5,
        IsolationRecord(
            prompt=1, adapter="a1", step="control", digest="r1", cached_tokens=0, token_ids="", prompt_token_ids=""
        ),
    )
    both.insert(
        0,
        IsolationRecord(
            prompt=1, adapter="a1", step="reference", digest="r1", cached_tokens=0, token_ids="", prompt_token_ids=""
        ),
    )
    verdict = isolation.judge(both)
    assert verdict.control_cached_tokens == 0
    assert verdict.failure == (
        "PREFIX CACHING NOT IN EFFECT: a1's control found nothing of prompt 1 cached: "
        "the canaries could not see a breach"
    )
    assert isolation.judge(answers_of(control=("r0", None))).failure is None, "an engine that does not say"


def isolation_run(tmp_path, name, source, broken=0, changed=0, reload=0, uncached=0):
    """``source`` with an isolation row beside each build's distinct bs4 batch row: the last
    with ``broken`` and ``changed``, every one with ``reload``."""
    rows = pd.read_csv(source)
    canary = rows[(rows.scenario == "multilora") & (rows.workload == "distinct") & (rows.batch_size == 4)].copy()
    canary["scenario"], canary["workload"], canary["enable_prefix_caching"] = "isolation", "isolation", True
    canary["isolation_checked"], canary["isolation_broken"], canary["isolation_control_changed"] = 6, 0, 0
    canary["isolation_reload_broken"], canary["isolation_uncached"], canary["rounds"] = reload, uncached, 1
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
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("PREFIX CACHING CHANGED OUTPUTS")]
    assert "1 answers differed from their uncached ones with nothing of another adapter's found cached" in line
    assert run_cli(changed, isolation_run(tmp_path, "changed2", DATA2, changed=1)) == 0, "on both sides: the engine's"
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
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("STALE KV AFTER A RELOAD")]
    assert len(lines) == 2, "one a configuration"
    why = "4 builds' adapters reloaded in place found the KV of the weights they replaced on the new side (base: 0)"
    assert all(why in line for line in lines)


@pytest.mark.realtime
@pytest.mark.parametrize("planted", [False, True])
def test_through_a_servers_runtime_api_the_canaries_judge_it_alike(pytester, planted):
    """A server on this machine: the reload canary's adapters are loaded, reloaded in place and
    unloaded through vLLM's runtime API, and the usage says what each request found cached."""
    pytester.makepyfile(test_bench_isolation=(ROOT / "bench" / "test_isolation.py").read_text())
    config = write_config(pytester.path / "run", engine={"enable_prefix_caching": True})
    costs = Costs(blocks_keyed_without_adapter=planted)
    with StandInServer(["a0", "a1", "a2", "a3"], costs, prefix_caching=True) as server:
        args = ("--bench-config", str(config), "-p", "no:cacheprovider", "--bench-target", server.url)
        result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)  # the reload in place, as vLLM 0.32 keys blocks
    (row,) = pd.read_csv(result_files(pytester.path / "run" / "results")[0]).to_dict("records")
    assert row["target"] == "url" and row["engine_id"].endswith("-pc-build0")
    assert (row["isolation_checked"], row["isolation_reload_broken"], row["isolation_cached_tokens"]) == (7, 1, 16)
    assert row["isolation_broken"] == (7 if planted else 0)
    calls = [op for op, name in server.lora_api_calls if name == isolation.RELOAD_NAME]
    # Each register unloads a name left served by a run stopped midway (404 here) first; then
    # the load, the reload in place, the unload; the new path's load and unload.
    assert calls == ["unload", "load", "load", "unload", "unload", "load", "unload"]
    reloads = [b for b in server.received if b.get("model") == isolation.RELOAD_NAME]
    assert len(reloads) == 6 and all(b["temperature"] == 0.0 for b in reloads)


@pytest.mark.realtime
def test_a_server_without_caching_skips_the_canaries_and_runs_the_rest_on_its_one_configuration(pytester):
    """The canaries would ask for a -pc configuration the server does not run: a URL's cases
    all run on the config's one, so the canaries skip, saying why, and the batch runs."""
    pytester.makepyfile(
        test_bench_isolation=(ROOT / "bench" / "test_isolation.py").read_text(),
        test_multilora=(ROOT / "bench" / "test_multilora.py").read_text(),
    )
    config = write_config(pytester.path / "run")
    with StandInServer(["a0", "a1", "a2", "a3"], Costs()) as server:
        args = ("--bench-config", str(config), "-p", "no:cacheprovider", "--bench-target", server.url, "-rs")
        result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*the isolation scenario needs prefix caching on: the server at http://127.0.0.1:*"])
    assert "-pc" not in result.stdout.str()


@pytest.mark.realtime
@pytest.mark.parametrize("runtime_api", [False, True])
def test_a_server_without_the_runtime_api_skips_and_one_left_serving_the_canary_is_taken_back(pytester, runtime_api):
    pytester.makepyfile(test_bench_isolation=(ROOT / "bench" / "test_isolation.py").read_text())
    config = write_config(pytester.path / "run", engine={"enable_prefix_caching": True})
    # A run stopped midway left the reload canary's name served.
    names = ["a0", "a1", "a2", "a3", isolation.RELOAD_NAME]
    with StandInServer(names, Costs(), prefix_caching=True, runtime_api=runtime_api) as server:
        args = ("--bench-config", str(config), "-p", "no:cacheprovider", "--bench-target", server.url, "-rs")
        result = pytester.runpytest(*args)
    if not runtime_api:
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines(
            ["*the isolation canaries load adapters at run time: the server at * has no runtime*"]
        )
    else:
        result.assert_outcomes(failed=1)  # the reload in place, judged as ever
        assert isolation.RELOAD_NAME not in server.adapters


def test_a_server_elsewhere_skips_the_cases_it_could_not_read_the_folders_of():
    from lorabench.config.target import Target, parse_target

    assert not parse_target("http://10.1.2.3:8000").on_this_machine
    assert parse_target("http://127.0.0.1:8000").on_this_machine and parse_target("http://localhost:1").on_this_machine
    assert Target("serve").on_this_machine and Target().on_this_machine


def test_caching_that_stopped_taking_effect_on_the_new_side_fails_the_comparison(tmp_path, capsys):
    base = isolation_run(tmp_path, "base", DATA)
    off = isolation_run(tmp_path, "off", DATA2, uncached=2)
    assert run_cli(base, off) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("PREFIX CACHING NOT IN EFFECT")]
    assert len(lines) == 2 and all("8 controls found nothing of their own prompt cached" in ln for ln in lines)
    assert run_cli(off, isolation_run(tmp_path, "off2", DATA2, uncached=2)) == 0, "off on both sides: no change"


def hit_rate_run(tmp_path, name, rate):
    """DATA2's rows measured with prefix caching on, each finding ``rate`` of its prompts cached."""
    rows = pd.read_csv(DATA2)
    rows["enable_prefix_caching"], rows["prefix_hit_rate"] = True, rate
    csv = tmp_path / f"{name}.csv"
    rows.to_csv(csv, index=False)
    return csv


def test_a_prefix_hit_rate_that_fell_fails_the_comparison_and_a_few_points_do_not(tmp_path, capsys):
    base = hit_rate_run(tmp_path, "base", 0.8)
    assert run_cli(base, hit_rate_run(tmp_path, "near", 0.76)) == 0, "within eviction's few points"
    assert run_cli(base, hit_rate_run(tmp_path, "fell", 0.3)) == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("PREFIX CACHE HIT RATE FELL")]
    assert lines and all(
        "30.0% of prompt tokens found cached on the new side, 80.0% on the base side" in ln for ln in lines
    )
    assert run_cli(hit_rate_run(tmp_path, "low", 0.3), base) == 0, "a rate that rose is no failure"
    from lorabench.analysis.compare.analysis import Comparison

    blank = hit_rate_run(tmp_path, "blank", float("nan"))  # a server that said no request's cached tokens
    assert run_cli(base, blank) == 0 and "PREFIX CACHE HIT RATE FELL" not in capsys.readouterr().out
    fell = Comparison(None, None, findings=[], hit_rate_falls=["a"])
    assert fell.failed and fell.reasons() == "1 prefix hit rate fallen", "said as itself, not as an isolation finding"
