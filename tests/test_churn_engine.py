"""The churn scenario on the real CPU engine, in process: vLLM's add_lora / remove_lora while
a short trace replays, every operation timed and none failed."""

from __future__ import annotations

import pytest


@pytest.mark.engine
def test_churn_on_the_cpu_engine_loads_and_unloads_while_a_trace_replays(replay_session):
    """The churn case of the replay session (tests/engine_sessions.py), on the build its traces share."""
    assert replay_session.passed("test_multilora_churn") == 1 and not replay_session.failed()
    (row,) = replay_session.rows[replay_session.rows["scenario"] == "churn"].to_dict("records")
    # 4 a second over 4 s: 16 operations, of which the two that start in the 0.5 s warm-up count nowhere.
    assert (row["churn_ops"], row["churn_failed_ops"], row["unfinished"]) == (14, 0, 0)
    assert 0 < row["load_ms_p50"] <= row["load_ms_p99"] < 5000
    assert 0 <= row["unload_ms_p50"] <= row["unload_ms_p99"] < 5000
    assert row["ttft_outside_load_ms_p50"] > 0 and row["num_requests"] > 5


@pytest.mark.engine
def test_churn_through_vllm_serve_uses_the_runtime_load_api(serve_session):
    """The serve target: vllm serve with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, its churn adapters
    unloaded, then loaded and unloaded over /v1/load_lora_adapter while a trace replays (in the
    serve session, tests/engine_sessions.py: 4 a second over 3 s)."""
    assert serve_session.passed("test_multilora_churn") == 1 and not serve_session.failed(but="test_isolation"), (
        serve_session.failed(but="test_isolation")
    )
    (row,) = serve_session.rows[serve_session.rows["scenario"] == "churn"].to_dict("records")
    assert row["target"] == "serve" and (row["churn_ops"], row["churn_failed_ops"], row["failed"]) == (12, 0, 0)
    assert 0 < row["load_ms_p50"] <= row["load_ms_p99"] < 5000 and row["unload_ms_p50"] > 0
