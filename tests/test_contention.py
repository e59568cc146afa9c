"""Ground truth for the timeline's state columns: contention planted in the stand-in (requests
waiting for a LoRA slot, a KV cache too small for every request), the true counts out of the
timeline, in process (the stand-in engine, one record a step) and over HTTP (the stand-in
server, one record a scrape), where the columns mean the same."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from types import SimpleNamespace

import aiohttp
import pytest

from lorabench.config import EngineSpec, read_config_file, resolve_config
from lorabench.config.target import URL, Target
from lorabench.targets import timeline
from lorabench.targets.engine import Engine
from lorabench.targets.http import metrics
from lorabench.targets.http.engine import HttpEngine
from lorabench.targets.standin import Costs, StandIn, write_config
from lorabench.targets.standin.llm import LoraRef, Params, StandInLLM
from lorabench.targets.standin.server import StandInServer

# In process on a virtual clock; over HTTP on real sockets, on the wall clock.
TARGETS = ["in_process", pytest.param("http", marks=pytest.mark.realtime)]
# Between two sends: over HTTP, concurrent requests may reach the server in any order.
STAGGER_S = 0.01


def run_planted(tmp_path, target, costs, max_loras, requests):
    """Send ``requests`` on the stand-in (``target``) with ``max_loras``; the timeline's records."""
    path = write_config(tmp_path, adapters=3)
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    spec = EngineSpec(True, max_loras, 8, 4)
    with ExitStack() as stack:
        if target == "http":
            server = stack.enter_context(StandInServer(["a0", "a1", "a2"], costs, max_loras=max_loras))
            engine = HttpEngine(config, spec, "remote", None, Target(URL, server.url))
        else:
            engine = StandIn(costs, virtual_clock=True).engine(config, spec, "cpu", None)
        with engine:
            return send_recording(engine, config.adapters, requests)


def send_recording(engine, adapters, requests):
    """Send ``requests`` ((adapter index, prompt tokens, output tokens) each) in order, STAGGER_S
    apart, recording the timeline until every one finished; its records."""

    async def planted():
        async def one(n, index, prompt_len, output_len):
            await asyncio.sleep(n * STAGGER_S)
            params = engine.sampling_params(output_len, stream=True)
            outputs = [o async for o in engine.stream([7] * prompt_len, params, adapters[index])]
            return sum(len(o.outputs[0].token_ids) for o in outputs)

        engine.timeline.start(asyncio.get_running_loop().time())  # the clock the timeline records on
        try:
            return await asyncio.gather(*(one(n, *request) for n, request in enumerate(requests)))
        finally:
            engine.timeline.stop()

    generated = engine.run(planted())
    assert generated == [output_len for *_, output_len in requests], "every request finished"
    return engine.timeline.rows


@pytest.mark.parametrize("target", TARGETS)
def test_requests_deferred_for_a_lora_slot_count_as_waiting_with_their_adapters(tmp_path, target, monkeypatch):
    """max_loras 1, two requests for each of 3 adapters sent together: a0's run, the other 4
    wait for the slot (vLLM 0.32 counts them apart from the scheduler's waiting), 2 adapters
    wait; then a1's run while a2's 2 wait."""
    monkeypatch.setattr(timeline, "BUCKET_S", 0.001)
    costs = Costs(decode_ms_per_step=25)
    rows = run_planted(
        tmp_path, target, costs, 1, [(0, 8, 16), (0, 8, 16), (1, 8, 16), (1, 8, 16), (2, 8, 16), (2, 8, 16)]
    )
    states = [(r.running, r.waiting, r.adapters_running, r.adapters_waiting) for r in rows]
    assert (2, 4, 1, 2) in states, states
    assert (2, 2, 1, 1) in states, states
    assert max(r.waiting for r in rows) == 4 and max(r.running for r in rows) == 2
    assert any(r.waiting == 4 and r.adapters_waiting >= 2 for r in rows), rows
    # The first adapter's requests count too until their first output reaches the front end.
    assert max(r.adapters_waiting for r in rows) <= 3 and max(r.adapters_running for r in rows) == 1
    assert all(r.adapters_waiting == 2 for r in rows if r.waiting == 4)
    assert all(r.adapters_waiting == 1 for r in rows if (r.running, r.waiting) == (2, 2))


@pytest.mark.parametrize("target", TARGETS)
def test_a_kv_cache_too_small_makes_requests_wait_and_preempts_the_latest(tmp_path, target, monkeypatch):
    """4 blocks of 16 tokens; two requests of 20 prompt tokens (2 blocks each) and 32 output
    tokens fill the cache, a third of 40 (3 blocks) and 8 waits; at 33 tokens the first needs a
    third block and the second (admitted last) is preempted: 2 wait, 3 of 4 blocks in use (16
    steps), one preemption, counted when the preempted request runs again. The third waits
    for its blocks behind the second until the first is done, then until the second is."""
    monkeypatch.setattr(timeline, "BUCKET_S", 0.001)
    costs = Costs(decode_ms_per_step=30, kv_blocks=4)
    rows = run_planted(tmp_path, target, costs, 1, [(0, 20, 32), (0, 20, 32), (0, 40, 8)])
    states = {(r.kv_usage, r.running, r.waiting) for r in rows}
    assert (1.0, 2, 1) in states and (0.75, 1, 2) in states, states
    assert max(r.waiting for r in rows) == 2 and max(r.kv_usage for r in rows) == 1.0
    assert sum(r.preemptions for r in rows) == 1
    assert max(r.adapters_waiting for r in rows) == 1, "the third request's adapter waits for blocks"


