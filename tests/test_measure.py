from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from lorabench.load.adapters import Adapter
from lorabench.load.workload import Batch, Request
from lorabench.measure.latency import MeasurementError, measure_round, summarize

A = Adapter("a", Path("/a"))


def output(queued, scheduled, first, last, tokens, prompt=8):
    metrics = SimpleNamespace(queued_ts=queued, scheduled_ts=scheduled, first_token_ts=first, last_token_ts=last)
    return SimpleNamespace(
        metrics=metrics, prompt_token_ids=[0] * prompt, outputs=[SimpleNamespace(token_ids=[1] * tokens)]
    )


def batch(n):
    return Batch(tuple(Request([0] * 8, A if i % 2 else None) for i in range(n)), (A,))


def test_metrics_come_from_the_named_timestamps():
    rnd = measure_round(0, 0.5, [output(10.0, 10.1, 10.3, 10.6, 4)], batch(1), output_len=4)
    (req,) = rnd.requests
    assert req.queue_ms == pytest.approx(100.0)
    assert req.ttft_ms == pytest.approx(300.0)
    assert req.prefill_ms == pytest.approx(200.0)
    assert req.decode_ms == pytest.approx(100.0)  # 300 ms over 3 decode steps
    assert req.request_e2e_ms == pytest.approx(600.0)
    assert rnd.e2e_ms == pytest.approx(500.0)
    assert rnd.output_tokens_per_s == pytest.approx(8.0)
    assert req.adapter == "" and req.prompt_tokens == 8


def test_summary_pools_requests_of_all_rounds_and_rounds_for_e2e():
    rounds = [
        measure_round(r, 0.1 * (r + 1), [output(0, 0, 0.01 * (i + 1), 0.1, 2) for i in range(2)], batch(2), 2)
        for r in range(3)
    ]
    summary = summarize(rounds)
    ttfts = [10.0, 20.0] * 3
    assert summary["ttft_ms"] == pytest.approx(np.mean(ttfts))
    assert summary["ttft_ms_p90"] == pytest.approx(np.percentile(ttfts, 90))
    assert summary["e2e_ms"] == pytest.approx(200.0)
    assert summary["e2e_ms_p50"] == pytest.approx(200.0)
    assert summary["output_tokens_per_s"] == pytest.approx(np.mean([40, 20, 40 / 3]))
    samples = [s for rnd in rounds for s in rnd.requests]
    assert len(samples) == 6 and samples[-1].round == 2 and samples[-1].adapter == "a"
    assert samples[0].batch_e2e_ms == pytest.approx(100.0)


def test_missing_stats_or_wrong_length_is_an_error():
    with pytest.raises(MeasurementError, match="disable_log_stats=False"):
        out = output(0, 0, 0, 0, 4)
        out.metrics = None
        measure_round(0, 1.0, [out], batch(1), 4)
    with pytest.raises(MeasurementError, match="generated 3 tokens instead of 4"):
        measure_round(0, 1.0, [output(0, 0, 1, 2, 3)], batch(1), 4)
    with pytest.raises(MeasurementError, match="sent 2 requests, the engine returned 1"):
        measure_round(0, 1.0, [output(0, 0, 1, 2, 4)], batch(2), 4)
    with pytest.raises(MeasurementError, match="no measured round"):
        summarize([])
