"""Residency and a working set through ``vllm serve`` on the CPU build: the disk tier and
``adapter_load_ms`` over the real runtime LoRA API, an alias answering as its adapter, and no
server process left after. They run in the serve session (tests/engine_sessions.py), on the
server the other serve scenarios share."""

from __future__ import annotations

import pandas as pd
import pytest


@pytest.mark.engine
def test_residency_and_a_working_set_through_vllm_serve(serve_session):
    assert serve_session.passed("test_multilora_residency") == 3  # slot, cpu, disk
    assert serve_session.passed("test_multilora_working_set") == 1
    assert not serve_session.failed(but="test_isolation"), serve_session.failed(but="test_isolation")
    rows = serve_session.rows[serve_session.rows["scenario"].isin(["residency", "working_set"])]
    assert (rows["target"] == "serve").all() and (rows["failed"] == 0).all()
    assert rows["adapter_load_ms"].between(0.1, 5000).all() and rows["adapter_load_ms"].nunique() == 1
    tiers = rows[rows["scenario"] == "residency"].set_index("tier")
    assert sorted(tiers.index) == ["cpu", "disk", "slot"]
    assert tiers[["ttft_ms_p50", "decode_ms_p50", "tier_extra_ttft_ms"]].notna().all().all()
    assert 0.1 < tiers.at["disk", "disk_load_ms"] < 5000 and tiers["disk_load_ms"].count() == 1
    assert (tiers["digest_mismatches"] == 0).all(), "an alias loaded from the adapter's path answers as it does"
    (ws,) = rows[rows["scenario"] == "working_set"].to_dict("records")
    assert ws["working_set"] == 3 and ws["ttft_ms_p50"] > 0 and ws["output_tokens_per_s"] > 0
    assert pd.isna(ws["load_share"]) and pd.isna(ws["timed_adapter_loads"])
    assert serve_session.ports_free and all(serve_session.ports_free.values()), serve_session.ports_free
    assert not serve_session.vllm_left and serve_session.children_after <= serve_session.children_before
