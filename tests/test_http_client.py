"""The HTTP client and engine against the stand-in OpenAI-compatible server: streaming,
token counting, failures, /metrics, adapter discovery, and the serve target's flags."""

from __future__ import annotations

import asyncio
import socket

import pytest

from lorabench.config import EngineSpec, read_config_file, resolve_config
from lorabench.config.target import URL, Target, parse_target
from lorabench.load.traces.synthetic import TraceRequest
from lorabench.measure import replay
from lorabench.targets.http import metrics
from lorabench.targets.http.client import Client, RequestFailed, chunk_of, parse_event
from lorabench.targets.http.engine import HttpEngine
from lorabench.targets.http.lora_api import served_adapters
from lorabench.targets.http.outputs import UNKNOWN_TOKEN
from lorabench.targets.http.serve import cli_flags, free_port, port_free
from lorabench.targets.standin import Costs, write_config
from lorabench.targets.standin.server import BASE, StandInServer

ADAPTERS = ["a0", "a1", "a2"]


def collect(url, model, max_tokens=4, temperature=1.0):
    async def go():
        client = Client(url)
        try:
            return [c async for c in client.complete(model, [5, 6, 7], max_tokens, temperature)]
        finally:
            await client.close()

    return asyncio.run(go())


def test_sse_lines_and_chunks_parse_as_vllm_sends_them():
    assert parse_event(b": keep-alive\n") is None and parse_event(b"data: [DONE]\n") is None
    event = parse_event(b'data: {"choices": [{"text": "x", "token_ids": [4, 5], "finish_reason": null}]}\n')
    assert chunk_of(event).token_ids == [4, 5] and chunk_of(event).count == 2
    no_ids = chunk_of({"choices": [{"text": "ab", "finish_reason": "length"}]})
    assert (no_ids.count, no_ids.finished, no_ids.token_ids) == (1, True, [])
    usage = chunk_of({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}})
    assert (usage.count, usage.completion_tokens, usage.prompt_tokens) == (0, 9, 3)
    with pytest.raises(RequestFailed, match="mid-stream"):
        chunk_of({"error": {"message": "boom"}})


@pytest.mark.realtime
def test_a_stream_gives_every_token_once_and_finishes():
    with StandInServer(ADAPTERS) as server:
        chunks = collect(server.url, "a1", max_tokens=5)
        greedy = [collect(server.url, "a1", 5, 0.0), collect(server.url, "a2", 5, 0.0)]
    tokens = [t for c in chunks for t in c.token_ids]
    assert len(tokens) == 5 and sum(c.count for c in chunks) == 5
    assert [c.finished for c in chunks] == [False] * 4 + [True, False], "the usage event comes after the finish"
    assert chunks[-1].completion_tokens == 5 and chunks[0].prompt_tokens == 3
    assert [t for c in greedy[0] for t in c.token_ids] != [t for c in greedy[1] for t in c.token_ids]
    body = server.received[0]
    assert body["prompt"] == [5, 6, 7] and body["ignore_eos"] and body["stream"] and body["return_token_ids"]
    # Nothing left for a server to fill from the model's generation config (test_http_serve reads
    # the body with vLLM's own request model).
    assert (body["top_p"], body["top_k"], body["min_p"], body["repetition_penalty"]) == (1.0, 0, 0.0, 1.0)


def test_a_long_stream_is_bounded_by_the_replays_drain_not_by_a_total_timeout():
    """aiohttp's total bound covers a whole stream: a request queued 600 s under overload
    failed, and a capacity search read the saturated server as a broken one."""
    timeout = Client("http://127.0.0.1:1").timeout
    assert timeout.total is None and timeout.sock_read == 600.0 and timeout.sock_connect == 60.0


@pytest.mark.realtime
def test_an_unknown_adapter_an_error_status_and_a_broken_stream_raise():
    with StandInServer(ADAPTERS, failures={2: "500", 3: "drop"}) as server:
        with pytest.raises(RequestFailed, match="404.*does not exist"):
            collect(server.url, "nope")
        with pytest.raises(RequestFailed, match="500"):
            collect(server.url, "a0")
        with pytest.raises(RequestFailed, match="ClientPayloadError|ended before"):
            collect(server.url, "a0")
        assert len(collect(server.url, "a0")) == 5, "the server goes on serving"


