"""A capacity probe that stops once certainly over (lorabench.measure.probe_stop): the rule on
requests whose fate is known, the replay it ends, the edge's interval over stopped probes, and
a search on the stand-in, which finds the same bracket with stops as without them."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lorabench.load.traces.synthetic import TraceRequest
from lorabench.measure import capacity, probe_stop, replay_tasks
from lorabench.measure.capacity_edge import _most_met_failing
from lorabench.measure.replay import ReplayedRequest, replay
from lorabench.results.records import replays_path_for, samples_path_for
from lorabench.targets.standin import Costs, StandIn, write_config
from lorabench.targets.standin.virtual_clock import VirtualClockLoop
from tests.helpers import ROOT, result_files
from tests.test_capacity import CAPACITY, service_rps
from tests.test_capacity_probes import ENGINE

SLOS = (60.0, 50.0)  # TTFT and TPOT limits, ms


def sent(index, at=0.0, tokens=(), finished=False, failed=False, scheduled=None, output_len=4):
    """A measured request sent at ``at`` (its schedule, unless told), with its tokens so far."""
    at_schedule = at if scheduled is None else scheduled
    return ReplayedRequest(index, "a", 8, output_len, at_schedule, at, list(tokens), finished, failed=failed)


def rule(planned=20, live=True, target=0.9):
    return probe_stop.SloLost(planned, target, SLOS, 0.0, live=live)


def late(index):  # finished, its first token 100 ms after its send
    return sent(index, tokens=[0.1, 0.11, 0.12, 0.13], finished=True)


def test_it_stops_when_the_misses_leave_the_target_out_of_reach_and_not_one_before():
    on_time = [sent(i, tokens=[0.01, 0.02, 0.03, 0.04], finished=True) for i in range(3, 10)]
    # 20 planned at 90 %: 18 must meet; two misses leave 18 possible, three do not.
    assert rule().check([late(0), late(1), *on_time], 1.0) == ""
    why = rule().check([late(0), late(1), late(2), *on_time], 1.0)
    assert why.startswith(f"{probe_stop.SLO_LOST}: 3 of 20 planned requests missed"), why
    assert rule(planned=9).check([late(i) for i in range(9)], 1.0) == "", "too few to decide: never stopped"


def test_a_request_in_flight_counts_as_missed_only_once_that_is_certain():
    waiting = [sent(i, at=0.0) for i in range(3)]  # no token yet
    # In process a token still to come is timed when the replay gets it, later than now.
    assert rule().check(waiting, 0.05) == "" and rule().check(waiting, 0.061) != ""
    # Over HTTP its bytes may have come and be held (the finishing chunk, until its usage): not yet.
    assert rule(live=False).check(waiting, 10.0) == ""
    first_late = [sent(i, tokens=[0.07]) for i in range(3)]
    assert rule(live=False).check(first_late, 0.08) != "", "a first token shown late is a miss anywhere"
    # Decoding: 3 tokens after the first at 50 ms each are due 150 ms after it.
    decoding = [sent(i, tokens=[0.01]) for i in range(3)]
    assert rule().check(decoding, 0.159) == "" and rule().check(decoding, 0.161) != ""
    assert rule(live=False).check(decoding, 10.0) == ""


def test_misses_of_the_client_or_of_a_broken_server_do_not_stop_a_probe():
    on_time = [sent(i, tokens=[0.01, 0.02, 0.03, 0.04], finished=True) for i in range(5, 20)]
    # 5 of 40 planned missed: enough to stop. Sent 10 ms late (under the 10 % rule's 15 ms) and
    # served in 55 ms: each missed the 60 ms TTFT from its schedule, by its client's lag.
    lagged = [sent(i, at=0.01, scheduled=0.0, tokens=[0.065, 0.07, 0.075, 0.08], finished=True) for i in range(5)]
    assert all(r.ttft_ms > SLOS[0] for r in lagged) and rule(planned=40).check([*lagged, *on_time], 1.0) == ""
    assert rule(planned=40).check([replace(r, sent_s=0.0) for r in lagged] + on_time, 1.0) != ""
    failed = [sent(i, failed=True) for i in range(5)]
    assert rule(planned=40).check([*failed, *on_time], 1.0) == ""
    # Behind by the 10 % rule: the probe's verdict is the client's, however many missed.
    behind = [sent(i, at=0.1, scheduled=0.0, tokens=[0.3], finished=True, output_len=1) for i in range(6)]
    assert rule(planned=40).check(behind, 1.0) == ""
    assert rule(planned=40).check([replace(r, sent_s=0.0) for r in behind], 1.0) != ""


def test_a_probe_past_half_its_requests_sent_runs_whole():
    on_time = [sent(i, tokens=[0.01, 0.02, 0.03, 0.04], finished=True) for i in range(3, 11)]
    records = [late(0), late(1), late(2), *on_time]  # 11 of 20 sent
    assert rule().check(records, 1.0) == "" and rule().check(records[:10], 1.0) != ""


class Stuck:
    """An engine whose requests never finish, and one whose outputs come held: their bytes
    came when sent, the client hands them over 100 ms later (as the HTTP engine's finishing
    chunk waits for its usage)."""

    vocab_size, block_size = 100, 16

    def __init__(self, held=False):
        self.held, self.cancelled = held, 0

    def cold_salt(self):
        return None

    def sampling_params(self, output_len, stream):
        return None

    async def stream(self, prompt, params, adapter, cache_salt=None):
        came = asyncio.get_running_loop().time()
        if self.held:
            await asyncio.sleep(0.1)
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1])], finished=True, received_at=came)
            return
        try:
            await asyncio.sleep(3600)
        finally:
            self.cancelled += 1
        yield None


def run_on_virtual_clock(engine, stop, n=20, gap=0.02):
    requests = [TraceRequest(gap * i, "a", 4, 1) for i in range(n)]
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(replay(engine, requests, {"a": "a"}, drain_timeout_s=1.0, stop=stop))
    finally:
        loop.close()


def test_a_stopped_replay_aborts_what_runs_and_returns_only_what_it_sent():
    engine, stop = Stuck(), rule(planned=20)
    records = run_on_virtual_clock(engine, stop)
    # One sent every 20 ms. At the look at 150 ms, five waited over 60 ms (sent 0 to 80 ms): the
    # target is out of reach, with 8 of 20 sent.
    assert stop.at_s == pytest.approx(0.15) and stop.why.startswith(f"{probe_stop.SLO_LOST}: 5 of 20")
    assert len(records) == engine.cancelled == 8 and not any(r.finished or r.failed for r in records)
    assert max(r.sent_s for r in records) <= stop.at_s
    whole = Stuck()
    assert len(run_on_virtual_clock(whole, None)) == 20 and whole.cancelled == 20, "without a stop: the drain's end"


def test_outputs_timed_before_they_are_handed_over_stop_nothing_unless_the_engine_says_so():
    """Every request's bytes came at once, handed over 100 ms later: each met the 60 ms TTFT.
    Taken for an in-process engine, whose tokens are timed when handed over, all would read as
    missed by the looks at 50 and 100 ms: the HTTP engine's outputs are not."""
    stop = rule(planned=40, live=False)
    records = run_on_virtual_clock(Stuck(held=True), stop, n=40, gap=0.01)
    assert stop.at_s is None and len(records) == 40 and all(r.finished and abs(r.ttft_ms) < 1e-6 for r in records)
    wrong = rule(planned=40, live=True)
    run_on_virtual_clock(Stuck(held=True), wrong, n=40, gap=0.01)
    assert wrong.at_s is not None, "the rule for an in-process engine would have stopped it"


