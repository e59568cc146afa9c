"""The online timeline over HTTP: the server's /metrics scraped at least twice a second while a
trace replays, into the in-process timeline's records, against the stand-in server (whose
counters and gauges come from its own steps: the ground truth)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lorabench.results.records import replays_path_for, samples_path_for
from lorabench.targets.http import telemetry
from lorabench.targets.standin import Costs, write_config
from lorabench.targets.standin.server import StandInServer
from tests.helpers import ROOT, result_files

# An excerpt of vLLM 0.32's /metrics, with a line lorabench does not read.
EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} 1.7e+09
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 120.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 999.0
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 500.0
vllm:generation_tokens_total{engine="0",model_name="m"} 700.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 9.0
"""


def test_a_scrape_is_one_record_whose_counts_are_the_counters_increase():
    before = telemetry.read(EXPOSITION.replace("120.0", "100.0").replace("700.0", "640.0"))
    record = telemetry._record(1.5, telemetry.read(EXPOSITION), before, 3)
    assert (record.t_s, record.kv_usage, record.running, record.waiting) == (1.5, 0.25, 3, 1)
    assert (record.adapters_running, record.adapters_waiting) == (2, 3), "the adapters waiting: the client's count"
    assert (record.steps, record.generation_tokens, record.preemptions, record.prompt_tokens) == (20, 60, 0, 0)
    assert telemetry._record(0.1, telemetry.read(EXPOSITION), None, 0).steps == 0, "no baseline: no increase"


@pytest.mark.parametrize(
    ("running", "waiting", "expected"),
    [("2.0", "0.0", 2), ("0.0", "3.0", 0), ("1.0", "1.0", 1), ("3.0", "2.0", 2)],
)
def test_vllm_names_every_adapter_in_flight_in_both_labels_and_the_requests_bound_them(running, waiting, expected):
    """vLLM 0.32 keeps an entry for each adapter with a request that had an output and writes
    the names (not the counts) into both labels: no more adapters run than requests do, nor
    than max_lora allows."""
    text = (
        EXPOSITION.replace("3.0", running)
        .replace('model_name="m"} 1.0', f'model_name="m"}} {waiting}')
        .replace(
            'running_lora_adapters="a,b",waiting_lora_adapters="c"',
            'running_lora_adapters="a,b,c",waiting_lora_adapters="a,b,c"',
        )
    )
    state = telemetry.read(text)
    assert (state.running, state.waiting, state.max_lora) == (int(float(running)), int(float(waiting)), 2)
    assert state.running_adapters() == expected
    assert telemetry._record(0.5, state, None, 0).adapters_running == expected


@pytest.mark.parametrize("with_server_gauges", [True, False])
@pytest.mark.realtime
def test_the_online_row_and_timeline_fill_over_http(pytester, with_server_gauges, monkeypatch):
    """1 s at 30 requests/s on 8 ms steps: a scrape every 0.25 s, with requests running, and
    one more at the replay's end: the records' generated tokens add up to those the replay
    received (without that last scrape, a quarter second's went missing). A server without
    the gauges gives no timeline, and the row says nothing wrong (half a second of traffic
    shows that). (It was 2 s: a second more of the wall clock; the first scrape's time below
    keeps a scraper of one a second from passing in the shorter replay.)"""
    pytester.makepyfile(test_multilora_online=(ROOT / "bench" / "test_multilora_online.py").read_text())
    duration = 1.0 if with_server_gauges else 0.5
    suite = {"num_adapters": [3], "rate": [30], "duration": duration, "input_range": [8, 16], "output_range": [8, 16]}
    config = write_config(pytester.path / "run", adapters=3, online={"suites": [suite]})
    if not with_server_gauges:
        monkeypatch.setattr(telemetry, "GAUGES", ("vllm:none",))
    with StandInServer(["a0", "a1", "a2"], Costs(decode_ms_per_step=8)) as server:
        args = ("--bench-config", str(config), "-p", "no:cacheprovider", "-k", "online", "--bench-target", server.url)
        result = pytester.runpytest(*args)
        generated = server.totals["generation_tokens"]
    result.assert_outcomes(passed=1)
    (csv,) = result_files(pytester.path / "run" / "results")
    (row,) = pd.read_csv(csv).to_dict("records")
    if not with_server_gauges:
        assert pd.isna(row["kv_usage_max"]) and pd.isna(row["waiting_p99"])
        result.stdout.fnmatch_lines(["*no engine timeline: the server's /metrics has no vllm:num_requests_running*"])
        return
    steps = pd.read_csv(replays_path_for(csv, "timeline"))
    gaps = steps["t_s"].diff().dropna()
    assert len(steps) >= 2 * duration and gaps.max() <= 0.5, "at least twice a second"
    assert steps["t_s"].iloc[0] <= 0.5, "from the replay's start"
    assert (steps["running"] > 0).mean() > 0.5 and row["kv_usage_max"] == steps["kv_usage"].max() > 0
    measured = steps[steps["t_s"] >= row["trace_warmup_s"]]
    assert row["waiting_p99"] == pytest.approx(np.percentile(measured["waiting"], 99))
    assert row["preemptions"] == measured["preemptions"].sum() == 0
    assert row["adapters_waiting_max"] == measured["adapters_waiting"].max() <= 3
    received = pd.read_csv(samples_path_for(csv))["output_tokens"].sum()
    assert received <= generated
    assert steps["generation_tokens"].sum() == received
    assert steps["steps"].sum() > 0


