"""An engine behind an OpenAI-compatible server, with the interface of lorabench's in-process
``Engine``: the batch, no-LoRA, online and capacity scenarios run over HTTP unchanged.

A request is a streaming ``POST /v1/completions`` whose ``model`` is the adapter's name (the
base model's served name for none), with the prompt as token ids. Everything is timed on
this process's clock, as a user of the server sees it: the request's send, each chunk's
arrival, the stream's end. What only the engine can stamp (the scheduler's queue, prefill
apart from TTFT) and what only it knows (its CPU cache of adapters) is left blank
(``lorabench.results.schema.ENGINE_ONLY``); its steps are read from ``/metrics`` (``lorabench.targets.http.telemetry``);
adapters are loaded from disk and timed through the runtime LoRA API (``lorabench.targets.http.lora_api``).

A request that fails (an error status, a stream that breaks off) is counted, not raised: an
online replay goes on and reports it unfinished, and its row says how many failed. A batch
with a failed request cannot be measured, and its case fails with the server's reason.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import warnings
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from aiohttp import ClientError

from lorabench.config import BenchConfig, EngineSpec
from lorabench.config.target import URL, Target
from lorabench.load.adapters import Adapter
from lorabench.load.workload import SYNTHETIC_TOKEN_LIMIT, Prompt
from lorabench.targets import clock
from lorabench.targets.engine import Engine
from lorabench.targets.failures import EngineBuildError
from lorabench.targets.http.checks import server_mismatches
from lorabench.targets.http.client import Client, RequestFailed
from lorabench.targets.http.lora_api import RuntimeApiMissing, RuntimeLoras, served_adapters, server_paths
from lorabench.targets.http.outputs import UNKNOWN_TOKEN, ClientTiming, Completion, HttpOutput, HttpParams, corrected
from lorabench.targets.http.telemetry import Awaiting, Scraper, requests_in_server, scrape

# Seconds between two scrapes of /metrics while waiting for the server to be idle.
IDLE_SCRAPE_S = 0.05


class HttpEngine(RuntimeLoras, Engine):
    """A server at ``target.url``: nothing is started or stopped (``ServeEngine`` starts one)."""

    def __init__(
        self, config: BenchConfig, spec: EngineSpec, device_type: str, log_path: Path | None, target: Target
    ) -> None:
        super().__init__(config, spec, device_type, log_path)
        self.target = target.kind
        self.endpoint = target.url
        self.client: Client | None = None
        self.base_model: str | None = None
        self.failed_requests = 0
        self.failures: list[str] = []
        self.server_version = ""
        self.server_block_size = 0
        self.paths: dict[str, str] = {}
        self._churned: dict[str, str] = {}
        # The server's LoRA knobs where it says them (a URL server in vLLM's dev mode), else None.
        self.server_lora: dict | None = None
        # The online timeline from the server's /metrics, scraped while a replay runs, with the
        # adapters of this client's requests awaiting a first token.
        self.awaiting = Awaiting()
        self.timeline = Scraper(lambda: self.client, self.awaiting.adapters)  # type: ignore[assignment]

    def __enter__(self) -> HttpEngine:
        self.loop = asyncio.new_event_loop()
        if self.target == URL:
            self.memory.source = "client"  # the server's memory is not this host's: the figure is the client's RSS
        self.memory.start()
        try:
            start = time.perf_counter()
            self._start_server()
            self.client = Client(self.endpoint)
            self.run(self._discover())
            self.build_s = time.perf_counter() - start
        except BaseException:
            self.close()
            raise
        return self

    def _start_server(self) -> None:
        """Nothing to start: the server at the URL runs already."""

    async def _discover(self) -> None:
        """The served names; refuse a server that lacks one of the config's adapters."""
        try:
            models = await self.client.models()
            self.base_model, adapters = served_adapters(models)
            self.paths = server_paths(models)
        except (RequestFailed, OSError, ValueError) as exc:
            raise EngineBuildError(f"{self.endpoint}: cannot list the served models: {exc}") from exc
        wanted = [a.name for a in self.config.adapters] if self.spec.enable_lora else []
        missing = [name for name in wanted if name not in adapters]
        if missing:
            served = ", ".join(sorted(adapters)) or "none"
            raise EngineBuildError(
                f"{self.endpoint} does not serve the adapters {', '.join(missing)} (its /v1/models lists: {served}): "
                "start it with --lora-modules NAME=PATH for each, or name the config's adapters as it does"
            )
        self.server_version = await self.client.version()
        if wanted:
            await self._first_token(self.config.adapters[0])  # the server says its max_lora once it has served one
        state = await scrape(self.client)
        self.kv_cache_tokens = state.kv_cache_tokens  # None: not reported, not 0
        self.server_block_size = state.block_size or 0
        if self.target == URL:
            self.server_lora = await self._server_lora()
            max_model_len = self.config.llm_kwargs(self.spec).get("max_model_len")
            found = server_mismatches(self.spec, max_model_len, state, models, self.server_lora)
            if found:
                raise EngineBuildError(
                    f"{self.endpoint} runs {'; '.join(found)}: its rows would name the wrong configuration; "
                    "select the configuration the server was started as (-k NAME), or change the config's engine block"
                )

    async def _server_lora(self) -> dict | None:
        """The server's LoRA settings from ``/server_info``, which vLLM serves in its dev mode
        only (``VLLM_SERVER_DEV_MODE=1``); None elsewhere."""
        try:
            status, text = await self.client.get("/server_info?config_format=json", timeout_s=60.0)
            lora = json.loads(text)["vllm_config"]["lora_config"] if status == 200 else None
        except (ClientError, TimeoutError, ValueError, KeyError, TypeError):
            return None
        return lora if isinstance(lora, dict) else None

    async def _first_token(self, adapter: Adapter) -> None:
        """One token of ``adapter``, untimed; a failure here is the build's."""
        async for _ in self.stream([1] * 4, self.sampling_params(1), adapter):
            pass
        if self.failures:
            raise EngineBuildError(f"{self.endpoint}: a first request to {adapter.name} failed: {self.failures[-1]}")

    def close(self) -> None:
        try:
            if self.client is not None and self.loop is not None:
                self.run(self.client.close())
        finally:
            self.client = None
            self._stop_server()
            if self.loop is not None:
                self.loop.close()
                self.loop = None

    def _stop_server(self) -> None:
        """Nothing to stop: the server at the URL is not lorabench's."""

    def provenance(self) -> dict[str, Any]:
        """What the rows say about the software that served: the server's own version where it
        gives one (the local install says nothing about a server elsewhere)."""
        served = {"vllm_version": self.server_version, "vllm_ascend_version": "", "torch_version": ""}
        if self.target != URL:  # a server lorabench started here: its host and install are ours
            return served
        unknown = "unknown"  # a server elsewhere: its builds and host are not ours to read
        return {
            **served,
            "vllm_commit": unknown,
            "vllm_ascend_commit": unknown,
            "cpu_model": unknown,
            "device_count": None,
        }

    def check_alive(self) -> None:
        """A server elsewhere cannot be watched; its failures show as failed requests."""

    @property
    def vocab_size(self) -> int:
        """From the model folder's config.json where the client has it; prompts' ids stay below
        ``SYNTHETIC_TOKEN_LIMIT`` anyway, which any real vocabulary exceeds."""
        try:
            config = json.loads((Path(self.config.model) / "config.json").read_text())
            return int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size"))
        except (OSError, ValueError, TypeError):
            return SYNTHETIC_TOKEN_LIMIT

    def sampling_params(self, max_tokens: int, *, stream: bool = False, greedy: bool = False) -> HttpParams:
        """Every request streams: a final-only output is the stream's last."""
        return HttpParams(max_tokens, greedy)

    @property
    def block_size(self) -> int:
        """The server's KV block size from its ``vllm:cache_config_info``; 0 where it does not
        say (then no prefix hit rate is predicted)."""
        return self.server_block_size

    def stream(
        self, prompt: Prompt, params: Any, adapter: Adapter | None, cache_salt: str | None = None
    ) -> AsyncIterator[HttpOutput]:
        model = adapter.name if adapter is not None else self.base_model
        return self.awaiting.track(adapter, self._stream(model, prompt, params, cache_salt))

    async def _stream(
        self, model: str, prompt: Prompt, params: HttpParams, cache_salt: str | None
    ) -> AsyncIterator[HttpOutput]:
        """Deltas as they arrive; the finishing one is held until the stream ends, so that the
        final ``usage`` count is in it. A failure ends the stream unfinished and is counted."""
        timing = ClientTiming(clock.now())
        counted, held, held_at, prompt_tokens = 0, None, None, len(prompt) if isinstance(prompt, list) else 0
        temperature, cached = 0.0 if params.greedy else 1.0, None
        try:
            async for chunk in self.client.complete(model, prompt, params.max_tokens, temperature, cache_salt):
                if chunk.count:
                    timing.first_token_ts = timing.first_token_ts or chunk.arrived
                    timing.last_token_ts = chunk.arrived
                ids = chunk.token_ids or [UNKNOWN_TOKEN] * chunk.count
                counted += len(ids)
                prompt_tokens = chunk.prompt_tokens or prompt_tokens
                cached = chunk.cached_tokens if chunk.cached_tokens is not None else cached
                if chunk.finished:
                    held, held_at = ids, chunk.arrived
                elif ids:
                    yield HttpOutput([Completion(ids)], False, timing, received_at=chunk.arrived)
                # vLLM sends the usage in an event of its own; a server may send it with the finish.
                if chunk.completion_tokens is not None and held is not None:
                    held = corrected(held, chunk.completion_tokens - counted)
        except RequestFailed as exc:
            self.failed_requests += 1
            self.failures.append(str(exc))
            return
        final = [UNKNOWN_TOKEN] * prompt_tokens
        yield HttpOutput([Completion(held or [])], True, timing, final, received_at=held_at, num_cached_tokens=cached)

    def generate(
        self,
        prompts: Sequence[Prompt],
        adapters: Sequence[Adapter | None],
        output_len: int,
        *,
        greedy: bool = False,
        cache_salt: str | None = None,
        prompt_logprobs: int | None = None,
    ) -> list[Any]:
        """A batch's final outputs, each the whole completion; a failed request fails the batch.
        No ``prompt_logprobs``: vLLM refuses them on a streamed completion, and these stream."""
        if prompt_logprobs is not None:
            raise ValueError("prompt_logprobs over HTTP: vLLM refuses them on a streamed completion")
        failed = self.failed_requests
        params = self.sampling_params(output_len, greedy=greedy)

        async def one(prompt: Prompt, adapter: Adapter | None) -> HttpOutput | None:
            tokens, final = [], None
            async for out in self.stream(prompt, params, adapter, cache_salt):
                tokens += out.outputs[0].token_ids
                final = out
            if final is not None:
                final.outputs = [Completion(tokens)]
            return final

        async def batch() -> list[Any]:
            return list(await asyncio.gather(*(one(p, a) for p, a in zip(prompts, adapters))))

        outputs = self.run(batch())
        if self.failed_requests > failed:
            raise RequestFailed(
                f"{self.failed_requests - failed} of {len(prompts)} requests of the batch failed: {self.failures[-1]}"
            )
        return outputs

    async def wait_idle(self, timeout_s: float) -> tuple[float | None, int | None]:
        """Until the server's ``/metrics`` shows no request running or waiting, ``timeout_s`` at
        most, a scrape every ``IDLE_SCRAPE_S``: a server counts a request the client cancelled
        until its engine drops it. Both None where the server exports neither gauge."""
        started = time.perf_counter()
        left = await requests_in_server(self.client)
        while left and time.perf_counter() - started < timeout_s:
            await asyncio.sleep(IDLE_SCRAPE_S)
            left = await requests_in_server(self.client)
        return (None, None) if left is None else (time.perf_counter() - started, left)

    def load_adapters(self, adapters: Sequence[Adapter]) -> None:
        """One token of each adapter, untimed, before a case's timing starts: nothing over HTTP
        loads an adapter into the CPU cache without serving it, and the alias loads of
        ``adapter_load_ms`` or an earlier case may have evicted it, so without this the case's
        first requests would pay loads from disk that in process are paid before the timing."""
        if adapters:
            self.generate([[1] * 4] * len(adapters), list(adapters), 1)

    def cached_adapters(self) -> set[str]:
        """Unknown to a client: nothing over HTTP lists the engine's CPU cache, so the columns
        that need it stay blank on HTTP targets (``schema.ENGINE_ONLY``)."""
        return set()

    def disk_loads(self) -> None:
        """Unknown to a client too: the server's worker counts nothing a client can read."""
        return None

    def measure_adapter_loads(self, adapters: Sequence[Adapter]) -> float | None:  # type: ignore[override]
        """Mean seconds of ``/v1/load_lora_adapter`` of a fresh alias of each adapter, each timed
        alone: its load from disk, as a client of the server pays it. None, with a warning that
        says why, where the server refuses the runtime API or a load."""
        try:
            return statistics.fmean(self.time_alias_loads(adapters))
        except (RuntimeApiMissing, RequestFailed) as exc:
            warnings.warn(f"{self.id}: adapter_load_ms left blank: {exc}", RuntimeWarning, stacklevel=2)
            return None
