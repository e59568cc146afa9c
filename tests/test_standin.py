"""Ground truth: every scenario on the stand-in engine, through the real plugin, with costs
the test sets; each injected cost must come out in its column.

The stand-in sleeps on the event loop, whose timers round up to the millisecond; it makes
up a step's lateness in the next, so a measurement may come out up to about 1 ms longer
than asked, more on a busy machine: tolerances below allow for that.
"""

from __future__ import annotations

import asyncio
import os

import pandas as pd
import pytest

from lorabench.config import EngineSpec
from lorabench.measure.replay import ReplayedRequest
from lorabench.measure.replay_summary import summarize_online
from lorabench.targets.standin import Costs, StandIn, write_config
from lorabench.targets.standin.llm import LoraRef, Params, StandInLLM
from tests.helpers import ROOT, result_files

TIMER_MS = 3.0  # the event loop's rounding, Python's own time around a request, a busy machine
BENCH = ("test_multilora.py", "test_no_lora.py", "test_multilora_residency.py", "test_multilora_working_set.py")


@pytest.fixture
def standin(pytester):
    """Run the repository's bench modules on a stand-in, on a virtual clock unless asked for the
    wall clock; returns the result, rows and samples."""
    for name in (*BENCH, "test_multilora_online.py"):
        pytester.makepyfile(**{name[:-3]: (ROOT / "bench" / name).read_text()})

    runs = iter(range(100))

    def run(costs=None, *args, plugin=None, adapters=4, virtual_clock=True, **sections):
        folder = pytester.path / f"run{next(runs)}"
        config = write_config(folder, adapters=adapters, **sections)
        plugin = plugin or StandIn(costs or Costs(), virtual_clock=virtual_clock)
        result = pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", *args, plugins=[plugin])
        files = result_files(folder / "results")
        if not files:
            return result, None, None
        (csv,) = files
        return result, pd.read_csv(csv), pd.read_csv(csv.with_name(csv.stem + ".samples.csv"))

    return run


def ran(result) -> tuple[int, int]:
    """Passed and failed cases (scenarios the config leaves out are skipped)."""
    outcomes = result.parseoutcomes()
    return outcomes.get("passed", 0), outcomes.get("failed", 0)


def test_a_disk_load_shows_in_the_adapter_load_column_and_the_disk_tier(standin):
    result, rows, _ = standin(
        Costs(disk_load_ms=20, slot_load_ms=6), "-k", "residency or multilora", residency={"requests": 3}
    )
    assert ran(result) == (4, 0)
    # add_lora reads the adapter and, as vLLM's does, activates it into a slot: 20 + 6 ms.
    assert rows["adapter_load_ms"].tolist() == pytest.approx([26] * len(rows)), "exactly, on the virtual clock"
    tiers = rows[rows.scenario == "residency"].set_index("tier")
    assert tiers.at["disk", "disk_load_ms"] == pytest.approx(26, abs=TIMER_MS)
    assert tiers.at["disk", "tier_extra_ttft_ms"] == pytest.approx(26, abs=TIMER_MS)
    assert tiers.at["cpu", "tier_extra_ttft_ms"] == pytest.approx(6, abs=TIMER_MS)
    assert tiers.at["slot", "tier_extra_ttft_ms"] == pytest.approx(0, abs=TIMER_MS)
    assert tiers["timed_adapter_loads"].to_dict() == {"slot": 0, "cpu": 0, "disk": 3}
    batch = rows[rows.scenario == "multilora"]
    assert (batch["timed_adapter_loads"] == 0).all(), "a batch's adapters are loaded before its timing"


def test_a_lora_slowdown_shows_in_lora_overhead(standin):
    """Two adapters, as many as a distinct batch of 2 uses: each build digests every adapter
    (8 steps each) before its first case, and 4 adapters doubled the time that took."""
    # Steps of 8 ms, not less: a busy host's few ms of lateness a step stay inside the tolerance.
    costs = Costs(prefill_ms_per_token=0, decode_ms_per_step=8, lora_ms_per_adapter=8)
    _, rows, _ = standin(costs, "-k", "multilora", adapters=2, matrix={"workloads": ["distinct", "identical"]})
    overhead = rows.set_index("workload")["lora_overhead"]
    # Each of the 4 steps costs 8 ms, plus 8 ms for each distinct adapter in it.
    assert overhead["distinct"] == pytest.approx(3.0, rel=0.12)
    assert overhead["identical"] == pytest.approx(2.0, rel=0.12)
    _, rows, _ = standin(Costs(prefill_ms_per_token=0, decode_ms_per_step=8), "-k", "multilora", adapters=2)
    assert rows["lora_overhead"].iloc[0] == pytest.approx(1.0, rel=0.12)


