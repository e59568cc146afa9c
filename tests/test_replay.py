"""Online aggregates from replayed requests, and the replay's end with a small fake engine
(pure logic; the real replay runs in test_plugin.py)."""

import asyncio
import math
from types import SimpleNamespace

import pytest

from lorabench.load.traces.synthetic import TraceRequest
from lorabench.load.workload import synthetic_prompt
from lorabench.measure import replay as replay_module
from lorabench.measure.replay import ReplayedRequest, replay
from lorabench.measure.replay_summary import jain_index, summarize_online
from lorabench.measure.replay_summary import samples as summary_samples


def request(index, adapter, scheduled, sent, tokens, finished=True):
    return ReplayedRequest(index, adapter, 8, len(tokens), scheduled, sent, list(tokens), finished)


def test_per_request_times():
    r = request(0, "a", 1.0, 1.002, [1.1, 1.15, 1.15, 1.3])
    assert r.send_lag_ms == pytest.approx(2.0)
    # From the scheduled arrival: the 2 ms the client was late count, as the user waited them.
    assert r.ttft_ms == pytest.approx(100.0) and r.ttft_from_send_ms == pytest.approx(98.0)
    assert r.tpot_ms == pytest.approx(200.0 / 3)
    assert r.itl_ms == pytest.approx([50.0, 0.0, 150.0])
    assert r.e2e_ms == pytest.approx(300.0)
    assert math.isnan(request(1, "a", 0, 0, [], finished=False).ttft_ms)


def test_slo_attainment_goodput_fairness_and_warmup():
    records = [
        request(0, "a", 0.5, 0.5, [0.6, 0.7]),  # warm-up: left out of the statistics
        request(1, "a", 2.0, 2.0, [2.1, 2.2]),  # meets both targets
        request(2, "a", 3.0, 3.0, [3.5, 3.6]),  # TTFT 500 ms: misses
        request(3, "b", 4.0, 4.0, [4.1, 4.9]),  # TPOT 800 ms: misses
        request(4, "b", 5.0, 5.0, [5.1], finished=False),  # never finished: misses, counted
    ]
    metrics, per_adapter = summarize_online(records, slo_ttft_ms=200, slo_tpot_ms=300, warmup_s=1.0)
    assert metrics["num_requests"] == 4 and metrics["unfinished"] == 1
    assert metrics["slo_attainment"] == pytest.approx(0.25)
    span = 4.9 - 2.0
    assert metrics["goodput_rps"] == pytest.approx(1 / span)
    assert metrics["request_throughput"] == pytest.approx(3 / span)
    assert metrics["ttft_ms_p50"] == pytest.approx(100.0)
    assert per_adapter == [
        {"adapter": "a", "requests": 2, "slo_attainment": 0.5, "ttft_ms": pytest.approx(300.0)},
        {"adapter": "b", "requests": 2, "slo_attainment": 0.0, "ttft_ms": pytest.approx(100.0)},
    ]
    assert metrics["fairness"] == pytest.approx(0.5)


def test_jain_index():
    assert jain_index([0.9, 0.9, 0.9]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert math.isnan(jain_index([0.0, 0.0]))


def test_synthetic_prompts_have_exact_lengths():
    assert len(synthetic_prompt(3, 57, vocab_size=32000, seed=0)) == 57
    assert synthetic_prompt(3, 57, 32000, 0) == synthetic_prompt(3, 57, 32000, 0)
    assert synthetic_prompt(3, 57, 32000, 0) != synthetic_prompt(4, 57, 32000, 0)


class FakeEngine:
    """Streams one finished chunk for adapter "ok"; never finishes for "stuck"; fails for "bad"."""

    vocab_size = 100
    block_size = 16

    def __init__(self):
        self.cancelled = 0

    def cold_salt(self):
        return None

    def sampling_params(self, output_len, stream):
        return None

    async def stream(self, prompt, params, adapter, cache_salt=None):
        if adapter == "bad":
            raise RuntimeError("engine died: out of blocks")
        if adapter == "refused":  # as the HTTP engine ends a stream that got an error status
            return
        if adapter == "slow-parse":  # as the HTTP engine: the bytes came, then a 100 ms parse
            came = asyncio.get_running_loop().time()
            await asyncio.sleep(0.1)
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1, 2])], finished=True, received_at=came)
            return
        if adapter == "stuck":
            try:
                yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1])], finished=False)
                await asyncio.sleep(3600)
            finally:
                self.cancelled += 1
        yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1, 2])], finished=True)


def run_replay(engine, adapters):
    requests = [TraceRequest(0.01 * i, name, 4, 2) for i, name in enumerate(adapters)]
    return asyncio.run(replay(engine, requests, {name: name for name in adapters}, drain_timeout_s=0.2))


@pytest.mark.realtime
def test_requests_past_the_drain_timeout_are_aborted_and_reported_unfinished():
    engine = FakeEngine()
    records = run_replay(engine, ["ok", "stuck", "ok"])
    assert [r.finished for r in records] == [True, False, True]
    assert [len(r.token_times) for r in records] == [2, 1, 2]
    assert engine.cancelled == 1 and math.isnan(records[1].e2e_ms)


@pytest.mark.realtime
def test_tokens_are_timed_when_their_bytes_came_not_when_the_client_had_parsed_them():
    """An output that says when it was received (the HTTP engine's, stamped before its parse) is
    timed then: a client's parse of a long prompt's ids is no part of the engine's TTFT."""
    (record,) = run_replay(FakeEngine(), ["slow-parse"])
    assert record.finished and record.ttft_from_send_ms < 50, record.ttft_from_send_ms