@pytest.mark.engine
def test_on_the_cpu_engine_requests_waiting_for_a_slot_and_their_adapters_show(tiny_config):
    """vLLM's own scheduler and front end, max_loras 1, two requests for each of 3 adapters sent
    together: while the first adapter's run, the other 4 wait (deferred for the slot, left out
    of vLLM's num_waiting_reqs) and their 2 adapters with them (the stats' own count of
    adapters waiting stays 0)."""
    path = tiny_config(engine={"max_loras": 1})
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    with Engine(config, EngineSpec(True, 1, 16, 4), "cpu") as engine:
        rows = send_recording(engine, config.adapters, [(i // 2, 16, 24) for i in range(6)])
    assert max(r.waiting for r in rows) == 4 and max(r.running for r in rows) == 2
    assert any(r.waiting == 4 and r.adapters_waiting >= 2 for r in rows), rows
    # The first adapter's requests count too until their first output reaches the front end.
    assert max(r.adapters_waiting for r in rows) <= 3 and max(r.adapters_running for r in rows) == 1


def test_the_stand_in_reports_requests_deferred_for_a_slot_as_vllm_0_32_does():
    """In process, the scheduler's waiting count leaves the deferred out (``num_skipped_waiting_reqs``
    has them) and the front end's adapter counts name only adapters whose requests had an
    output, none of them waiting; over HTTP, ``vllm:num_requests_waiting`` is the sum, and
    ``vllm:lora_requests_info`` names the running adapter in both labels."""
    spec = EngineSpec(enable_lora=True, max_loras=1, max_lora_rank=8, max_cpu_loras=4)
    loras = [LoraRef(f"a{i}", i + 1, f"/adapters/a{i}") for i in (0, 0, 1, 1, 2, 2)]

    async def in_process():
        silent = SimpleNamespace(log_engine_initialized=lambda: None, record=lambda **_: None)
        llm = StandInLLM(Costs(decode_ms_per_step=2), spec, 16, {}, [lambda *_: silent])
        streams = [llm.generate([7] * 8, Params(4, True, False), f"r{n}", lora) for n, lora in enumerate(loras)]
        await asyncio.gather(*(drain(s) for s in streams))
        llm.shutdown()
        return [scheduler for scheduler, _ in llm.stats_sent]

    first, *_ = asyncio.run(in_process())
    assert (first.num_running_reqs, first.num_waiting_reqs, first.num_skipped_waiting_reqs) == (2, 0, 4)
    assert (first.running_lora_adapters, first.waiting_lora_adapters) == ({"a0": 2}, {"a0": 0})
    assert first.kv_cache_usage == 2 / 256, "one block of 16 tokens each"

    with StandInServer(["a0", "a1", "a2"], Costs(decode_ms_per_step=25), max_loras=1) as server:
        text = asyncio.run(scrape_while_sending(server.url, [lora.lora_name for lora in loras]))
    gauges = {(name, labels.get("reason")): value for name, labels, value in metrics.samples(text)}
    assert gauges[("vllm:num_requests_running", None)] == 2 and gauges[("vllm:num_requests_waiting", None)] == 4
    assert gauges[("vllm:num_requests_waiting_by_reason", "deferred")] == 4
    (info,) = [labels for name, labels, _ in metrics.samples(text) if name == "vllm:lora_requests_info"]
    assert info == {"max_lora": "1", "running_lora_adapters": "a0", "waiting_lora_adapters": "a0"}


async def drain(stream):
    return [out async for out in stream]


async def scrape_while_sending(url, models):
    """``/metrics`` 0.15 s after sending a request for each model, STAGGER_S apart; then the
    requests are dropped (the server aborts them, as vLLM does a request whose client went):
    served to the end, one adapter at a time, they took another second for nothing read."""
    async with aiohttp.ClientSession() as session:

        async def send(n, model):
            await asyncio.sleep(n * STAGGER_S)
            body = {"model": model, "prompt": [7] * 8, "max_tokens": 16, "stream": True}
            async with session.post(url + "/v1/completions", json=body) as response:
                await response.read()

        sends = [asyncio.ensure_future(send(n, model)) for n, model in enumerate(models)]
        await asyncio.sleep(0.15)
        async with session.get(url + "/metrics") as response:
            text = await response.text()
        for send in sends:
            send.cancel()
        await asyncio.gather(*sends, return_exceptions=True)
    return text