def test_the_baseline_sends_the_lora_batchs_own_text_prompts(standin):
    """Each adapter has its own prompt, longer than prompts.json's: with a costly prefill, a
    baseline of other prompts would put a difference in lora_overhead that LoRA did not cause."""
    costs = Costs(prefill_ms_per_token=0.5, decode_ms_per_step=2)
    _, rows, _ = standin(costs, "-k", "multilora", matrix={"input_len": None})
    assert rows["lora_overhead"].iloc[0] == pytest.approx(1.0, rel=0.1)


def test_load_share_follows_the_lru_arithmetic(standin):
    _, rows, _ = standin(
        Costs(disk_load_ms=2),
        "-k",
        "working_set",
        adapters=6,
        engine={"max_loras": 2, "max_cpu_loras": 4},
        working_set={"sizes": [1, 4, 6], "cycles": 2, "min_requests": 4},
    )
    by_size = rows.set_index("working_set")
    # Up to max_cpu_loras every adapter stays cached; past it, LRU evicts each one before its turn.
    assert by_size["load_share"].to_dict() == {1: 0.0, 4: 0.0, 6: 1.0}
    assert by_size.at[6, "timed_adapter_loads"] == 12
    assert by_size.at[6, "ttft_ms"] > by_size.at[4, "ttft_ms"] + 2 - TIMER_MS


def test_a_worker_extension_of_the_configs_own_leaves_the_load_counts_blank_and_says_so(standin):
    """vLLM takes one worker extension: the config's replaces lorabench's counter. The cases
    still pass, their counts blank rather than guessed."""
    engine = {"worker_extension_cls": "my_project.Extension"}
    result, rows, _ = standin(Costs(), "-k", "multilora or working_set", engine=engine, working_set={"sizes": [2]})
    assert ran(result) == (2, 0)
    assert rows[["timed_adapter_loads", "load_share"]].isna().all().all()
    result.stdout.fnmatch_lines(["*engine.worker_extension_cls replaces lorabench's own*stay blank*"])


def test_without_benchmarking_the_baseline_runs_one_unwarmed_round_as_the_lora_case(standin):
    """With --benchmark-disable the LoRA case runs once, unwarmed: its baseline must too. A
    baseline over the config's warm-up and measured rounds compared a cold LoRA round with
    warm ones (5.84 against 1.0 on the CPU engine) and timed warm-ups nobody asked for."""
    matrix = {"batch_sizes": [2], "workloads": ["distinct"], "warmup_rounds": 2, "rounds": 3}
    # Rounds of seconds on the virtual clock: a warm-up timed anywhere shows in the wall-time line.
    result, rows, _ = standin(Costs(decode_ms_per_step=100), "--benchmark-disable", "-k", "multilora", matrix=matrix)
    assert rows["rounds"].tolist() == [1] and rows["warmup_rounds"].tolist() == [0]
    # One LoRA round on the wall clock (about 0 s here) and one baseline round of 0.4 s.
    result.stdout.re_match_lines([r".*measured 0\.4 s \(\d+ %\), warm-ups 0\.0 s.*"])


def test_working_set_loads_are_the_loads_the_engine_did(standin):
    """W 5 over a cache of 4, in waves of 2: each wave's second adapter is cached, but the
    oldest there, and the first one's load evicts it before its turn (vLLM loads a step's
    adapters one at a time, each load evicting the oldest), so every wave loads both. The
    cache's list before each wave said one."""
    disk = 20
    _, rows, _ = standin(
        Costs(disk_load_ms=disk),
        "-k",
        "working_set",
        adapters=5,
        engine={"max_loras": 2, "max_cpu_loras": 4},
        working_set={"sizes": [4, 5], "cycles": 2, "min_requests": 4},
    )
    by_size = rows.set_index("working_set")
    assert by_size.at[5, "timed_adapter_loads"] == 10 and by_size.at[5, "load_share"] == 1.0
    assert by_size.at[4, "timed_adapter_loads"] == 0
    # Ground truth: the injected cost of two loads in every wave, and nothing else, apart.
    assert by_size.at[5, "e2e_ms"] - by_size.at[4, "e2e_ms"] == pytest.approx(2 * disk, abs=2 * TIMER_MS)