def test_a_request_awaits_its_first_output_until_it_comes_or_its_stream_ends():
    """The client's count of adapters waiting: a request counts from its send to its first
    output, or to its stream's end (a failure, a cancel); base-model requests never count."""
    awaiting = telemetry.Awaiting()

    async def outputs(gate, n):
        await gate.wait()
        for i in range(n):
            yield i

    async def consume(adapter, gate, n):
        return [o async for o in awaiting.track(adapter, outputs(gate, n))]

    async def scenario():
        gates = [asyncio.Event() for _ in range(4)]
        a0, a1 = SimpleNamespace(name="a0"), SimpleNamespace(name="a1")
        args = [(a0, gates[0], 2), (a0, gates[1], 0), (a1, gates[2], 1), (None, gates[3], 1)]
        tasks = [asyncio.ensure_future(consume(*a)) for a in args]
        await asyncio.sleep(0)
        counts = [awaiting.adapters()]
        gates[0].set()
        await asyncio.sleep(0.01)
        counts.append(awaiting.adapters())  # a0's second request still awaits
        tasks[2].cancel()
        gates[1].set()
        gates[3].set()
        await asyncio.gather(*tasks, return_exceptions=True)
        return counts + [awaiting.adapters()]

    assert asyncio.run(scenario()) == [2, 2, 0]


def test_recording_off_scrapes_nothing_over_http_as_in_process(monkeypatch):
    """``LORABENCH_TIMELINE=off`` (docs/metrics.md#the-timeline-file) turns the scraper off
    too: before, /metrics was scraped and the row's columns filled regardless."""
    from lorabench.targets.timeline import OFF

    monkeypatch.setenv("LORABENCH_TIMELINE", "off")
    monkeypatch.setattr(telemetry, "PERIOD_S", 0.01)  # two periods of a scraper on: 3 scrapes, not 0.5 s
    asked = []
    scraper = telemetry.Scraper(lambda: asked.append(1), lambda: 0)

    async def replay():
        scraper.start(0.0)
        await asyncio.sleep(2 * telemetry.PERIOD_S)
        await scraper.flush()
        return scraper.stop()

    assert asyncio.run(replay()) == [] and scraper.why_none == OFF and not asked


def test_the_scrape_that_straddles_the_warm_ups_end_counts_none_of_its_preemptions():
    """A scrape's counts cover the time since the one before: one at 1.1 s after a warm-up to
    1.0 s holds preemptions from the warm-up, as it holds prefix queries from it."""
    from lorabench.results.records import TimelineRecord
    from lorabench.targets import timeline

    def at(t_s, preemptions):
        state = {"steps": 1, "kv_usage": 0.5, "running": 1, "waiting": 0, "adapters_running": 1, "adapters_waiting": 0}
        return TimelineRecord(t_s=t_s, **state, preemptions=preemptions, prompt_tokens=0, generation_tokens=0)

    rows = [at(0.85, 1), at(1.1, 7), at(1.35, 2)]
    assert timeline.summarize(rows, 1.0, counts_until_t=True)["preemptions"] == 2
    assert timeline.summarize(rows, 1.0, counts_until_t=False)["preemptions"] == 9, "in process: from its t_s on"
