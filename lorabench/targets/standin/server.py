"""A stand-in OpenAI-compatible server: the stand-in engine (``StandInLLM``, costs the test
sets) behind the endpoints of ``vllm serve`` that lorabench uses, on a free port of
127.0.0.1, in a thread of the test's process.

It serves ``/v1/models`` (the base model and each adapter, with its ``parent``),
streaming ``/v1/completions`` (vLLM's chunks: ``token_ids`` when asked with
``return_token_ids``, ``prompt_token_ids`` in the first, ``usage`` last, then ``[DONE]``),
``/health``, ``/version``, ``/metrics`` (the gauges ``lorabench.targets.http.metrics`` reads) and the
runtime ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` as vLLM 0.32 does: a load
gives the name a new id (never one used before) and costs the stand-in's ``add_lora``
(``disk_load_ms``, then ``slot_load_ms`` into a slot); an unload only drops the name, its
id staying in the CPU cache until evicted. ``runtime_api=False`` leaves those two routes
out, as a server started without ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``. An adapter's
output follows from its path (its weights): an alias loaded from an adapter's path
answers as the adapter does.
An unknown model is a 404, as vLLM answers; ``failures`` maps a request's number (from 1,
in the order they arrive) to ``"500"`` (an error status) or ``"drop"`` (the connection
closed after the first token).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from aiohttp import web

from lorabench.config import EngineSpec
from lorabench.targets.standin.costs import Costs
from lorabench.targets.standin.llm import LoraRef, Params, StandInLLM

BASE = "stand-in-base"
VERSION = "0.0.0-stand-in"


class StandInServer:
    """``with StandInServer(["a0", "a1"]) as server:`` ... requests to ``server.url``."""

    def __init__(
        self,
        adapters: Sequence[str],
        costs: Costs | None = None,
        *,
        max_loras: int = 2,
        max_cpu_loras: int = 4,
        max_num_seqs: int = 16,
        failures: Mapping[int, str] | None = None,
        port: int = 0,
        runtime_api: bool = True,
        dev_mode: bool = True,
        prefix_caching: bool = False,
        prompt_tokens_details: bool = True,
    ) -> None:
        self._lora_ids = itertools.count(1)
        self.adapters = {name: next(self._lora_ids) for name in adapters}
        # Each served name's path, as /v1/models lists it (root), and the name first served from a path.
        self.paths = {name: f"/adapters/{name}" for name in adapters}
        self.weights = {path: name for name, path in self.paths.items()}
        self.runtime_api = runtime_api
        self.dev_mode = dev_mode  # vLLM's VLLM_SERVER_DEV_MODE: /server_info says the LoRA settings
        self.costs = costs or Costs()
        self.spec = EngineSpec(True, max_loras, 8, max_cpu_loras, enable_prefix_caching=prefix_caching)
        self.max_num_seqs = max_num_seqs
        self.failures = dict(failures or {})
        self.received: list[dict[str, Any]] = []  # every completion request's body, in order
        self.lora_api_calls: list[tuple[str, str]] = []  # ("load" or "unload", lora_name), in order
        self.port = port  # 0: a free one
        self.url = ""
        self.llm: StandInLLM | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._ids = itertools.count()
        # vLLM's counters, from the stand-in's steps: steps, preemptions, prompt and generated tokens.
        self.totals: Counter[str] = Counter()
        self.prompt_tokens_details = prompt_tokens_details
        # The last step's SchedulerStats: vLLM's Prometheus logger sets its gauges from each step's.
        self.last = SimpleNamespace(
            kv_cache_usage=0.0, num_running_reqs=0, num_waiting_reqs=0, num_skipped_waiting_reqs=0,
            running_lora_adapters={}, waiting_lora_adapters={},
        )  # fmt: skip

    def __enter__(self) -> StandInServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _start(self) -> None:
        weights = dict.fromkeys(self.adapters, "")
        self.llm = StandInLLM(self.costs, self.spec, self.max_num_seqs, weights, [lambda *_: _Counters(self)])
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", _health)
        app.router.add_get("/version", _version)
        app.router.add_get("/metrics", self._metrics)
        if self.runtime_api:
            app.router.add_post("/v1/load_lora_adapter", self._load)
            app.router.add_post("/v1/unload_lora_adapter", self._unload)
        if self.dev_mode:
            app.router.add_get("/server_info", self._server_info)
        # A handler is cancelled when its client goes, so its request is aborted at once, as vLLM does.
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def _stop(self) -> None:
        self.llm.shutdown()
        await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": BASE, "object": "model", "root": BASE, "parent": None}]
        data += [{"id": name, "object": "model", "root": self.paths[name], "parent": BASE} for name in self.adapters]
        return web.json_response({"object": "list", "data": data})

    async def _metrics(self, request: web.Request) -> web.Response:
        """The gauges as vLLM 0.32's Prometheus logger sets them from the last step's stats:
        waiting requests with the deferred ones added, and ``lora_requests_info`` with the
        front end's adapter entries' names in both labels (labels sorted, as prometheus_client
        writes them)."""
        last, kv = self.last, self.llm.kv
        waiting = last.num_waiting_reqs + last.num_skipped_waiting_reqs
        labels = f'engine="0",model_name="{BASE}"'
        lines = [
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} {last.kv_cache_usage}",
            f"vllm:num_requests_running{{{labels}}} {last.num_running_reqs}",
            f"vllm:num_requests_waiting{{{labels}}} {waiting}",
            f'vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} {last.num_waiting_reqs}',
            f'vllm:num_requests_waiting_by_reason{{{labels},reason="deferred"}} {last.num_skipped_waiting_reqs}',
            f'vllm:lora_requests_info{{max_lora="{self.llm.max_loras}",'
            f'running_lora_adapters="{",".join(last.running_lora_adapters)}",'
            f'waiting_lora_adapters="{",".join(last.waiting_lora_adapters)}"}} 1.7e+09',
            f'vllm:cache_config_info{{block_size="{kv.block_size}",enable_prefix_caching='
            f'"{self.spec.enable_prefix_caching}",engine="0",num_gpu_blocks="{kv.total}"}} 1.0',
            f"vllm:iteration_tokens_total_count{{{labels}}} {self.totals['steps']}",
            f"vllm:num_preemptions_total{{{labels}}} {self.totals['preemptions']}",
            f"vllm:prompt_tokens_total{{{labels}}} {self.totals['prompt_tokens']}",
            f"vllm:generation_tokens_total{{{labels}}} {self.totals['generation_tokens']}",
            f"vllm:prefix_cache_queries_total{{{labels}}} {self.totals['prefix_queries']}",
            f"vllm:prefix_cache_hits_total{{{labels}}} {self.totals['prefix_hits']}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _load(self, request: web.Request) -> web.Response:
        """vLLM's runtime load: 400 for an adapter it serves already; a new id, loaded with the
        stand-in's ``add_lora`` (read and activated) before the answer, then registered."""
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        self.lora_api_calls.append(("load", name))
        if not name or not path:
            return _error("both 'lora_name' and 'lora_path' must be provided.", 400)
        in_place = bool(body.get("load_inplace"))
        if name in self.adapters and not in_place:
            return _error(f"The lora adapter '{name}' has already been loaded.", 400)
        # In place: the name keeps its id, and the weights are read again (vLLM 0.32).
        lora_id = self.adapters[name] if name in self.adapters else next(self._lora_ids)
        await self.llm.add_lora(self._lora(name, lora_id, path), load_inplace=in_place)
        self.adapters[name], self.paths[name] = lora_id, path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload(self, request: web.Request) -> web.Response:
        """vLLM's runtime unload: 404 for an adapter it does not serve; the name only (vLLM 0.32
        calls no ``remove_lora``: the id stays in the CPU cache until the LRU evicts it)."""
        name = (await request.json()).get("lora_name")
        self.lora_api_calls.append(("unload", name))
        if name not in self.adapters:
            return _error(f"The lora adapter '{name}' cannot be found.", 404)
        del self.adapters[name], self.paths[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    def _lora(self, name: str, lora_id: int, path: str) -> LoraRef:
        """The stand-in's LoRA request: named as the first adapter served from ``path``, whose
        weights it has (the stand-in's outputs follow from an adapter's name)."""
        return LoraRef(self.weights.setdefault(path, name), lora_id, path)

    async def _server_info(self, request: web.Request) -> web.Response:
        knobs = {k: getattr(self.spec, k) for k in ("max_loras", "max_lora_rank", "max_cpu_loras")}
        return web.json_response({"vllm_config": {"lora_config": knobs}})

    def _not_found(self, model: str) -> web.Response:
        error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError", "code": 404}
        return web.json_response({"error": error}, status=404)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        failure = self.failures.get(len(self.received))
        model = body.get("model")
        if model != BASE and model not in self.adapters:
            return self._not_found(model)
        if failure == "500":
            return web.json_response({"error": {"message": "injected failure", "code": 500}}, status=500)
        lora = None if model == BASE else self._lora(model, self.adapters[model], self.paths[model])
        prompt = body["prompt"] if isinstance(body["prompt"], list) else [3 + b for b in body["prompt"].encode()]
        params = Params(int(body["max_tokens"]), True, float(body.get("temperature", 1.0)) == 0.0)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        request_id = f"cmpl-{next(self._ids)}"
        generated = 0
        salt = body.get("cache_salt")
        sent = {"prompt_token_ids": prompt, "cache_salt": salt} if salt is not None else prompt
        cached = None
        async for out in self.llm.generate(sent, params, request_id, lora):
            cached = out.num_cached_tokens
            choice: dict[str, Any] = {"index": 0, "text": "x" * len(out.outputs[0].token_ids)}
            choice["finish_reason"] = "length" if out.finished else None
            if body.get("return_token_ids"):
                choice["token_ids"] = out.outputs[0].token_ids
                choice["prompt_token_ids"] = prompt if generated == 0 else None
            generated += len(out.outputs[0].token_ids)
            await _event(response, {"id": request_id, "object": "text_completion", "choices": [choice]})
            if failure == "drop":
                request.transport.abort()  # the client sees the stream break off
                return response
        usage: dict[str, Any] = {"prompt_tokens": len(prompt), "completion_tokens": generated}
        if self.prompt_tokens_details:
            # As `vllm serve --enable-prompt-tokens-details` (the serve target's command) reports it.
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        await _event(response, {"id": request_id, "choices": [], "usage": usage})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


class _Counters:
    """A stat logger that keeps the last step's stats and sums the steps into the server's
    counters, as vLLM's Prometheus logger does."""

    def __init__(self, server: StandInServer) -> None:
        self.server, self.totals = server, server.totals

    def record(self, scheduler_stats: Any = None, iteration_stats: Any = None, **_: Any) -> None:
        if scheduler_stats is not None:
            self.server.last = scheduler_stats
            self.totals["prefix_queries"] += scheduler_stats.prefix_cache_stats.queries
            self.totals["prefix_hits"] += scheduler_stats.prefix_cache_stats.hits
        if iteration_stats is not None:
            self.totals["steps"] += 1
            self.totals["preemptions"] += iteration_stats.num_preempted_reqs
            self.totals["prompt_tokens"] += iteration_stats.num_prompt_tokens
            self.totals["generation_tokens"] += iteration_stats.num_generation_tokens

    def log_engine_initialized(self) -> None:
        """Nothing to say."""


def _error(message: str, status: int) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


async def _event(response: web.StreamResponse, data: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(data)}\n\n".encode())


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": VERSION})


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m lorabench.targets.standin.server --port N --adapters a0,a1``: the stand-in as a process
    of its own, until SIGTERM (what the serve target's lifecycle is tested with)."""
    import argparse
    import signal

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--adapters", default="")
    args = parser.parse_args(argv)
    server = StandInServer([a for a in args.adapters.split(",") if a], port=args.port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        print(f"stand-in server on {server.url}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
