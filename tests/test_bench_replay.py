"""scripts/bench_replay.py on a short trace: it replays every request on the stand-in, with
the timeline recording, and reports the figures it promises (no timing is checked here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_replay.py"


@pytest.mark.realtime
def test_a_short_replay_reports_send_lag_memory_collections_and_the_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_replay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "replay.json"
    assert module.main(["--requests", "100", "--rate", "300", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["requests"] == figures["finished"] == 100
    assert 0 <= figures["send_lag_ms_p50"] <= figures["send_lag_ms_p99"] <= figures["send_lag_ms_max"]
    assert figures["timeline_records"] > 0
    assert len(figures["gc_collections_by_generation"]) == 3 and figures["gc_pause_ms_max"] >= 0
    assert figures["rss_before_replay_mib"] > 0 and figures["rss_after_replay_mib"] > 0
    assert figures["peak_rss_mib"] >= max(figures["rss_before_replay_mib"], figures["rss_after_replay_mib"])
    assert figures["cpu"] and figures["cores"] >= 1
