"""Residency and a working set through ``vllm serve`` on the CPU build: the disk tier and
``adapter_load_ms`` over the real runtime LoRA API, an alias answering as its adapter, and no
server process left after."""

from __future__ import annotations

import pandas as pd
import psutil
import pytest

from lorabench.targets.http.serve import port_free
from tests.helpers import ROOT, result_files


@pytest.mark.engine
def test_residency_and_a_working_set_through_vllm_serve(pytester, tiny_config):
    for name in ("test_multilora_residency", "test_multilora_working_set"):
        pytester.makepyfile(**{name: (ROOT / "bench" / f"{name}.py").read_text()})
    config = tiny_config(
        engine={"max_loras": 2, "max_cpu_loras": 4, "max_model_len": 128},
        residency={"requests": 2},
        working_set={"sizes": [3], "cycles": 1, "min_requests": 2, "output_len": 4},
    )
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = pytester.runpytest_subprocess(
        "--bench-config", str(config), "--bench-target", "serve", "-p", "no:cacheprovider", timeout=600
    )
    result.assert_outcomes(passed=4)  # slot, cpu, disk; one working set
    (csv,) = result_files(config.parent / "results")
    rows = pd.read_csv(csv)
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
    port = int(rows["endpoint"].iloc[0].rsplit(":", 1)[1])
    assert port_free(port)
    left = [p for p in psutil.process_iter(["cmdline"]) if f"--port {port}" in " ".join(p.info["cmdline"] or [])]
    assert not left and {p.pid for p in psutil.Process().children(recursive=True)} <= before