def test_an_online_replay_counts_the_loads_from_disk_its_adapters_took(standin):
    """One request at a time through a cache of one adapter: each request whose adapter is
    not the one before it loads from disk (the first may find its adapter cached). The old
    count came from the cache's list, and left the column blank whenever the trace's
    adapters did not fit the cache, which is when loads happen."""
    online = {"warmup_s": 0, "suites": [{"num_adapters": [3], "rate": [2], "duration": 10, "output_range": [2, 4]}]}
    engine = {"max_loras": 1, "max_cpu_loras": 1, "max_num_seqs": 1}
    _, rows, samples = standin(Costs(disk_load_ms=5), "-k", "online", adapters=3, engine=engine, online=online)
    # In the order they were served: a request waiting for the slot may be passed by another.
    order = samples.assign(first=samples["arrival_s"] + samples["ttft_ms"] / 1000).sort_values("first")["adapter"]
    order = order.tolist()
    changes = sum(a != b for a, b in zip(order, order[1:]))
    assert changes >= 3, order
    assert changes <= rows.at[0, "timed_adapter_loads"] <= changes + 1, (rows.at[0, "timed_adapter_loads"], order)
    # Every adapter fits a cache of three: none loads inside the replay.
    engine = {"max_loras": 1, "max_cpu_loras": 3, "max_num_seqs": 1}
    _, rows, _ = standin(Costs(disk_load_ms=5), "-k", "online", adapters=3, engine=engine, online=online)
    assert rows.at[0, "timed_adapter_loads"] == 0


@pytest.mark.realtime
def test_a_late_sender_shows_in_send_lag(standin):
    online = {"warmup_s": 0, "suites": [{"num_adapters": [2], "rate": [100], "duration": 0.15, "output_range": [2, 4]}]}
    _, rows, _ = standin(Costs(), "-k", "online", adapters=2, online=online, virtual_clock=False)
    # The median send: one late send (the other xdist worker, a collection) can reach
    # 5.7 ms at p99, the maximum of about 15 sends.
    assert rows.at[0, "send_lag_ms_p50"] < 5
    _, rows, _ = standin(Costs(send_block_ms=25), "-k", "online", adapters=2, online=online, virtual_clock=False)
    # Requests 10 ms apart, each send blocking 25 ms: every send falls 15 ms further behind,
    # the median one (of about 15) some 100 ms.
    assert rows.at[0, "send_lag_ms_p50"] > 25


def test_a_changed_adapter_shows_in_digest_mismatches(standin):
    plugin = StandIn(Costs(), altered={1: ["a1"]}, virtual_clock=True)
    result, rows, _ = standin(plugin=plugin, matrix={"builds": 2}, engine={"max_loras": 2})
    assert ran(result) == (6, 0)
    lora = rows[rows.scenario == "multilora"].set_index("build")
    assert lora["digest_mismatches"].to_dict() == {0: 0, 1: 1}


def test_a_changed_adapter_counts_once_a_residency_request_not_again_in_its_repeat(standin):
    """Each tier's request is sent again at once to take its adapter's slot cost out; the
    repeat's answer is a slot's, not the tier's, and is not judged again."""
    plugin = StandIn(Costs(), altered={1: ["a0"]}, virtual_clock=True)
    result, rows, _ = standin(None, "-k", "residency", plugin=plugin, matrix={"builds": 2}, residency={"requests": 3})
    tiers = rows[rows.scenario == "residency"].set_index(["build", "tier"])["digest_mismatches"]
    # On build 1: the build's check of a0, and each tier's 3 answers.
    assert tiers.to_dict() == {(b, t): (1 + 3) * b for b in (0, 1) for t in ("slot", "cpu", "disk")}


def test_mixed_at_batch_size_one_is_skipped_with_the_reason(standin):
    result, rows, _ = standin(Costs(), "-k", "multilora", "-rs", matrix={"workloads": ["mixed"], "batch_sizes": [1, 4]})
    assert ran(result) == (1, 0)
    result.stdout.fnmatch_lines(["*the mixed workload needs batch size 2 or more*got 1*"])
    row = rows.iloc[0]
    assert row["base_share"] == 0.5 and row["base_ttft_ms"] > 0 and row["lora_ttft_ms"] > 0


