"""The engine timeline of online replays and each adapter's usage: recorded from the stat
loggers the engine calls each step, written beside the samples, summed up in the row and
drawn by the report. Here the records are checked against the stats the stand-in handed its
loggers (the plumbing); tests/test_contention.py plants contention and checks the true counts."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lorabench.analysis.report import write_report
from lorabench.analysis.report.runs import case_keys
from lorabench.results.records import replays_path_for, samples_path_for
from lorabench.targets import timeline
from lorabench.targets.standin import Costs, StandIn, write_config
from tests.engine_sessions import ONLINE_WARMUP_S
from tests.helpers import ROOT, result_files

# Steps of 10 ms, records of 5 ms (BUCKET_S, patched from 50 ms where SHORT_RECORDS is used):
# a step never lasts less than 9 ms (lorabench.targets.standin), so each step is its own record.
# At 50 ms records the steps had to last 60 ms, and the build's digests alone took 2 s.
SHORT_RECORDS = 0.005
SLOW_STEPS = Costs(decode_ms_per_step=10)
ONLINE = {
    "warmup_s": 0.2,
    "suites": [{"num_adapters": [3], "rate": [40], "duration": 0.6, "input_range": [8, 64], "output_range": [2, 6]}],
}


def scheduler(kv=0.0, running=0, waiting=0, adapters_running=(), deferred=0):
    """A step's stats as vLLM 0.32 makes them: ``deferred`` requests (waiting for a LoRA slot)
    apart from ``waiting``, and its front end's adapter entries, none of them waiting."""
    return SimpleNamespace(
        kv_cache_usage=kv,
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        num_skipped_waiting_reqs=deferred,
        running_lora_adapters=dict.fromkeys(adapters_running, 1),
        waiting_lora_adapters=dict.fromkeys(adapters_running, 0),
    )


class FrontEnd:
    """vLLM's ``AsyncLLM`` as the recorder reads it: its requests' states (``RequestState``)."""

    def __init__(self):
        self.output_processor = SimpleNamespace(request_states={})

    def awaiting(self, *adapters):
        """Requests for ``adapters`` (None: the base model) with no output yet, and nothing else."""
        states = self.output_processor.request_states
        states.clear()
        for n, name in enumerate(adapters):
            states[f"r{n}"] = SimpleNamespace(lora_name=name, is_prefilling=True)
        states["done"] = SimpleNamespace(lora_name="z", is_prefilling=False)


def iteration(preempted=0, prompt=0, generated=0):
    return SimpleNamespace(num_preempted_reqs=preempted, num_prompt_tokens=prompt, num_generation_tokens=generated)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_steps_within_50_ms_merge_into_one_record_and_only_a_replay_records():
    clock = Clock()
    recorder, front_end = timeline.Recorder(clock), FrontEnd()
    recorder.watch(front_end)
    (factory,) = recorder.factories()
    logger = factory(None, 0)
    logger.record(scheduler_stats=scheduler(kv=0.9), iteration_stats=iteration(generated=5))  # not recording
    recorder.start(clock.now)
    for dt, kv, running, waiting, adapters in ((0.01, 0.2, 2, 5, "ab"), (0.03, 0.5, 1, 7, "a"), (0.07, 0.1, 0, 0, "")):
        clock.now = 100.0 + dt
        front_end.awaiting(*adapters[:1])
        stats = scheduler(kv, running, waiting, adapters_running=adapters)
        logger.record(scheduler_stats=stats, iteration_stats=iteration(preempted=1, prompt=10, generated=running))
    logger.record(scheduler_stats=None, iteration_stats=iteration(generated=3))  # stats without the scheduler's
    first, second = recorder.stop()
    assert (first.t_s, first.steps, first.kv_usage, first.running, first.waiting) == pytest.approx((0.01, 2, 0.5, 2, 7))
    assert (first.adapters_running, first.adapters_waiting) == (2, 1)
    assert (first.preemptions, first.prompt_tokens, first.generation_tokens) == (2, 20, 3)
    assert (second.steps, second.kv_usage, second.generation_tokens) == (2, 0.1, 3)
    logger.record(scheduler_stats=scheduler(kv=0.9), iteration_stats=None)
    assert recorder.rows == [first, second], "nothing after stop"
    assert timeline.summarize(recorder.rows, warmup_s=0.05, counts_until_t=False) == {
        "kv_usage_max": 0.1,
        "waiting_p99": 0.0,
        "preemptions": 1,
        "adapters_waiting_max": 0,
    }
    assert timeline.summarize(recorder.rows, warmup_s=1.0, counts_until_t=False) == {}