@pytest.mark.realtime
def test_metrics_are_read_from_prometheus_text():
    text = "\n".join(
        [
            "# HELP vllm:kv_cache_usage_perc KV-cache usage.",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5',
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 2.0',
            'vllm:num_requests_waiting{engine="0",model_name="m"} 7.0',
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.5e9',
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="c",waiting_lora_adapters="d,e"} 1.7e9',
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0',
            "vllm:other_total 12 1700000000",
        ]
    )
    state = metrics.server_state(text)
    assert (state.kv_usage, state.running, state.waiting, state.max_lora) == (0.5, 5, 7, 2)
    assert (state.adapters_running, state.adapters_waiting) == (["c"], ["d", "e"]), "the latest sample"
    assert state.kv_cache_tokens == 1600
    assert metrics.server_state("") == metrics.ServerState()
    with StandInServer(ADAPTERS) as server:
        served = metrics.server_state(asyncio.run(_get(server.url, "/metrics")))
    assert (served.running, served.waiting, served.kv_usage, served.max_lora) == (0, 0, 0.0, 2)


async def _get(url, path):
    client = Client(url)
    try:
        return (await client.get(path))[1]
    finally:
        await client.close()


@pytest.mark.realtime
def test_a_server_that_does_not_say_its_kv_cache_leaves_it_blank_not_0(tmp_path, monkeypatch):
    """``vllm serve --disable-log-stats`` has no vllm:cache_config_info: the rows said 0 KV
    cache tokens, and the recommendation "0 KV cache tokens"."""
    import dataclasses

    from lorabench.targets.http import telemetry

    said = telemetry.server_state
    monkeypatch.setattr(telemetry, "server_state", lambda text: dataclasses.replace(said(text), kv_cache_tokens=None))
    path = write_config(tmp_path, adapters=3)
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    with StandInServer(ADAPTERS) as server:
        with HttpEngine(config, EngineSpec(True, 2, 8, 4), "remote", None, Target(URL, server.url)) as engine:
            assert engine.kv_cache_tokens is None


def test_adapters_are_discovered_from_v1_models(tmp_path):
    models = [{"id": "base", "parent": None}, {"id": "a0", "parent": "base"}, {"id": "x", "parent": "base"}]
    assert served_adapters(models) == ("base", {"a0", "x"})
    assert served_adapters([]) == (None, set())


@pytest.mark.realtime
@pytest.mark.realtime
def test_the_http_engine_counts_failures_and_times_on_its_own_clock(tmp_path):
    path = write_config(tmp_path, adapters=3)
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    # Request 1 is the build's first token; 2 is served, 3 dropped.
    with StandInServer(ADAPTERS, Costs(decode_ms_per_step=20), failures={3: "drop"}) as server:
        engine = HttpEngine(config, EngineSpec(True, 2, 8, 4), "remote", None, Target(URL, server.url))
        with engine:
            assert engine.base_model == BASE and engine.server_version == "0.0.0-stand-in"
            assert engine.kv_cache_tokens == 4096 and engine.vocab_size == 1000
            (out,) = engine.generate([[1, 2, 3]], [config.adapters[0]], 4)
            assert len(out.outputs[0].token_ids) == 4 and UNKNOWN_TOKEN not in out.outputs[0].token_ids
            t = out.timing
            assert t.sent_ts < t.first_token_ts < t.last_token_ts and out.metrics is None
            # Three steps of 20 ms: stamped as they came. (A bound of all three flaked beside a
            # busy worker, whose client read two chunks at once: one step is the property.)
            assert (t.last_token_ts - t.first_token_ts) * 1000 >= 20 - 1, "stamped as they came, not at the end"
            with pytest.raises(RequestFailed, match="1 of 1 requests of the batch failed"):
                engine.generate([[1, 2, 3]], [config.adapters[1]], 4)
            assert engine.failed_requests == 1
        assert engine.loop is None and engine.client is None


