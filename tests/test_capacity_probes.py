"""A capacity search's probes: one that measured too few requests decides nothing, each is
on disk as soon as it finishes (an engine that dies midway loses none), and each waits for
the engine to drop the last one's leftovers first. The search against queues whose
capacity is known, the rest on the stand-in engine."""

from __future__ import annotations

import asyncio
import math
import sys
import types

import numpy as np
import pandas as pd
import pytest

from lorabench.load.traces import data as trace_data
from lorabench.measure import capacity
from lorabench.results.records import replays_path_for, samples_path_for
from lorabench.scenarios import capacity_probes
from lorabench.targets.engine import IDLE_POLL_S, Engine
from lorabench.targets.failures import EngineDied, is_engine_dead
from lorabench.targets.standin import Costs, StandIn, write_config
from tests.helpers import ROOT, mooncake_like, result_files

SECONDS = 4.0  # a probe's measured span: the floor, 10 / SECONDS = 2.5 req/s, holds 10 requests on average
LIMITS = capacity.Limits(precision=0.1, min_rate=10 / SECONDS, max_rate=None, max_probes=30, max_time_s=math.inf)


def poisson_probe(true_rps: float, seed: int):
    """A queue that serves ``true_rps``, with Poisson arrivals: near the floor, a probe often
    measures fewer than 10 requests. Below capacity every request meets the SLO, above it the
    excess is left unfinished and 30 % of the rest meet it: what varies is how many requests a
    probe holds, so a wrong bracket can only come from deciding on too few."""
    rng = np.random.default_rng(seed)

    def probe(rate: float, stretch: float) -> capacity.Probe:
        n = int(rng.poisson(rate * SECONDS * stretch))
        excess = max(0.0, rate / true_rps - 1)
        unfinished = min(n, math.ceil(n * excess))
        met = n if not excess else int(rng.binomial(n - unfinished, 0.3))
        return capacity.Probe(rate=rate, requests=n, met=met, unfinished=unfinished, target=0.9, stretch=stretch)

    return probe


@pytest.mark.parametrize("seed", range(8))
def test_a_probe_of_too_few_requests_decides_nothing_and_is_rerun_longer(seed):
    true_rps = 3.0 + seed * 0.1  # just above the floor: its probes hold about 10 to 15 requests
    found = capacity.search(poisson_probe(true_rps, seed), 6.0, LIMITS)
    assert found.stop == capacity.BRACKETED
    assert found.capacity.rate <= true_rps < found.over.rate <= found.capacity.rate * (1 + LIMITS.precision)
    assert found.capacity.requests >= capacity.MIN_REQUESTS and found.over.requests >= capacity.MIN_REQUESTS
    for probe, after in zip(found.probes, found.probes[1:]):
        if not probe.decided:
            assert probe.requests < capacity.MIN_REQUESTS and not probe.passed and not probe.failed
            assert after.rate == probe.rate and after.stretch == 2 * probe.stretch
    decided = [p for p in found.probes if p.decided]
    assert max(p.rate for p in decided if p.passed) < min(p.rate for p in decided if p.failed)


def test_some_probe_of_those_searches_was_undecided():
    """Else the test above checks nothing: near the floor, Poisson counts fall under 10 often."""
    searches = [capacity.search(poisson_probe(3.0 + s * 0.1, s), 6.0, LIMITS) for s in range(8)]
    assert any(not p.decided for found in searches for p in found.probes)


def test_a_probe_that_stays_too_short_stops_the_search_and_says_so():
    def few(rate: float, stretch: float) -> capacity.Probe:
        return capacity.Probe(rate=rate, requests=3, met=3, unfinished=0, target=0.9, stretch=stretch)

    found = capacity.search(few, 6.0, LIMITS)
    assert found.stop == capacity.TOO_FEW and [p.stretch for p in found.probes] == [1, 2, 4]
    assert found.capacity is None and found.over is None, "three met out of three is no pass"

    def capped(rate: float, stretch: float) -> capacity.Probe:  # an imported trace that runs out
        return capacity.Probe(rate=rate, requests=3, met=3, unfinished=0, target=0.9, stretch=min(stretch, 1.5))

    found = capacity.search(capped, 6.0, LIMITS)
    assert found.stop == capacity.TOO_FEW and [p.stretch for p in found.probes] == [1, 1.5]


