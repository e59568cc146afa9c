"""The adapter churn scenario on the stand-in: a load cost put in comes out in the load
latency column, a load stalls the requests sent during it (the stand-in's engine core, like
vLLM's, runs a load between steps), over the in-process engine and over the stand-in HTTP
server's runtime load API; and a config with too few adapters is refused before anything runs."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from lorabench.config import ConfigError, read_config_file, resolve_config
from lorabench.scenarios.churn import LOAD, UNLOAD, Op, churn, churn_fields
from lorabench.targets.http.lora_api import PROBE_NAME
from lorabench.targets.standin import Costs, StandIn, write_config
from lorabench.targets.standin.server import StandInServer
from tests.helpers import ROOT, result_files

LOAD_MS = 40.0
# A load measured by the caller: the stand-in's sleep, plus the loop's wake-up (up to 1 ms),
# plus waiting for the step in progress to end (2 ms steps), plus a shared host's jitter.
LOAD_TOLERANCE_MS = (-1.0, 12.0)
CHURN = {
    "rate": [8],
    "adapters": 2,
    "suites": [{"num_adapters": [2], "rate": [50], "duration": 1.0, "input_range": [8, 16], "output_range": [2, 4]}],
}


def run_churn(pytester, *args: str, plugins=(), **sections) -> pd.Series:
    pytester.makepyfile(test_multilora_churn=(ROOT / "bench" / "test_multilora_churn.py").read_text())
    config = write_config(pytester.path / "run", adapters=4, churn=CHURN, **sections)
    result = pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", *args, plugins=list(plugins))
    result.assert_outcomes(passed=1)
    (csv,) = result_files(pytester.path / "run" / "results")
    (row,) = pd.read_csv(csv).itertuples(index=False)
    return pd.Series(row._asdict())


def check_churn_row(row: pd.Series) -> None:
    """8 operations a second over a 1 s trace: 8, half of them loads, none failed; each load
    costs LOAD_MS; a request sent during one waits for the rest of it (20 ms on average; seen
    13-36 ms more than outside at the median, over some 8 requests), an unload for nothing."""
    assert (row["scenario"], row["churn_rate"], row["churn_adapters"]) == ("churn", 8, 2)
    assert (row["churn_ops"], row["churn_failed_ops"], row["unfinished"]) == (8, 0, 0)
    low, high = LOAD_TOLERANCE_MS
    assert LOAD_MS + low <= row["load_ms_p50"] <= LOAD_MS + high
    assert row["load_ms_p99"] >= row["load_ms_p50"]
    assert row["unload_ms_p50"] < 5
    assert row["ttft_during_load_ms_p50"] - row["ttft_outside_load_ms_p50"] > 5
    assert row["ttft_load_ratio"] == pytest.approx(row["ttft_during_load_ms_p50"] / row["ttft_outside_load_ms_p50"])


def test_a_load_cost_comes_out_in_the_load_column_and_stalls_requests_in_process(pytester):
    row = run_churn(pytester, plugins=[StandIn(Costs(disk_load_ms=LOAD_MS, decode_ms_per_step=2), virtual_clock=True)])
    check_churn_row(row)
    assert row["target"] == "inprocess" and math.isnan(row["failed"])


@pytest.mark.realtime
def test_churn_over_the_runtime_load_api_of_a_server(pytester):
    names = ["a0", "a1", "a2", "a3"]
    with StandInServer(names, Costs(disk_load_ms=LOAD_MS, decode_ms_per_step=2), max_cpu_loras=8) as server:
        row = run_churn(pytester, "--bench-target", server.url, engine={"max_cpu_loras": 8})
        served, calls = set(server.adapters), server.lora_api_calls
    check_churn_row(row)
    assert row["target"] == "url" and row["failed"] == 0
    # adapter_load_ms loads and drops an alias of each adapter first; then the churn's 8 operations.
    churned = [(kind, name.split("@")[0]) for kind, name in calls if name.split("@")[0] in ("a2", "a3")]
    assert churned[-8:] == [("load", "a2"), ("unload", "a2"), ("load", "a3"), ("unload", "a3")] * 2
    named = [name for _, name in calls if name != PROBE_NAME]
    assert all("@lb" in name for name in named), "aliases only: the server's own names are never unloaded"
    assert served == set(names), "every alias is dropped after the replay; the server's names stay"


@pytest.mark.realtime
def test_churn_skips_with_the_fix_on_a_server_without_the_runtime_api(pytester):
    pytester.makepyfile(test_multilora_churn=(ROOT / "bench" / "test_multilora_churn.py").read_text())
    config = write_config(pytester.path / "run", adapters=4, churn=CHURN)
    with StandInServer(["a0", "a1", "a2", "a3"], runtime_api=False) as server:
        result = pytester.runpytest(
            "--bench-config", str(config), "-p", "no:cacheprovider", "-rs", "--bench-target", server.url
        )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*churn loads adapters while serving*VLLM_ALLOW_RUNTIME_LORA_UPDATING=1*"])


def test_failed_operations_are_counted_and_ttfts_split_by_load_spans():
    ops = [Op(LOAD, "a2", 0.0, 0.05), Op(UNLOAD, "a2", 0.1, 0.101), Op(LOAD, "a3", 0.2, 0.21, error="boom")]

    class Req:
        def __init__(self, sent_s, ttft_ms):
            self.sent_s, self.scheduled_s, self.ttft_ms, self.finished = sent_s, sent_s, ttft_ms, True

    records = [Req(0.01, 90.0), Req(0.205, 70.0), Req(0.5, 10.0), Req(0.6, 30.0)]
    fields = churn_fields(ops, records, warmup_s=0.0)
    assert (fields["churn_ops"], fields["churn_failed_ops"]) == (3, 1)
    assert fields["load_ms_p50"] == pytest.approx(50.0), "a failed load's time is not a load's latency"
    assert fields["ttft_during_load_ms_p50"] == pytest.approx(90.0), "a failed load loaded nothing: not in flight"
    assert fields["ttft_outside_load_ms_p50"] == pytest.approx(30.0)
    assert fields["ttft_load_ratio"] == pytest.approx(3.0)


def test_operations_of_the_warm_up_count_nowhere_but_a_load_reaching_past_it_stalls():
    """Warm-up requests are left out of the TTFTs; warm-up operations were in load_ms_*."""
    ops = [Op(LOAD, "a2", 0.0, 0.5), Op(UNLOAD, "a2", 0.6, 0.601)]
    ops += [Op(LOAD, "a3", 1.0, 1.04), Op(UNLOAD, "a3", 1.1, 1.2)]

    class Req:
        def __init__(self, sent_s, ttft_ms):
            self.sent_s, self.scheduled_s, self.ttft_ms, self.finished = sent_s, sent_s, ttft_ms, True

    fields = churn_fields(ops, [Req(0.4, 80.0), Req(0.7, 10.0)], warmup_s=0.3)
    assert (fields["churn_ops"], fields["churn_failed_ops"]) == (3, 0)
    assert fields["load_ms_p50"] == pytest.approx(40.0) and fields["unload_ms_p50"] == pytest.approx(50.5)
    assert fields["ttft_during_load_ms_p50"] == pytest.approx(80.0), "the warm-up's load was still in flight"


def test_the_unload_after_a_failed_load_is_not_sent():
    """A load that failed loaded nothing: the unload after it unloaded nothing, and its time read
    as an unload's. It is not sent; the next load goes on at its time."""
    calls = []

    class Engine:
        async def load_lora(self, adapter):
            calls.append(("load", adapter.name))
            if adapter.name == "bad":
                raise RuntimeError("no adapter found")

        async def unload_lora(self, adapter):
            calls.append(("unload", adapter.name))

    async def go():
        clock = SimpleNamespace(t0=asyncio.get_running_loop().time())
        return await churn(Engine(), [SimpleNamespace(name="bad"), SimpleNamespace(name="good")], 100.0, clock, 0.04)

    ops = asyncio.run(go())
    assert calls == [("load", "bad"), ("load", "good"), ("unload", "good")]
    assert [(o.kind, o.adapter, o.error is None) for o in ops] == [
        ("load", "bad", False),
        ("load", "good", True),
        ("unload", "good", True),
    ]