def test_waiting_counts_the_requests_deferred_for_a_slot_and_their_adapters_from_the_front_end():
    """vLLM 0.32 counts requests deferred for a LoRA slot apart from the scheduler's waiting
    ones, and its front end's adapter counts never have one waiting: the recorder adds the
    deferred in, and counts the distinct adapters of the requests with no output yet."""
    recorder, front_end = timeline.Recorder(Clock()), FrontEnd()
    recorder.watch(front_end)
    (factory,) = recorder.factories()
    recorder.start(0.0)
    front_end.awaiting("a1", "a1", "a2", None)
    factory(None, 0).record(scheduler_stats=scheduler(0.5, 2, 1, ["a0"], deferred=3), iteration_stats=iteration())
    (record,) = recorder.stop()
    assert (record.running, record.waiting, record.adapters_running, record.adapters_waiting) == (2, 4, 1, 2)


def test_stats_that_no_longer_read_stop_the_recording_and_never_reach_vllm():
    recorder = timeline.Recorder()
    (factory,) = recorder.factories()
    logger = factory(None, 0)
    recorder.start(0.0)
    logger.record(scheduler_stats=SimpleNamespace(kv_cache_usage=0.5), iteration_stats=None)  # raises nothing
    assert recorder.stop() == [] and "AttributeError" in recorder.why_none
    recorder.start(0.0)
    assert not recorder.recording, "a vLLM whose stats changed stays unrecorded"


def test_the_switch_and_an_unknown_interface_build_without_a_logger(monkeypatch):
    class OldAsyncLLM:
        @classmethod
        def from_engine_args(cls, engine_args):
            return cls()

    recorder = timeline.Recorder()
    assert recorder.vllm_kwargs(OldAsyncLLM) == {} and "takes no stat_loggers" in recorder.why_none
    monkeypatch.setenv(timeline.SWITCH, "off")
    recorder = timeline.Recorder()
    assert recorder.factories() == [] and recorder.why_none == timeline.OFF
    assert timeline.Recorder().vllm_kwargs(OldAsyncLLM) == {}


def test_case_keys_match_across_files_whatever_pandas_read():
    a = pd.DataFrame({"run_id": ["r"], "max_loras": [2.0], "batch_size": [np.nan], "trace_rate": [0.5]})
    b = pd.DataFrame({"run_id": ["r"], "max_loras": [2], "batch_size": [None], "trace_rate": [0.5]})
    assert case_keys(a).tolist() == case_keys(b).tolist()
    assert case_keys(a).tolist() != case_keys(b.assign(max_loras=4)).tolist()


def test_adapters_awaiting_a_first_token_from_the_samples():
    from lorabench.analysis.report.online_figures import _awaiting_first_token

    requests = pd.DataFrame(
        {
            "adapter": ["a", "a", "b"],
            "arrival_s": [0.0, 0.01, 0.05],
            "send_lag_ms": [0.0, 0.0, 0.0],
            "ttft_ms": [100.0, 20.0, np.nan],  # b never got a token
        }
    )
    counts = _awaiting_first_token(requests, np.array([0.0, 0.02, 0.06, 0.2]))
    assert counts.tolist() == [1, 1, 2, 1]


@pytest.fixture
def online_run(pytester):
    """Replay one short trace on a stand-in; returns the plugin, the run's files and pytest's result."""
    pytester.makepyfile(test_multilora_online=(ROOT / "bench" / "test_multilora_online.py").read_text())

    def run(costs: Costs) -> tuple:
        plugin = StandIn(costs, virtual_clock=True)
        config = write_config(pytester.path / "run", adapters=3, online=ONLINE)
        result = pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", plugins=[plugin])
        (csv,) = result_files(pytester.path / "run" / "results")
        files = {kind: replays_path_for(csv, kind) for kind in ("timeline", "adapters")}
        files["samples"] = samples_path_for(csv)
        return plugin, csv, files, result

    return run