def test_an_error_of_a_request_is_raised_when_the_replay_stops():
    in_flight = replay_tasks.InFlight()

    async def broken():
        raise RuntimeError("engine died")

    async def main():
        in_flight.add(asyncio.ensure_future(broken()))
        await asyncio.sleep(0)
        await replay_tasks.until_stopped(asyncio.sleep(10), Always(), [], 0.0, in_flight)

    class Always(replay_tasks.Stop):
        def check(self, records, now_s):
            return "now"

    with pytest.raises(RuntimeError, match="engine died"):
        asyncio.run(main())


def probe(rate, met, n=40, stopped=""):
    return capacity.Probe(rate, n, met, 0, 0.9, stopped=stopped, planned=n)


def test_a_stopped_probe_weighs_in_by_its_fail_alone_not_by_the_requests_it_sent():
    passing = [probe(2, 40), probe(4, 39)]
    stopped = capacity.boundary_interval([*passing, probe(8, 0, n=40, stopped="SLO lost")])
    # Its few early requests, all met, change nothing: they are not trials.
    early = replace(probe(8, 0, stopped="SLO lost"), requests=9, met=9)
    assert capacity.boundary_interval([*passing, early]) == stopped
    low, high = stopped
    assert 4 <= low < high < 16, "bounded above by the stop, not capped at its rate"
    whole = capacity.boundary_interval([*passing, probe(8, 4)])
    assert high >= whole[1], "a fail made certain says no more than its whole count would"
    assert capacity.boundary_interval([probe(8, 0, stopped="x")])[0] is None, "nothing bounds it below"
    assert [_most_met_failing(n, 0.9) for n in (10, 40, 41)] == [8, 35, 36]