def test_a_row_breaking_its_declared_columns_is_written_then_fails(standin, monkeypatch):
    from lorabench.scenarios import SCENARIOS

    multilora = SCENARIOS["multilora"]
    monkeypatch.setattr(multilora, "columns", multilora.columns - {"lora_overhead"})
    result, rows, samples = standin(Costs(), "-k", "multilora")
    assert ran(result) == (0, 1)
    result.stdout.fnmatch_lines(["*columns filled but not declared: lora_overhead (the row is written to *"])
    assert len(rows) == 1 and len(samples) == 2 * 2, "the finished measurement is on disk"


def test_a_scenario_declaring_an_unknown_column_is_refused_before_any_engine(standin, monkeypatch):
    from lorabench.scenarios import SCENARIOS

    multilora = SCENARIOS["multilora"]
    monkeypatch.setattr(multilora, "maybe_columns", multilora.maybe_columns | {"ttft_typo_ms"})
    plugin = StandIn(virtual_clock=True)
    result, rows, _ = standin(plugin=plugin)
    assert result.ret == 2 and rows is None and not plugin.engines
    result.stderr.fnmatch_lines(["*scenario multilora declares columns ResultRow does not have: ttft_typo_ms*"])


def test_the_engines_environment_is_set_for_its_build_and_restored_after(standin):
    def environ():
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

    before = environ()
    plugin = StandIn(virtual_clock=True)
    result, _, _ = standin(plugin=plugin, env={"LOREM_IPSUM_KNOB": "7"})
    assert ran(result) == (3, 0)
    assert all(e.environ_seen.get("LOREM_IPSUM_KNOB") == "7" for e in plugin.engines) and plugin.engines
    assert environ() == before