def test_a_stream_the_engine_ends_unfinished_is_failed_and_an_aborted_one_is_not():
    records = run_replay(FakeEngine(), ["ok", "refused", "stuck"])
    assert [(r.finished, r.failed) for r in records] == [(True, False), (False, True), (False, False)]
    (failed,) = [s for s in summary_samples(records, {}) if s.failed]
    assert failed.request == 1 and not failed.finished


def test_the_drain_gives_each_request_its_slo_budget_times_the_margin_or_the_floor():
    short = [TraceRequest(0.0, "a", 4, 2), TraceRequest(1.0, "a", 4, 2)]
    assert replay_module.drain_s(short, 5.0, 100, 10) == 5.0, "short requests: the floor"
    # 600 tokens at a 20 ms TPOT: 2 x (0.1 + 12) s from its arrival, 9 s before the last one.
    long = [TraceRequest(0.0, "a", 4, 600), TraceRequest(9.0, "a", 4, 2)]
    assert replay_module.drain_s(long, 5.0, 100, 20) == pytest.approx(2 * 12.1 - 9.0)
    assert replay_module.DRAIN_MARGIN == 2.0


def test_an_engine_error_during_replay_is_raised_not_counted_as_unfinished():
    with pytest.raises(RuntimeError, match="out of blocks"):
        run_replay(FakeEngine(), ["ok", "bad"])


class FakeGC:
    """The collector as the replay sees it (``lorabench.measure.replay.gc``), without touching the
    real heap (the test session freezes it: tests/conftest.py)."""

    def __init__(self, frozen=0, enabled=True):
        self.frozen, self.enabled, self.calls = frozen, enabled, []

    def get_freeze_count(self):
        return self.frozen

    def isenabled(self):
        return self.enabled

    def freeze(self):
        self.calls.append("freeze")
        self.frozen = 1000

    def unfreeze(self):
        self.calls.append("unfreeze")
        self.frozen = 0


class Watcher(FakeEngine):
    """Notes, as each request is sent, whether the heap is frozen."""

    def __init__(self, fake_gc):
        super().__init__()
        self.gc, self.frozen = fake_gc, []

    def stream(self, prompt, params, adapter, cache_salt=None):
        self.frozen.append(self.gc.frozen > 0)
        return super().stream(prompt, params, adapter)


@pytest.mark.realtime
def test_the_heap_is_frozen_while_requests_are_sent_and_no_request_goes_early(monkeypatch):
    monkeypatch.setattr(replay_module, "gc", FakeGC())
    engine = Watcher(replay_module.gc)
    records = run_replay(engine, ["ok"] * 5)
    assert engine.frozen == [True] * 5 and engine.gc.calls == ["freeze", "unfreeze"], "frozen during the replay only"
    assert all(r.send_lag_ms >= 0 for r in records) and [r.finished for r in records] == [True] * 5


@pytest.mark.parametrize("state", [{"frozen": 5}, {"enabled": False}])
def test_a_heap_frozen_or_a_collector_turned_off_by_someone_else_is_left_alone(monkeypatch, state):
    monkeypatch.setattr(replay_module, "gc", FakeGC(**state))
    run_replay(Watcher(replay_module.gc), ["ok", "ok"])
    assert replay_module.gc.calls == []


def test_a_fail_that_the_late_sends_alone_account_for_is_the_clients():
    from lorabench.measure.replay_summary import client_behind, late_sends_fail, probe_behind

    # 40 requests, each served in 100 ms from its send (a 500 ms TTFT target); 3 of them
    # (7.5 %, under the 10 % rule) were sent 600 ms late. Against a 95 % target they fail the
    # probe, yet the engine met the SLO for every request from when it had it.
    records = [request(i, "a", i * 0.1, i * 0.1 + (0.6 if i % 13 == 1 else 0), []) for i in range(40)]
    for r in records:
        r.token_times = [r.sent_s + 0.1, r.sent_s + 0.12]
    assert not client_behind([r.send_lag_ms for r in records], 500.0)
    why = late_sends_fail(records, slo_ttft_ms=500.0, slo_tpot_ms=50.0, target=0.95)
    assert why.startswith("client fell behind: 3 of 40 requests missed the TTFT SLO only by their send lag")
    assert probe_behind(records, slo_ttft_ms=500.0, slo_tpot_ms=50.0, target=0.95) == why, "what a probe reads"
    # One request aborted at the drain fails the probe as an overload, whatever the lag did.
    aborted = records[5]
    saved, aborted.token_times = aborted.token_times, aborted.token_times[:1]
    aborted.finished = False
    assert late_sends_fail(records, slo_ttft_ms=500.0, slo_tpot_ms=50.0, target=0.95) == ""
    aborted.token_times, aborted.finished = saved, True
    # At a 90 % target the same probe passes: the lag decided nothing.
    assert late_sends_fail(records, slo_ttft_ms=500.0, slo_tpot_ms=50.0, target=0.9) == ""
    # The engine took 600 ms from their send too: it missed them whatever the client did.
    for r in records:
        if r.send_lag_ms > 0:
            r.token_times = [r.sent_s + 0.6, r.sent_s + 0.62]
    assert late_sends_fail(records, slo_ttft_ms=500.0, slo_tpot_ms=50.0, target=0.95) == ""
