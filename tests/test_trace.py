"""The trace generator: its statistics are those its parameters ask for."""

import math

import numpy as np
import pytest

from lorabench.cli import main as cli
from lorabench.load.traces import synthetic as trace
from lorabench.load.traces.synthetic import TraceParams, adapter_shares

ADAPTERS = [f"dummy-lora-rank-8-{i}" for i in range(8)]


def gaps(requests):
    return np.diff([r.arrival_s for r in requests])


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("rate", [5.0, 20.0])
def test_rate_and_burstiness(rate, cv):
    params = TraceParams(num_adapters=8, rate=rate, cv=cv, duration=4000 / rate, seed=1)
    requests = trace.generate(params, ADAPTERS)
    assert len(requests) >= 2000
    assert abs(len(requests) / params.duration - rate) / rate < 0.05
    g = gaps(requests)
    assert abs(g.std() / g.mean() - cv) / cv < 0.10
    assert all(0 <= r.arrival_s < params.duration for r in requests)
    assert (g >= 0).all()


def shares(alpha, seed=2):
    requests = trace.generate(TraceParams(num_adapters=8, rate=20, alpha=alpha, duration=200, seed=seed), ADAPTERS)
    counts = np.array([sum(r.adapter == a for r in requests) for a in ADAPTERS])
    return counts / counts.sum()


@pytest.mark.parametrize("alpha", [0.1, 0.3, 0.6])
def test_adapter_shares_follow_the_power_law(alpha):
    got = shares(alpha)
    assert np.allclose(got, adapter_shares(8, alpha), atol=0.02)
    assert got.argmax() == 0 and got[0] > 2 * got[-1]


def test_smaller_alpha_concentrates_more():
    top = [shares(alpha)[0] for alpha in (0.1, 0.3, 0.6, 1.0)]
    assert top == sorted(top, reverse=True) and top[0] > 0.75 and top[-1] < 0.15


def test_alpha_one_is_uniform_and_shares_sum_to_one():
    assert np.allclose(adapter_shares(8, 1.0), 1 / 8)
    assert adapter_shares(5, 0.3).sum() == pytest.approx(1.0)
    requests = trace.generate(TraceParams(num_adapters=8, rate=20, alpha=1.0, duration=200, seed=3), ADAPTERS)
    counts = np.array([sum(r.adapter == a for r in requests) for a in ADAPTERS])
    assert counts.min() / counts.max() > 0.85


def test_lengths_stay_in_range_and_longtail_is_skewed():
    uniform = trace.generate(TraceParams(4, 20, input_range=(8, 512), output_range=(4, 64), duration=150), ADAPTERS)
    longtail = trace.generate(
        TraceParams(4, 20, input_range=(8, 512), output_range=(4, 64), lengths="longtail", duration=150), ADAPTERS
    )
    for requests in (uniform, longtail):
        assert all(8 <= r.input_len <= 512 and 4 <= r.output_len <= 64 for r in requests)
    u, t = np.array([r.input_len for r in uniform]), np.array([r.input_len for r in longtail])
    assert abs(u.mean() - 260) < 15
    assert np.median(t) < 20 and t.max() > 200, "most requests short, a few long"


def test_same_parameters_and_seed_give_the_same_bytes(tmp_path):
    params = TraceParams(num_adapters=4, rate=10, alpha=0.5, cv=1.5, duration=60, seed=7)
    for name in ("a", "b"):
        trace.write(tmp_path / name, params, ADAPTERS, trace.generate(params, ADAPTERS))
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    other = TraceParams(num_adapters=4, rate=10, alpha=0.5, cv=1.5, duration=60, seed=8)
    trace.write(tmp_path / "c", other, ADAPTERS, trace.generate(other, ADAPTERS))
    assert (tmp_path / "a").read_bytes() != (tmp_path / "c").read_bytes()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (TraceParams(0, 10), "num_adapters must be at least 1"),
        (TraceParams(4, 0), "rate must be above 0"),
        (TraceParams(4, 10, alpha=0), "alpha must be above 0"),
        (TraceParams(4, 10, cv=-1), "cv must be above 0"),
        (TraceParams(4, math.inf), "rate must be above 0 requests/s and finite, got inf"),
        (TraceParams(4, 10, cv=math.inf), "cv must be above 0 and finite, got inf"),
        (TraceParams(4, 10, duration=math.inf), "duration must be above 0 s and finite, got inf"),
        (TraceParams(4, 10, input_range=(64, 8)), "input_range must satisfy 1 <= low <= high, got [64, 8]"),
        (TraceParams(9, 10), "the trace needs 9 adapters, 8 are available"),
    ],
)
def test_bad_parameters(params, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        trace.generate(params, ADAPTERS)


def test_cli_generate_and_stats(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert (
        cli.main(
            [
                "trace",
                "generate",
                "--out",
                str(out),
                "-n",
                "8",
                "-R",
                "20",
                "--popularity-alpha",
                "0.3",
                "--cv",
                "2",
                "--duration",
                "150",
                "--lengths",
                "longtail",
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    assert cli.main(["trace", "stats", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rate: " in text and "(asked 20)" in text and "inter-arrival CV" in text
    assert "top adapter share" in text and "input lengths (longtail" in text