def test_too_few_adapters_for_the_churn_is_one_line_before_anything_runs(pytester):
    pytester.makepyfile(test_multilora_churn=(ROOT / "bench" / "test_multilora_churn.py").read_text())
    config = write_config(pytester.path / "run", adapters=3, churn=CHURN)
    result = pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", plugins=[StandIn(Costs())])
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*field 'churn.adapters' has bad value 2*needs 4, but only 3 are configured*"])


def test_a_section_the_selection_does_not_run_is_a_warning_that_names_the_selection(pytester):
    """The same too-small churn block does not stop a selection without churn: a copy of the
    default config pointed at fewer adapters was refused for every selection, whatever ran."""
    pytester.makepyfile(test_multilora_churn=(ROOT / "bench" / "test_multilora_churn.py").read_text())
    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
    config = write_config(pytester.path / "run", adapters=3, churn=CHURN)
    args = ("--bench-config", str(config), "-p", "no:cacheprovider", "-k", "multilora and not churn")
    result = pytester.runpytest(*args, plugins=[StandIn(Costs(), virtual_clock=True)])
    assert result.ret == 0 and result.parseoutcomes()["passed"] > 0
    result.stdout.fnmatch_lines(["*warning*field 'churn.adapters'*not run by this selection; -k churn would refuse*"])


def test_a_section_the_selection_runs_is_refused_saying_which_scenario_needs_it(tmp_path):
    """A refusal for a section the selection runs says which scenario of the selection reads it
    and how to leave it out; with no selection known (every section runs) it is the plain line."""
    path = write_config(tmp_path, adapters=3, churn=CHURN)
    with pytest.raises(ConfigError) as selected:
        resolve_config(path, read_config_file(path), needs_lora=True, runs={"churn"})
    (line,) = selected.value.problems
    assert "'churn.adapters'" in line and line.endswith("(this selection runs churn; -k 'not churn' leaves it out)")
    with pytest.raises(ConfigError) as everything:
        resolve_config(path, read_config_file(path), needs_lora=True)
    assert everything.value.problems == [line.split(" (this selection")[0]]


def test_a_warm_up_as_long_as_the_trace_is_refused_before_anything_runs(pytester):
    pytester.makepyfile(test_multilora_churn=(ROOT / "bench" / "test_multilora_churn.py").read_text())
    config = write_config(pytester.path / "run", adapters=4, churn={**CHURN, "warmup_s": 1.0})
    result = pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", plugins=[StandIn(Costs())])
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*churn*warmup_s 1 leaves nothing of a 1 s trace to measure*"])
