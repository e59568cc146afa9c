"""The online scenario on the stand-in engine: latencies from the scheduled arrival, a client
that falls behind its schedule flagged, and a drain long enough for long outputs."""

from __future__ import annotations

import pandas as pd

from lorabench.targets.standin import Costs, StandIn, write_config
from tests.helpers import ROOT, result_files

# 40 requests/s for 1 s, 40 output tokens each (0.16 s of decode steps): a drain of 0.05 s
# after the last arrival cut the last ones short, though the engine kept up.
ONLINE = {
    "slo_ttft_ms": 100,
    "slo_tpot_ms": 10,
    "drain_timeout_s": 0.05,
    "suites": [{"name": "s", "num_adapters": [2], "rate": [40], "duration": 1, "cv": [0.1], "output_range": [40, 40]}],
}


def run_online(pytester, costs: Costs):
    pytester.makepyfile(test_multilora_online=(ROOT / "bench" / "test_multilora_online.py").read_text())
    config = write_config(pytester.path / "run", adapters=2, online=ONLINE, engine={"max_num_seqs": 16})
    result = pytester.runpytest(
        "--bench-config", str(config), "-p", "no:cacheprovider", plugins=[StandIn(costs, virtual_clock=True)]
    )
    result.assert_outcomes(passed=1)
    (csv,) = result_files(pytester.path / "run" / "results")
    (row,) = pd.read_csv(csv).to_dict("records")
    return result, row, pd.read_csv(csv.with_name(csv.stem + ".samples.csv"))


def test_a_client_that_falls_behind_is_flagged_and_its_lag_counts_in_the_latencies(pytester):
    """The sender blocks 40 ms on each send, at 40 requests/s: it falls further behind at
    every send. TTFT from the scheduled arrival carries that lag, the TTFT from the send does not."""
    result, row, samples = run_online(pytester, Costs(decode_ms_per_step=4.0, send_block_ms=40))
    assert row["client_fell_behind"] and row["send_lag_ms_max"] > 200
    assert row["ttft_ms_p99"] > row["ttft_from_send_ms_p99"] + 100
    result.stdout.fnmatch_lines(["*trace s-*: client fell behind: * requests sent over 25 ms late*"])
    lag = samples["ttft_ms"] - samples["ttft_from_send_ms"]
    assert ((lag - samples["send_lag_ms"]).abs() < 0.01).all(), "from the arrival = from the send + the lag"


def test_long_outputs_are_given_their_slo_budget_to_finish(pytester):
    _, row, samples = run_online(pytester, Costs(decode_ms_per_step=4.0))
    assert row["unfinished"] == 0 and not row["client_fell_behind"]
    assert (samples["finished"].astype(str) == "True").all()