def test_the_timeline_follows_the_stand_ins_stats_and_sums_up_in_the_row(online_run, tmp_path, monkeypatch):
    monkeypatch.setattr(timeline, "BUCKET_S", SHORT_RECORDS)
    plugin, csv, files, result = online_run(SLOW_STEPS)
    result.assert_outcomes(passed=1)
    (row,) = pd.read_csv(csv).to_dict("records")
    steps = pd.read_csv(files["timeline"])
    (engine,) = plugin.engines
    truth = [
        (s.kv_cache_usage, s.num_running_reqs, s.num_waiting_reqs + s.num_skipped_waiting_reqs)
        for s, _ in engine.stats_sent
    ]
    recorded = list(zip(steps["kv_usage"], steps["running"], steps["waiting"]))
    # Before the replay, the build's digests took steps of their own: the replay's are the last.
    assert len(truth) > len(recorded) > 10 and (steps["steps"] == 1).all()
    assert recorded == truth[-len(recorded) :]
    assert steps["kv_usage"].max() > 0 and steps["t_s"].is_monotonic_increasing
    measured = steps[steps["t_s"] >= ONLINE["warmup_s"]]
    assert row["kv_usage_max"] == measured["kv_usage"].max()
    assert row["waiting_p99"] == pytest.approx(np.percentile(measured["waiting"], 99))
    assert row["preemptions"] == measured["preemptions"].sum() == 0
    assert row["adapters_waiting_max"] == measured["adapters_waiting"].max()
    assert (steps["adapters_running"] <= 2).all(), "max_loras is 2"

    samples = pd.read_csv(files["samples"])
    sent = samples[samples["arrival_s"] >= ONLINE["warmup_s"]].groupby("adapter")
    usage = pd.read_csv(files["adapters"]).set_index("adapter")
    assert usage["requests"].to_dict() == sent.size().to_dict() and len(usage) == 3
    assert usage["prompt_tokens"].to_dict() == sent["prompt_tokens"].sum().to_dict()
    assert usage["output_tokens"].to_dict() == sent["output_tokens"].sum().to_dict()

    page = write_report([csv], tmp_path / "report")
    assert (page.parent / "timelines" / "1.png").is_file() and (page.parent / "online_adapters.png").is_file()
    assert 'src="timelines/1.png"' in page.read_text()


def test_with_recording_off_the_replay_runs_and_says_why_its_columns_are_blank(online_run, monkeypatch):
    monkeypatch.setenv(timeline.SWITCH, "off")
    _, csv, files, result = online_run(Costs())
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*no engine timeline: recording is off ({timeline.SWITCH}=off)*"])
    (row,) = pd.read_csv(csv).to_dict("records")
    assert all(np.isnan(row[c]) for c in ("kv_usage_max", "waiting_p99", "preemptions", "adapters_waiting_max"))
    assert row["num_requests"] > 0 and not files["timeline"].exists() and files["adapters"].exists()


@pytest.mark.engine
def test_a_real_engines_timeline_and_its_figure(replay_session):
    """vLLM's own stat loggers interface, on the CPU engine: KV usage above 0 while requests run.
    The ``tl`` trace of the replay session (tests/engine_sessions.py)."""
    assert replay_session.passed("test_multilora_online") == 2 and not replay_session.failed()
    csv, report = replay_session.csv, replay_session.folder / "report"
    steps = pd.read_csv(replays_path_for(csv, "timeline"))
    steps = steps[steps["trace_suite"] == "tl"]
    busy = steps[steps["running"] > 0]
    assert len(busy) > 5 and (busy["kv_usage"] > 0).all()
    assert (steps["adapters_running"] <= 2).all() and steps["generation_tokens"].sum() > 0
    (row,) = replay_session.rows[replay_session.rows["trace_suite"] == "tl"].to_dict("records")
    assert row["trace_warmup_s"] == ONLINE_WARMUP_S
    assert row["kv_usage_max"] == steps[steps["t_s"] >= ONLINE_WARMUP_S]["kv_usage"].max() > 0
    assert (report / "timelines" / "1.png").is_file()
    assert len(list((report / "timelines").glob("*.png"))) >= 2, "a timeline figure for each trace"
    usage = pd.read_csv(replays_path_for(csv, "adapters"))
    usage = usage[usage["trace_suite"] == "tl"]
    assert usage["requests"].sum() == row["num_requests"] and (usage["output_tokens"] > 0).all()
    assert (report / "online_adapters.png").is_file()
