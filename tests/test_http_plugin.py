"""The plugin with a server as the target: batch and online cases end to end against the
stand-in OpenAI-compatible server (a URL target), failed requests counted in the rows,
and targets refused before anything starts."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from lorabench.results.schema import ENGINE_ONLY
from lorabench.targets.standin import Costs, write_config
from lorabench.targets.standin.server import BASE, VERSION, StandInServer
from tests.helpers import ROOT, on_the_stand_in, result_files

ONLINE = {
    "suites": [{"num_adapters": [3], "rate": [40], "duration": 0.5, "input_range": [8, 16], "output_range": [2, 4]}]
}
MODULES = ("test_multilora", "test_no_lora", "test_multilora_online")


@pytest.fixture
def bench(pytester):
    for name in MODULES:
        pytester.makepyfile(**{name: (ROOT / "bench" / f"{name}.py").read_text()})

    def run(*args, **config):
        path = write_config(pytester.path / "run", adapters=3, **config)
        result = pytester.runpytest("--bench-config", str(path), "-p", "no:cacheprovider", *args)
        files = result_files(pytester.path / "run" / "results")
        return result, (pd.read_csv(files[0]) if files else None)

    return run


@pytest.mark.realtime
def test_batch_and_online_cases_run_against_a_url_and_leave_engine_only_columns_blank(bench):
    with StandInServer(["a0", "a1", "a2"], Costs(decode_ms_per_step=2)) as server:
        result, rows = bench("--bench-target", server.url, online=ONLINE)
    result.assert_outcomes(passed=3)  # multilora distinct bs2, no_lora bs2 (LoRA engine only), one trace
    assert set(rows["scenario"]) == {"multilora", "no_lora", "online"}
    assert (rows["target"] == "url").all() and (rows["endpoint"] == server.url).all()
    assert (rows["vllm_version"] == VERSION).all() and (rows["memory_source"] == "client").all()
    assert (rows[["vllm_commit", "cpu_model"]] == "unknown").all().all() and rows["device_count"].isna().all()
    assert (rows["failed"] == 0).all() and rows["enable_lora"].all()
    assert rows[sorted(ENGINE_ONLY)].isna().all().all(), "queue, prefill and adapter loads are the engine's to say"
    assert (rows["ttft_ms_p50"] > 0).all() and (rows["decode_ms_p50"] >= 2 - 1).all()
    online = rows[rows["scenario"] == "online"].iloc[0]
    assert online["num_requests"] > 5 and online["unfinished"] == 0
    digests = [b for b in server.received if b["temperature"] == 0.0]
    assert {b["model"] for b in digests} == {"stand-in-base", "a0", "a1", "a2"}, "greedy digests over the API"


@pytest.mark.realtime
def test_failed_requests_are_counted_and_the_replay_goes_on(bench):
    # Request 1 is the build's first token, 2-5 the digests (the base model and three adapters),
    # 6-8 the trace's adapters served once before its timing; the trace starts at 9.
    with StandInServer(["a0", "a1", "a2"], failures={10: "500", 12: "drop"}) as server:
        result, rows = bench("--bench-target", server.url, "-k", "online", online=ONLINE)
    result.assert_outcomes(passed=1)
    (row,) = rows.to_dict("records")
    assert row["failed"] == 2 and row["unfinished"] == 2 and row["slo_attainment"] < 1
    # Why, on the terminal: the server's own error, not only a count in the row.
    result.stdout.fnmatch_lines(["*trace *: 2 of * requests failed, the first: *answered 500*injected failure*"])


@pytest.mark.realtime
def test_a_request_failed_in_the_warm_up_is_counted_nowhere(bench):
    # Request 9 is the trace's first, which arrives within the 0.2 s warm-up: like its
    # latency, its failure is not the row's (before, failed said 1 beside unfinished 0).
    online = {**ONLINE, "warmup_s": 0.2}
    with StandInServer(["a0", "a1", "a2"], failures={9: "500"}) as server:
        result, rows = bench("--bench-target", server.url, "-k", "online", online=online)
    result.assert_outcomes(passed=1)
    (row,) = rows.to_dict("records")
    assert row["failed"] == 0 and row["unfinished"] == 0 and row["num_requests"] > 5


@pytest.mark.realtime
def test_a_server_without_the_configs_adapters_fails_its_cases_with_the_names(bench):
    with StandInServer(["a0", "zz"]) as server:
        result, rows = bench("--bench-target", server.url, "-k", "multilora")
    result.assert_outcomes(errors=1, skipped=1)  # the online module: no suites in this config
    result.stdout.fnmatch_lines(["*does not serve the adapters a1, a2 (its /v1/models lists: a0, zz)*"])
    assert rows is None


@pytest.mark.realtime
def test_k_picks_the_servers_configuration_from_a_config_that_lists_several(bench):
    with StandInServer(["a0", "a1", "a2"]) as server:
        result, rows = bench("--bench-target", server.url, "-k", "multilora and loras2", engine={"max_loras": [1, 2]})
    result.assert_outcomes(passed=1, skipped=1)  # the online module: no suites in this config
    assert list(rows["max_loras"]) == [2] and list(rows["target"]) == ["url"]


@pytest.mark.realtime
def test_a_server_started_with_other_max_loras_fails_its_build_rather_than_mislabel_rows(bench):
    with StandInServer(["a0", "a1", "a2"], max_loras=4, dev_mode=False) as server:
        result, rows = bench("--bench-target", server.url, "-k", "multilora", engine={"max_loras": 2})
    result.stdout.fnmatch_lines(["*runs max_loras 4 (its /metrics vllm:lora_requests_info), not 2*-k NAME*"])
    assert rows is None
    with StandInServer(["a0", "a1", "a2"], max_cpu_loras=8) as server:  # vLLM's dev mode: /server_info says all
        result, rows = bench("--bench-target", server.url, "-k", "multilora", engine={"max_cpu_loras": 4})
    result.stdout.fnmatch_lines(["*runs max_cpu_loras 8 (its /server_info), not 4*"])
    assert rows is None
    # vllm serve caches prefixes unless told not to: the rows would say it did not.
    with StandInServer(["a0", "a1", "a2"], prefix_caching=True) as server:
        result, rows = bench("--bench-target", server.url, "-k", "multilora")
    result.stdout.fnmatch_lines(["*runs enable_prefix_caching True (its /metrics vllm:cache_config_info), not False*"])
    assert rows is None
    with StandInServer(["a0", "a1", "a2"], prefix_caching=True) as server:
        result, rows = bench("--bench-target", server.url, "-k", "multilora", engine={"enable_prefix_caching": True})
    result.assert_outcomes(passed=1, skipped=1)
    assert rows["enable_prefix_caching"].tolist() == [True] and rows["engine_id"].str.endswith("-pc-build0").all()


def test_targets_are_refused_before_anything_starts(bench, pytester):
    result, _ = bench("--bench-target", "http://h:1/v1")
    assert result.ret == 2
    result.stderr.fnmatch_lines(["*--bench-target http://h:1/v1: *has a path*"])
    result, _ = bench("--bench-target", "http://127.0.0.1:9", engine={"max_loras": [1, 2]})
    result.stderr.fnmatch_lines(
        ["*is one server, but the selected cases run 2 engine configurations*(-k loras1-* or -k loras2-*)*"]
    )
    result, _ = bench(target={"url": "ftp://x"})
    assert result.ret == 2
    result.stderr.fnmatch_lines(["*target*ftp://x*http://host:port*"])


def test_an_engine_in_process_on_ray_is_refused_before_it_starts(bench, pytester):
    """On the stand-in: the refusal is the config's, and vLLM's platform (an import of
    seconds) need not be asked."""
    on_the_stand_in(pytester)
    result, _ = bench(engine={"max_loras": 2, "distributed_executor_backend": "ray"})
    assert result.ret == 2
    result.stderr.fnmatch_lines(["*engine.distributed_executor_backend 'ray' is not run in process*"])


@pytest.mark.realtime
def test_the_config_names_the_target_too(bench, pytester):
    with StandInServer(["a0", "a1", "a2"]) as server:
        result, rows = bench("-k", "multilora and not online", target={"url": server.url})
    result.assert_outcomes(passed=1)
    assert list(rows["target"]) == ["url"]
    assert json.loads((pytester.path / "run" / "stand-in.json").read_text())["target"] == {"url": server.url}


@pytest.mark.realtime
def test_a_cases_adapters_are_served_one_token_each_before_its_timing(bench):
    """Nothing over HTTP loads an adapter back into the CPU cache but a request: before a
    case's timing each of its adapters gets one untimed token (adapter_load_ms's aliases may
    have evicted them), so the case's first requests do not pay loads from disk."""
    with StandInServer(["a0", "a1", "a2"]) as server:
        result, rows = bench("--bench-target", server.url, "-k", "multilora and not online")
        received = list(server.received)
    result.assert_outcomes(passed=1)
    timed = [i for i, b in enumerate(received) if b["max_tokens"] > 1 and b["temperature"] != 0.0]
    warm = [i for i, b in enumerate(received) if b["max_tokens"] == 1 and i > 0]  # 0: the build's first token
    case_adapters = {received[i]["model"] for i in timed} - {BASE}  # the base model: lora_overhead's baseline
    assert case_adapters and {received[i]["model"] for i in warm} == case_adapters
    assert max(warm) < min(timed), "served before the timing starts"


@pytest.mark.realtime
def test_the_summary_calls_a_urls_builds_connections_and_reports_no_engine_memory(bench):
    with StandInServer(["a0", "a1", "a2"]) as server:
        result, _ = bench("--bench-target", server.url, "-k", "multilora and not online")
    result.stdout.fnmatch_lines([f"connections to {server.url}: 1 (loras2-rank8-cpu4-build0 *)", "run logs: *"])
    result.stdout.fnmatch_lines(["wall time * s: connections * s (* %), measured * s (* %), *"])
    assert "engine builds" not in result.stdout.str() and "process tree RSS" not in result.stdout.str()