def test_engine_arguments_become_vllm_serve_flags():
    flags = cli_flags(
        {"max_model_len": 128, "enable_lora": True, "enable_prefix_caching": False, "seed": 0, "tokenizer": None}
        | {"disable_log_stats": False}
        | {"compilation_config": {"mode": 0}, "api_key_list": ["a", "b"]}
    )
    assert flags == [
        "--max-model-len",
        "128",
        "--enable-lora",
        "--no-enable-prefix-caching",
        "--seed",
        "0",
        "--compilation-config",
        '{"mode": 0}',
        "--api-key-list",
        "a",
        "b",
    ]


def test_targets_parse_with_a_fix_for_bad_values():
    assert parse_target("serve") == Target("serve")
    assert parse_target("http://h:8000/") == Target(URL, "http://h:8000")
    for bad, fix in (("srv", "inprocess, serve"), ("http://h:8000/v1", "server's root"), ("ftp://h", "http://")):
        with pytest.raises(ValueError, match=fix):
            parse_target(bad)
    # A port out of range, not a number or 0, and no host: refused, not built and failed as unreachable.
    for bad in ("http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://h:0", "http://:8000"):
        with pytest.raises(ValueError, match="valid port|not a server's URL"):
            parse_target(bad)


def test_a_port_is_free_once_nothing_listens_there_whatever_its_closed_connections():
    port = free_port()
    assert port_free(port)
    with socket.create_server(("127.0.0.1", port)) as server:
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server closes first, as after an answer with Connection: close
        client.close()
        assert not port_free(port), "a server listens there"
    assert port_free(port), "only its closed connections (TIME_WAIT) are left: a new server can bind"


@pytest.mark.realtime
def test_waiting_for_an_idle_server_reads_its_request_gauges(tmp_path):
    """A server counts requests until its engine drops them: the wait for idle is on /metrics.
    Two long requests still running keep it busy until the wait runs out; cancelled, they go."""
    path = write_config(tmp_path, adapters=3)
    config = resolve_config(path, read_config_file(path), needs_lora=True)

    async def scenario(engine: HttpEngine) -> tuple:
        async def consume(adapter):
            async for _ in engine.stream([1, 2, 3], engine.sampling_params(400), adapter):
                pass

        tasks = [asyncio.ensure_future(consume(a)) for a in config.adapters[:2]]
        await asyncio.sleep(0.2)
        busy = await engine.wait_idle(0.3)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return busy, await engine.wait_idle(10)

    with StandInServer(ADAPTERS, Costs(decode_ms_per_step=5)) as server:
        with HttpEngine(config, EngineSpec(True, 2, 8, 4), "remote", None, Target(URL, server.url)) as engine:
            (waited, left), (then_waited, then_left) = engine.run(scenario(engine))
    assert left == 2 and waited >= 0.3, "running requests: the wait runs out and says how many"
    assert then_left == 0 and 0 <= then_waited < 10, "cancelled: the server drops them and the wait ends"


def collect_prompt(url, model, prompt, max_tokens=2):
    async def go():
        client = Client(url)
        try:
            return [c async for c in client.complete(model, prompt, max_tokens, 1.0)]
        finally:
            await client.close()

    return asyncio.run(go())


@pytest.mark.realtime
def test_a_prompt_whose_ids_fill_a_line_past_aiohttps_limit_is_read_and_counted():
    """vLLM puts the whole prompt's ids in the first chunk: a 150k-token prompt's line is about
    750 KiB, past aiohttp's 512 KiB line limit, whose LineTooLong aborted the whole replay."""
    prompt = [100 + i % 900 for i in range(150_000)]
    with StandInServer(ADAPTERS, Costs(prefill_ms_per_token=0.0, kv_blocks=10_000)) as server:
        chunks = collect_prompt(server.url, "a1", prompt)
    assert chunks[0].prompt_tokens == 150_000 and sum(c.count for c in chunks) == 2
    assert any(c.finished for c in chunks)