def test_the_engines_processes_hash_strings_alike_in_every_build_unless_the_config_says(standin, monkeypatch):
    """vLLM orders a step's adapter loads by a set hashed by name: seeded alike, every build
    loads in one order, and timed_adapter_loads does not move with a random seed."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    for env, seed in (({}, "0"), ({"PYTHONHASHSEED": "7"}, "7")):
        plugin = StandIn(virtual_clock=True)
        standin(None, "-k", "multilora", plugin=plugin, env=env)
        assert [e.environ_seen.get("PYTHONHASHSEED") for e in plugin.engines] == [seed] * len(plugin.engines) != []
        assert "PYTHONHASHSEED" not in os.environ


def test_a_dead_engine_fails_its_cases_with_the_reason_and_keeps_finished_rows(standin):
    # Digests 5 requests, distinct 2 rounds and its baseline 8, identical's rounds 4: it dies there.
    plugin = StandIn(die_after=16, virtual_clock=True)
    sections = {"matrix": {"workloads": ["distinct", "identical"]}, "residency": {"requests": 2}}
    result, rows, _ = standin(Costs(), "-k", "multilora or residency", plugin=plugin, **sections)
    assert ran(result) == (1, 4)
    result.stdout.fnmatch_lines(
        [
            "*engine loras2-rank8-cpu4-build0 died: *identical*EngineDied: the stand-in engine died after 16 requests*",
            "*engine loras2-rank8-cpu4-build0 died in an earlier case, *",
        ]
    )
    assert rows["workload"].tolist() == ["distinct"], "the finished case's row stays"


def test_warm_up_requests_count_in_no_online_statistic():
    def request(index, scheduled, sent, finished):
        record = ReplayedRequest(index, "a", 4, 2, scheduled, sent_s=sent, finished=finished)
        record.token_times = [sent + 0.01, sent + 0.02] if finished else []
        return record

    records = [request(0, 0.0, 5.0, False), request(1, 2.0, 2.001, True), request(2, 3.0, 3.002, True)]
    metrics, _ = summarize_online(records, slo_ttft_ms=100, slo_tpot_ms=100, warmup_s=1.0)
    assert metrics["num_requests"] == 2 and metrics["unfinished"] == 0
    assert metrics["send_lag_ms_p99"] < 3, "the warm-up request's 5 s lag is not a measured one"


def test_benchmark_cases_under_xdist_are_refused_in_one_line(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
    pytester.makeconftest(
        "from lorabench.targets.standin import StandIn\n\ndef pytest_lorabench_backend(config):\n    return StandIn()\n"
    )
    config = write_config(pytester.path / "run")
    # In process: the worker that refuses is a process of its own either way (a run in a
    # subprocess started a third interpreter, a second more than the test needs).
    result = pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", "-n", "1")
    assert result.ret == 2
    result.stdout.fnmatch_lines(["benchmark cases refused: pytest-xdist (-n) would have every worker build its own*"])
    assert not (pytester.path / "run" / "results").exists(), "no engine was built, no result written"


def test_a_peak_memory_that_may_be_stale_is_said_in_the_summary(standin):
    class Unreadable(StandIn):
        def engine(self, *args):
            engine = super().engine(*args)
            engine.memory.note = "device memory unreadable in 2 of 5 reads (npu-smi timed out)"
            return engine

    result, _, _ = standin(Costs(), "-k", "multilora", plugin=Unreadable(virtual_clock=True))
    result.stdout.fnmatch_lines(["peak memory of loras2-rank8-cpu4-build0: device memory unreadable in 2 of 5 reads*"])


def test_an_adapter_added_while_every_cached_one_serves_evicts_the_oldest_cached_one():
    """max_cpu_loras = max_loras (vLLM's default when unset) and both adapters running: an
    add_lora (churn, or a runtime load over HTTP) must still load, as vLLM's does, evicting the
    oldest cached adapter whatever runs, and with it its slot, which the new one takes."""
    costs = Costs(decode_ms_per_step=1, disk_load_ms=3, slot_load_ms=2)
    spec = EngineSpec(enable_lora=True, max_loras=2, max_lora_rank=8, max_cpu_loras=2)
    a, b, c = (LoraRef(name, i, f"/adapters/{name}") for i, name in enumerate("abc", 1))

    async def scenario() -> tuple[bool, set[int], list[int], bool]:
        llm = StandInLLM(costs, spec, max_num_seqs=4, weights={})
        params = Params(max_tokens=200, stream=True, greedy=True)
        streams = [llm.generate([1, 2, 3], params, f"r{lora.lora_name}", lora) for lora in (a, b)]
        firsts = [await anext(stream) for stream in streams]  # both running, each in its slot
        added = await llm.add_lora(c)
        cached, slots = await llm.list_loras(), list(llm.adapters.slots)
        llm.shutdown()
        return added, cached, slots, all(not out.finished for out in firsts)

    added, cached, slots, running = asyncio.run(scenario())
    assert added and running
    assert cached == {2, 3}, "the oldest cached adapter (a) made room for c"
    assert slots == [2, 3], "a left its slot with its cache entry, and c took it"


def test_a_cases_adapters_already_cached_are_not_evicted_by_loading_the_rest():
    """The cache holds a4-a15 (the last 12 of 16, as a build's preparation leaves it) and a
    trace needs a0-a7: loading a0-a3 evicts the 4 oldest. vLLM's add_lora of a cached adapter
    only makes it the most recent, so lorabench adds a4-a7 first and they stay cached."""
    from pathlib import Path

    from lorabench.load.adapters import Adapter
    from lorabench.targets.engine_adapters import AdapterCache

    loop = asyncio.new_event_loop()
    cache = AdapterCache()
    cache.llm = StandInLLM(Costs(), EngineSpec(True, 2, 16, 12), 16, {})
    cache.run, cache._lora_ids = loop.run_until_complete, {f"a{i}": i + 1 for i in range(16)}
    # The stand-in's request, as the stand-in engine makes it: vLLM's LoRARequest cost the quick
    # loop's only import of vLLM (about 1.5 s) for the same three fields.
    cache.lora_request = lambda a: LoraRef(a.name, cache._lora_ids[a.name], str(a.path))
    adapters = [Adapter(f"a{i}", Path(f"/a{i}")) for i in range(16)]
    try:
        cache.load_adapters(adapters[4:])
        assert cache.cached_adapters() == {f"a{i}" for i in range(4, 16)}
        cache.load_adapters(adapters[:8])
        assert cache.cached_adapters() == {f"a{i}" for i in (*range(8), *range(12, 16))}
    finally:
        loop.close()