def test_a_rerun_counts_as_long_as_it_is_against_the_time_limit():
    ticks = iter(range(100))
    brief = capacity.Limits(precision=0.1, min_rate=2.5, max_rate=None, max_probes=30, max_time_s=4, probe_s=1.0)

    def few(rate: float, stretch: float) -> capacity.Probe:
        return capacity.Probe(rate=rate, requests=3, met=3, unfinished=0, target=0.9, stretch=stretch)

    # Ticks 0 (start), 1 (first probe: 1 + 1 s <= 4), 2 (its rerun: 2 + 2 s <= 4), 3 (the next: 3 + 4 s > 4).
    found = capacity.search(few, 6.0, brief, clock=lambda: next(ticks))
    assert found.stop == capacity.TIME_LIMIT and [p.stretch for p in found.probes] == [1, 2]


CAPACITY = {
    "slo_ttft_ms": 60,
    "slo_tpot_ms": 50,
    "probe_duration_s": 0.7,
    "warmup_s": 0.1,
    "drain_s": 0.4,
    "precision": 0.2,
    "estimate_requests": 12,
    "estimate_concurrency": 1,
    "shapes": [{"name": "s", "num_adapters": [2], "cv": [0.1], "input_range": [20, 20], "output_range": [4, 4]}],
}
ENGINE = {"max_loras": 2, "max_lora_rank": 8, "max_cpu_loras": 4, "max_num_seqs": 1}


def run_search(pytester, costs: Costs, engine=ENGINE, **capacity_values):
    pytester.makepyfile(test_bench_capacity=(ROOT / "bench" / "test_capacity.py").read_text())
    config = write_config(pytester.path / "run", adapters=2, capacity={**CAPACITY, **capacity_values}, engine=engine)
    return pytester.runpytest(
        "--bench-config", str(config), "-p", "no:cacheprovider", plugins=[StandIn(costs, virtual_clock=True)]
    )


def test_an_engine_that_dies_midway_keeps_the_probes_that_finished(pytester, monkeypatch):
    kept_before_death = 2
    probe = capacity_probes.Prober.probe

    def dies_in_the_third(self, rate, stretch):
        if len(self.kept) == kept_before_death:  # the engine dies at this probe's third request
            self.engine.llm.die_after = self.engine.llm.sent + 3
        return probe(self, rate, stretch)

    monkeypatch.setattr(capacity_probes.Prober, "probe", dies_in_the_third)
    result = run_search(pytester, Costs(prefill_ms_per_token=0.1, decode_ms_per_step=4.0))
    result.assert_outcomes(failed=1)
    (csv,) = result_files(pytester.path / "run" / "results")
    path = replays_path_for(csv, "probes")
    result.stdout.fnmatch_lines(
        [
            "*engine loras2-rank8-cpu4-build0 died: *test_capacity*: EngineDied: the stand-in engine died after "
            f"* requests, as the test asked; capacity search: 2 finished probes kept in {path} (engine log: *.log)"
        ]
    )
    assert pd.read_csv(csv).empty, "no row for a search that did not finish"
    probes = pd.read_csv(path)
    assert probes["probe"].tolist() == [0, 1] and (probes["scenario"] == "capacity").all()
    assert probes["engine_id"].unique().tolist() == ["loras2-rank8-cpu4-build0"] and probes["requests"].gt(0).all()
    samples = pd.read_csv(samples_path_for(csv))
    assert sorted(samples["round"].unique()) == [0, 1], "the finished probes' requests are kept, the dead one's not"
    assert (samples["timestamp"] == probes["timestamp"].iloc[0]).all(), "keyed as the probes they belong to"
    measured = samples[samples["arrival_s"] >= CAPACITY["warmup_s"]].groupby("round").size()
    assert measured.tolist() == probes["requests"].tolist(), "each probe's measured requests, as its summary counts"


def test_a_search_that_fails_otherwise_says_how_many_probes_it_kept(pytester, monkeypatch):
    probe = capacity_probes.Prober.probe

    def breaks_in_the_second(self, rate, stretch):
        if len(self.kept) == 1:
            raise ValueError("a bug in the second probe")
        return probe(self, rate, stretch)

    monkeypatch.setattr(capacity_probes.Prober, "probe", breaks_in_the_second)
    result = run_search(pytester, Costs(prefill_ms_per_token=0.1, decode_ms_per_step=4.0))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*SearchFailed: ValueError: a bug in the second probe; capacity search: 1 finished probe kept in *probes.csv*"]
    )


