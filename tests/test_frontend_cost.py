"""scripts/frontend_cost.py's matching and statistics on hand-made result files, and its
main on stand-in sessions (no engine)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "frontend_cost.py"
T_975_1DF = 12.706204736174698  # Student's t, 97.5th percentile, 1 degree of freedom


@pytest.fixture(scope="module")
def fc():
    spec = importlib.util.spec_from_file_location("frontend_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(path: Path, target: str, cases: dict[int, tuple[float, float]], e2e: str = "request_e2e_ms_p50") -> Path:
    """A result file: one row per max_loras -> (ttft p50, e2e), with provenance that differs
    between files (timestamp, hostname, device name, endpoint)."""
    rows = [
        {
            "timestamp": f"2026-11-25T00:0{len(target)}:00Z",
            "hostname": f"host-{target}",
            "device_type": "cpu",
            "device_name": f"CPU {target}",
            "endpoint": "http://127.0.0.1:8000" if target == "serve" else None,
            "model": "builtin:tiny-llama",
            "scenario": "multilora",
            "target": target,
            "workload": "distinct",
            "batch_size": 4,
            "enable_lora": True,
            "max_loras": loras,
            "max_lora_rank": 16,
            "ttft_ms_p50": ttft,
            e2e: e2e_ms,
        }
        for loras, (ttft, e2e_ms) in cases.items()
    ]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_cases_match_across_targets_without_target_and_provenance(fc, tmp_path):
    a = write(tmp_path / "a.csv", "inprocess", {2: (100.0, 400.0), 8: (200.0, 800.0), 16: (1.0, 1.0)})
    # Batch e2e_ms in the serve file: the e2e metric falls back to it.
    b = write(tmp_path / "b.csv", "serve", {2: (110.0, 420.0), 8: (230.0, 880.0)}, e2e="e2e_ms")
    pair = fc.pair_observations(a, b)
    assert len(pair) == 2  # max_loras 16 only in process: left out
    two = next(v for k, v in pair.items() if "max_loras=2 " in k)
    assert two == {"ttft_ms_p50": (100.0, 110.0), "e2e_ms_p50": (400.0, 420.0)}
    assert all("target" not in k and "hostname" not in k and "model" not in k for k in pair)


def test_a_file_of_the_wrong_target_or_no_shared_case_is_refused(fc, tmp_path):
    a = write(tmp_path / "a.csv", "inprocess", {2: (100.0, 400.0)})
    with pytest.raises(fc.MatchError, match="expected serve"):
        fc.pair_observations(a, a)
    b = write(tmp_path / "b.csv", "serve", {8: (100.0, 400.0)})
    with pytest.raises(fc.MatchError, match="share no case"):
        fc.pair_observations(a, b)


def test_ratio_and_difference_over_pairs(fc, tmp_path):
    pairs = [
        fc.pair_observations(
            write(tmp_path / "a0.csv", "inprocess", {2: (100.0, 400.0), 8: (200.0, 800.0)}),
            write(tmp_path / "b0.csv", "serve", {2: (110.0, 420.0), 8: (230.0, 880.0)}),
        ),
        fc.pair_observations(
            write(tmp_path / "a1.csv", "inprocess", {2: (100.0, 500.0), 8: (100.0, 600.0)}),
            write(tmp_path / "b1.csv", "serve", {2: (130.0, 530.0), 8: (110.0, 630.0)}),
        ),
    ]
    summary = fc.summarize(pairs)
    two = next(v for k, v in summary["cases"].items() if "max_loras=2 " in k)["ttft_ms_p50"]
    logs = [math.log(1.1), math.log(1.3)]
    # sd |a - b| / sqrt 2 over sqrt 2 pairs: half-width t |a - b| / 2.
    mean, half = sum(logs) / 2, T_975_1DF * abs(logs[0] - logs[1]) / 2
    assert two["ratio"]["ratio"] == pytest.approx(math.exp(mean))
    assert two["ratio"]["low"] == pytest.approx(math.exp(mean - half))
    assert two["ratio"]["high"] == pytest.approx(math.exp(mean + half))
    # Differences 10 and 30 ms: mean 20, sd 14.14, half-width t * 10.
    assert two["difference_ms"]["mean"] == pytest.approx(20.0)
    assert two["difference_ms"]["low"] == pytest.approx(20.0 - T_975_1DF * 10.0)
    # Overall ttft: per pair the cases' mean log ratio, then over pairs.
    per_pair = [(math.log(1.1) + math.log(1.15)) / 2, (math.log(1.3) + math.log(1.1)) / 2]
    overall = summary["overall"]["ttft_ms_p50"]
    assert overall["cases"] == 2
    assert overall["ratio"]["ratio"] == pytest.approx(math.exp(sum(per_pair) / 2))
    assert overall["difference_ms"]["mean"] == pytest.approx((10.0 + 30.0 + 30.0 + 10.0) / 4)
    assert summary["overall"]["e2e_ms_p50"]["difference_ms"]["mean"] == pytest.approx((20 + 80 + 30 + 30) / 4)


def test_one_pair_has_no_interval(fc, tmp_path):
    pair = fc.pair_observations(
        write(tmp_path / "a.csv", "inprocess", {2: (100.0, 400.0)}),
        write(tmp_path / "b.csv", "serve", {2: (110.0, 420.0)}),
    )
    overall = fc.summarize([pair])["overall"]["ttft_ms_p50"]
    assert overall["ratio"]["low"] is None and overall["difference_ms"]["low"] is None
    assert overall["ratio"]["ratio"] == pytest.approx(1.1)


def test_main_alternates_targets_per_pair(fc, tmp_path, monkeypatch, capsys):
    order = []

    def session(args, target, out):
        order.append(target)
        ttft = 100.0 if target == "inprocess" else 120.0
        write(out, target, {2: (ttft, 4 * ttft)})
        return 1.0

    monkeypatch.setattr(fc, "session", session)
    out = tmp_path / "cost.json"
    args = argparse.Namespace(pairs=3, select="multilora", config=None, out=out)
    assert fc.main(args) == 0
    assert order == ["inprocess", "serve", "serve", "inprocess", "inprocess", "serve"]
    record = json.loads(out.read_text())
    assert [s["target"] for s in record["sessions"]] == order
    assert record["summary"]["overall"]["ttft_ms_p50"]["ratio"]["ratio"] == pytest.approx(1.2)
    assert record["summary"]["overall"]["e2e_ms_p50"]["difference_ms"]["mean"] == pytest.approx(80.0)
    assert "overall (1 cases) ttft_ms_p50: serve/inprocess 1.200" in capsys.readouterr().out