def searched(seed, steepness, clear_share, duration=5.0, target=0.9):
    """A search against scripts/bench_capacity_interval.py's attainment curve, requests in
    random order, each fail stopped where ``probe_stop`` would: its misses made it certain
    while at most ``clear_share`` of them had come. Whether its interval covered the edge."""
    rng = np.random.default_rng(seed)
    r50 = float(rng.uniform(2.0, 20.0))
    edge = r50 * ((1 - target) / target) ** (1 / steepness)

    def probe_at(rate, stretch):
        n = int(rng.poisson(rate * duration * stretch))
        meets = rng.random(n) < 1 / (1 + (rate / r50) ** steepness)
        found = capacity.Probe(rate, n, int(meets.sum()), 0, target, stretch=stretch, planned=n)
        if not found.failed:
            return found
        certain = int(np.argmax(np.cumsum(~meets) >= n - _most_met_failing(n, target))) + 1
        return replace(found, stopped="SLO lost", requests=0, met=0) if certain <= clear_share * n else found

    limits = capacity.Limits(precision=0.25, min_rate=0.05, max_rate=None, max_probes=6, max_time_s=math.inf)
    found = capacity.search(probe_at, edge * float(rng.uniform(0.8, 3.0)), limits, clock=lambda: 0.0)
    low, high = capacity.boundary_interval(found.probes)
    return (low or 0.0) <= edge <= (high or math.inf)


def test_stopping_only_a_clear_overload_keeps_the_intervals_coverage():
    """Where attainment falls gradually (steepness 2), stopping every fail as soon as it is
    certain covered the edge in 81 % of 400 searches, against 91 % for whole probes: a one-bit
    fail near the edge rules rates out too firmly (capacity_edge). Stopped only while at most
    half their requests had come, 91 %."""
    seeds = range(1000, 1150)
    assert sum(searched(s, 2.0, probe_stop.CLEAR_SHARE) for s in seeds) / len(seeds) >= 0.9


def search_in(pytester, folder, costs):
    """The default test search on the stand-in (one request at a time), its run in ``folder``."""
    pytester.makepyfile(test_bench_capacity=(ROOT / "bench" / "test_capacity.py").read_text())
    config = write_config(pytester.path / folder, adapters=2, capacity=CAPACITY, engine=ENGINE)
    args = ("--bench-config", str(config), "-p", "no:cacheprovider")
    result = pytester.runpytest(*args, plugins=[StandIn(costs, virtual_clock=True)])
    result.assert_outcomes(passed=1)
    (csv,) = result_files(pytester.path / folder / "results")
    return result, csv


def test_a_search_stops_its_probes_far_over_the_stand_in_and_finds_the_same_bracket(pytester, monkeypatch):
    """The stand-in serves 55.6 requests/s, one at a time. A probe at twice that is stopped
    well before its end, its reason recorded, and fails as it would have: the search probes
    the same rates with the same verdicts as without stops. Probes under the rate never stop."""
    costs = Costs(prefill_ms_per_token=0.1, decode_ms_per_step=4.0)
    stopping, csv = search_in(pytester, "stops", costs)
    probes, row = pd.read_csv(replays_path_for(csv, "probes")), pd.read_csv(csv).iloc[0]
    monkeypatch.setattr(probe_stop.SloLost, "check", lambda self, records, now_s: "")
    _, csv_whole = search_in(pytester, "whole", costs)
    probes_whole, row_whole = pd.read_csv(replays_path_for(csv_whole, "probes")), pd.read_csv(csv_whole).iloc[0]

    assert probes_whole["stopped_early"].isna().all() and probes_whole["rate"].tolist() == probes["rate"].tolist()
    assert probes_whole["passed"].tolist() == probes["passed"].tolist()
    edge = ["capacity_rps", "capacity_over_rps"]
    assert row[edge].tolist() == row_whole[edge].tolist(), "the same bracket"
    early = probes[probes["stopped_early"].notna()]
    far = probes[probes["rate"] >= 1.5 * service_rps(costs, 20, 4)]
    assert not far.empty and far.index.isin(early.index).all(), "a probe far over ran whole"
    assert (far["stopped_at_s"] < 0.5 * far["duration_s"]).all() and (far["sent"] < far["planned"]).all()
    assert early["stopped_early"].str.startswith(f"{probe_stop.SLO_LOST}: ").all()
    assert early["decided"].all() and not early["passed"].any()
    assert not probes[probes["passed"]].index.isin(early.index).any(), "a probe under the rate stopped"
    assert (probes.loc[early.index, "seconds"] < probes_whole.loc[early.index, "seconds"]).all()
    samples = pd.read_csv(samples_path_for(csv))
    measured = samples[samples["arrival_s"] >= CAPACITY["warmup_s"]].groupby("round").size()
    assert measured.tolist() == probes["sent"].tolist(), "what was sent, and only that"
    stopping.stdout.fnmatch_lines([f"*: {len(early)} of {len(probes)} probes stopped early, saving * s of arrivals*"])