def test_each_probe_waits_for_the_last_ones_aborted_requests_to_leave_the_engine(pytester, monkeypatch):
    """Probes far over the engine's rate, whose last requests outlast their drain (twice their
    SLO budget from their arrival, docs/capacity.md: 0.16 s with a 5 ms TPOT target): each
    ends with some aborted, which the stand-in keeps running for ``abort_ms``. The next probe
    starts once they are gone. The estimate is set 3x over the stand-in's rate, so the first
    probes are overloaded however busy the host is."""

    async def high_estimate(*_args):
        return 600.0

    monkeypatch.setattr(capacity_probes, "closed_loop", high_estimate)
    costs = Costs(prefill_ms_per_token=0.1, decode_ms_per_step=4.0, abort_ms=300)
    engine = {**ENGINE, "max_num_seqs": 4}
    result = run_search(pytester, costs, engine, drain_s=0.001, slo_tpot_ms=5, max_probes=3)
    result.assert_outcomes(passed=1)
    (csv,) = result_files(pytester.path / "run" / "results")
    probes = pd.read_csv(replays_path_for(csv, "probes"))
    # Aborted at the drain's end (unfinished), or at an early stop (sent, not finished).
    after_aborts = probes[(probes["sent"] - probes["finished"]).shift() > 0]
    assert not after_aborts.empty, "no probe left requests aborted: nothing to wait for"
    assert (after_aborts["idle_wait_s"] > IDLE_POLL_S).all() and (probes["busy_at_start"] == 0).all()
    assert probes["idle_wait_s"].max() < capacity_probes.IDLE_TIMEOUT_S


class Busy:
    """An engine that says it has ``left`` unfinished requests, or cannot tell (None)."""

    def __init__(self, left: int | None) -> None:
        self.left = left

    def unfinished_requests(self) -> int | None:
        return self.left


def test_the_wait_for_an_idle_engine_is_bounded_and_skipped_where_it_cannot_tell():
    waited, left = asyncio.run(Engine.wait_idle(Busy(2), 0.05))  # type: ignore[arg-type]
    assert waited >= 0.05 and left == 2
    assert asyncio.run(Engine.wait_idle(Busy(None), 10)) == (None, None)  # type: ignore[arg-type]
    waited, left = asyncio.run(Engine.wait_idle(Busy(0), 10))  # type: ignore[arg-type]
    assert left == 0 and waited < 10


def test_an_engine_death_is_told_from_vllms_error_without_importing_vllm(monkeypatch):
    """A search that fails on a stand-in asks whether the engine died: vLLM's error can only
    be raised where vLLM is imported, and importing it to ask took seconds."""
    name = "vllm.v1.engine.exceptions"
    monkeypatch.delitem(sys.modules, name, raising=False)
    assert not is_engine_dead(ValueError("a bug")) and name not in sys.modules
    assert is_engine_dead(EngineDied("gone"))

    class EngineDeadError(Exception):
        pass

    monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(EngineDeadError=EngineDeadError))
    caused = RuntimeError("stream failed")
    caused.__cause__ = EngineDeadError()
    assert is_engine_dead(EngineDeadError()) and is_engine_dead(caused) and not is_engine_dead(ValueError())


def test_requests_longer_than_the_drain_are_given_their_slo_budget_not_counted_as_overload(pytester):
    """60 output tokens at 4 ms a step take 0.25 s alone, over the 0.1 s drain: with the drain
    counted from the last arrival, every probe left its last requests unfinished and failed at
    any rate. Each request is given twice its SLO budget from its arrival instead (1.1 s here)."""
    shape = {**CAPACITY["shapes"][0], "output_range": [60, 60]}
    costs = Costs(prefill_ms_per_token=0.1, decode_ms_per_step=4.0)
    engine = {**ENGINE, "max_num_seqs": 8}
    values = {"drain_s": 0.1, "slo_tpot_ms": 8, "shapes": [shape], "max_probes": 2, "estimate_concurrency": 8}
    result = run_search(pytester, costs, engine, **values)
    result.assert_outcomes(passed=1)
    (csv,) = result_files(pytester.path / "run" / "results")
    probes = pd.read_csv(replays_path_for(csv, "probes"))
    first = probes.iloc[0]
    # Eight at a time, 0.25 s each: about 30 requests/s; the first probe is at the floor, 16.7/s.
    assert first["rate"] < 25 and first["passed"] and first["unfinished"] == 0, probes.to_dict("records")


def test_a_client_that_falls_behind_passes_no_rate_it_could_not_send(pytester):
    """The stand-in serves fast, but its sender blocks 10 ms on every send: the client cannot
    send more than 100 requests/s. A probe over that offers the engine less than its rate; its
    TTFT from the send stays small, so it passed as if the engine served the rate. Its client
    now falls behind, twice, and the search stops there: no rate over 100/s passes."""
    costs = Costs(prefill_ms_per_token=0.01, decode_ms_per_step=0.5, send_block_ms=10)
    engine = {**ENGINE, "max_num_seqs": 8}
    result = run_search(pytester, costs, engine, estimate_concurrency=8, max_probes=5)
    result.assert_outcomes(passed=1)
    (csv,) = result_files(pytester.path / "run" / "results")
    (row,) = pd.read_csv(csv).to_dict("records")
    probes = pd.read_csv(replays_path_for(csv, "probes"))
    assert (probes[probes["passed"]]["rate"] <= 100).all(), probes.to_dict("records")
    assert row["search_stop"].startswith("client fell behind: "), row["search_stop"]
    behind = probes[probes["undecided_why"].fillna("").str.startswith("client fell behind")]
    assert len(behind) == 2 and not behind["passed"].any() and not behind["decided"].any()
    assert (behind["send_lag_ms_p99"] > 0.25 * CAPACITY["slo_ttft_ms"]).all()
    assert (probes["send_lag_ms_max"] >= probes["send_lag_ms_p99"]).all()
    # TTFT from the scheduled arrival carries the lag; from the send, it does not.
    assert (behind["ttft_ms_p99"] > behind["ttft_from_send_ms_p99"]).all()