def test_prompt_ids_are_counted_in_the_raw_line_and_not_parsed():
    ids = ",".join(str(i) for i in range(5000))
    line = f'data: {{"choices": [{{"token_ids": [1], "prompt_token_ids": [{ids}], "finish_reason": null}}]}}'
    event = parse_event(line.encode())
    assert "prompt_token_ids" not in event["choices"][0] and chunk_of(event).prompt_tokens == 5000
    empty = parse_event(b'data: {"choices": [{"token_ids": [1], "prompt_token_ids": [], "finish_reason": null}]}')
    assert chunk_of(empty).prompt_tokens == 0 and chunk_of(empty).token_ids == [1]


@pytest.mark.realtime
def test_a_chunk_is_stamped_when_it_arrives_not_after_it_is_parsed(monkeypatch):
    """Parsing the first chunk (the prompt's ids) took milliseconds that were in TTFT: each
    chunk is stamped before its parse, so a slow parse leaves the stamps where the bytes came."""
    import time

    from lorabench.targets.http import client as client_module

    parsed_at = []
    real_parse = client_module.parse_event

    def slow_parse(line):
        time.sleep(0.05)
        event = real_parse(line)
        parsed_at.append(time.monotonic())
        return event

    monkeypatch.setattr(client_module, "parse_event", slow_parse)
    with StandInServer(ADAPTERS) as server:
        chunks = collect_prompt(server.url, "a0", [5, 6, 7], max_tokens=3)
    first = next(c for c in chunks if c.count)
    assert first.arrived and first.arrived <= parsed_at[0] - 0.05


@pytest.mark.realtime
def test_a_replay_over_http_with_a_150k_token_prompt_finishes_and_measures_it(tmp_path):
    """End to end: the server answers a 150k-token prompt's ids in its first chunk (the stand-in's
    ids are under 1000, about 4 bytes each: a line past aiohttp's 512 KiB limit); the replay goes
    on to the next request and both are measured, where LineTooLong aborted the whole replay."""
    path = write_config(tmp_path, adapters=2)
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    adapters = {a.name: a for a in config.adapters}
    trace = [TraceRequest(0.0, "a0", 150_000, 2), TraceRequest(0.05, "a1", 8, 2)]
    with StandInServer(ADAPTERS, Costs(prefill_ms_per_token=0.0, kv_blocks=10_000)) as server:
        with HttpEngine(config, EngineSpec(True, 2, 8, 4), "remote", None, Target(URL, server.url)) as engine:
            records = engine.run(replay.replay(engine, trace, adapters))
            assert engine.failed_requests == 0
    assert [r.finished and not r.failed for r in records] == [True, True]
    assert all(len(r.token_times) == 2 and r.ttft_ms > 0 for r in records)


@pytest.mark.parametrize("together", [False, True])
def test_the_usage_count_corrects_the_tokens_whether_or_not_it_comes_with_the_finish(together):
    """vLLM sends the usage in an event of its own; an OpenAI-compatible server may put it on
    the finishing event: the count was ignored there, and a batch case failed "generated 3
    tokens instead of 6" (chunks without token ids count one token each)."""
    from lorabench.targets.http.client import Chunk
    from lorabench.targets.http.outputs import HttpParams

    finish = chunk_of({"choices": [{"text": "c", "finish_reason": "length"}]})
    usage = chunk_of({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}})
    first = [chunk_of({"choices": [{"text": t, "finish_reason": None}]}) for t in "ab"]
    one_event = Chunk(token_ids=[], count=1, finished=True, prompt_tokens=3, completion_tokens=6)
    events = [*first, one_event] if together else [*first, finish, usage]

    class Replayed:
        async def complete(self, *args):
            for event in events:
                yield event

    engine = HttpEngine.__new__(HttpEngine)
    engine.client, engine.failed_requests, engine.failures = Replayed(), 0, []

    async def tokens():
        return [out.outputs[0].token_ids async for out in engine._stream("a0", [1, 2, 3], HttpParams(6, False), None)]

    assert sum(len(ids) for ids in asyncio.run(tokens())) == 6