def test_every_probe_of_an_imported_trace_replays_the_same_requests(pytester):
    """Each probe replayed the first ``rate x duration`` requests of the trace: a faster one
    more of them, so a rate could pass on lighter requests where a slower one failed. Now the
    slice is fixed at the first rate, and a probe is whole copies of it at its rate."""
    rng = np.random.default_rng(7)
    n = 600
    data = trace_data.TraceData(
        header={"source": {"format": "test"}, "transforms": []},
        adapters=["a0", "a1"],
        arrival_s=np.round(np.sort(rng.uniform(0, 20, n)), 4),
        adapter=rng.integers(0, 2, n).astype(np.int32),
        input_len=rng.integers(10, 40, n).astype(np.int32),
        output_len=np.full(n, 4, dtype=np.int32),
        duration_s=20.0,
    )
    trace_data.write(pytester.path / "t.jsonl", data)
    shape = {"name": "t", "trace": str(pytester.path / "t.jsonl")}
    result = run_search(pytester, Costs(prefill_ms_per_token=0.1, decode_ms_per_step=4.0), shapes=[shape], max_probes=3)
    result.assert_outcomes(passed=1)
    (csv,) = result_files(pytester.path / "run" / "results")
    samples = pd.read_csv(samples_path_for(csv)).sort_values(["round", "request"])
    rounds = [list(zip(g["prompt_tokens"], g["adapter"])) for _, g in samples.groupby("round")]
    stopped = pd.read_csv(replays_path_for(csv, "probes"))["stopped_early"].notna().tolist()
    assert len(rounds) == 3 and not stopped[0]
    first = rounds[0]  # one copy of the slice at the first rate
    for requests, early in zip(rounds[1:], stopped[1:]):
        # A probe stopped early sent the copies' first requests only.
        copies = -(-len(requests) // len(first))
        assert (early or len(requests) % len(first) == 0) and requests == (first * copies)[: len(requests)]


def test_each_probe_of_a_shared_prefix_trace_finds_cached_what_one_copy_of_its_slice_shares(pytester):
    """A probe's prompt tokens found cached (the stand-in caches as vLLM keys its blocks) are
    what the trace's hash ids predict, and a probe of several copies of the slice finds no
    more than one copy does: a copy never finds the copy before it cached (with the slice's
    own ids in every copy, a 2-copy probe predicted 62 % where one copy has 0 %)."""
    from lorabench.cli import main as cli

    (pytester.path / "traces").mkdir()
    source = mooncake_like(pytester.path / "moon.jsonl", 60, seed=3)
    options = ["--hash-block-tokens", "32", "--label-column", "user", "--num-adapters", "2"]
    assert cli.main(["trace", "import", "mooncake", str(source), "--out", "traces/moon.jsonl", *options]) == 0
    shape = {"name": "moon", "trace": str(pytester.path / "traces" / "moon.jsonl")}
    engine = {**ENGINE, "max_num_seqs": 4, "enable_prefix_caching": True}
    costs = Costs(prefill_ms_per_token=0.05, decode_ms_per_step=2.0)
    result = run_search(pytester, costs, engine=engine, shapes=[shape], max_probes=3, estimate_requests=6)
    result.assert_outcomes(passed=1)
    (csv,) = result_files(pytester.path / "run" / "results")
    probes = pd.read_csv(replays_path_for(csv, "probes"))
    # The first probe is one copy of the slice; one at twice its rate, two copies.
    assert len(probes) == 3 and probes["rate"].max() >= 2 * probes["rate"].iloc[0], probes["rate"]
    assert (probes["prefix_hit_rate_predicted"] > 0.3).all()
    assert (abs(probes["prefix_hit_rate"] - probes["prefix_hit_rate_predicted"]) < 0.03).all(), probes
    one = probes["prefix_hit_rate_predicted"].iloc[0]
    assert (abs(probes["prefix_hit_rate_predicted"] - one) < 0.05).all(), probes["prefix_hit_rate_predicted"]
