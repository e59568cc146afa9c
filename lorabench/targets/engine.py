"""One in-process vLLM engine per build of an engine configuration, alive inside a ``with`` block.

Every engine is vLLM's async engine (``AsyncLLM``), on an event loop it owns, so one
build serves every scenario that needs its configuration: a batch is sent at once and
gathered (as ``LLM.generate`` does), a trace is streamed request by request. The engine
core keeps its own process (vLLM's default): shutting it down returns its memory to the
system, which an in-process engine core does not do reliably. That is what lets one
pytest session build several engines one after another.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from lorabench.config import BenchConfig, EngineSpec
from lorabench.host import processes
from lorabench.host.device import Platform, detect_platform
from lorabench.host.memory import PeakMemory
from lorabench.results import graph
from lorabench.targets import vllm_worker
from lorabench.targets.clock import now
from lorabench.targets.engine_adapters import AdapterCache
from lorabench.targets.engine_env import applied, engine_environment
from lorabench.targets.engine_requests import Requests
from lorabench.targets.failures import EngineBuildError, EngineDied
from lorabench.targets.timeline import Recorder

# How often a wait for an idle engine asks it.
IDLE_POLL_S = 0.01


@dataclass
class BuildState:
    """Facts measured once per engine build and shared by all of its cases."""

    prepared: bool = False
    # Mean seconds of one adapter's add_lora from disk into the CPU cache (None without LoRA).
    adapter_load_s: float | None = None
    # Adapters whose greedy output differs from the run's reference, or why none could be checked.
    digest_mismatches: int | None = None
    digest_failure: str | None = None
    # Mean e2e (ms) of a batch of prompts sent with no adapter, by the prompts and round counts.
    baselines: dict[tuple, float] = field(default_factory=dict)


DRAFTS = "vllm:spec_decode_num_draft_tokens"


class Engine(AdapterCache, Requests):
    """Builds, serves and shuts down one build of one configuration, and watches its processes."""

    # Where requests go (lorabench.config.target), and the server's URL for an HTTP target.
    target = "inprocess"
    endpoint: str | None = None
    # Requests that failed and were counted, not raised: HTTP targets only (None: a failure raises).
    failed_requests: int | None = None

    def __init__(self, config: BenchConfig, spec: EngineSpec, device_type: str, log_path: Path | None = None) -> None:
        self.config = config
        self.spec = spec
        self.device_type = device_type
        self.log_path = log_path
        self.memory = PeakMemory(device_type, num_devices=config.devices_per_engine)
        self.build_s = 0.0
        self.kv_cache_tokens = 0
        self.graph = graph.GraphFacts()
        # Records the engine's steps while a trace replays (lorabench.targets.timeline).
        self.timeline = Recorder()
        self.llm: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        # Set when the engine died while serving: the case it died in, and why.
        self.died: str | None = None
        self._lora_ids = {a.name: i + 1 for i, a in enumerate(config.adapters)}
        self.state = BuildState()
        self._request_ids = itertools.count()
        self._env: AbstractContextManager[None] | None = None
        self._processes: list[psutil.Process] = []
        self._reaper: subprocess.Popen | None = None
        self._unpin: Callable[[], None] | None = None
        self._log_start = 0

    @property
    def id(self) -> str:
        return self.spec.id

    def cold_salt(self) -> str | None:
        """With prefix caching on, a ``cache_salt`` no request has had: requests given it find
        cached only what requests salted alike cached, so a measurement that repeats its
        prompts, or follows another that sent them, is not served from their cache. None with
        caching off (vLLM hashes the salt into a prompt's first KV block)."""
        return f"lorabench-{uuid.uuid4().hex}" if self.spec.enable_prefix_caching else None

    def __enter__(self) -> Engine:
        self._env = applied(engine_environment(self.config.file.env, self.device_type))
        self._env.__enter__()
        self.memory.start()
        self._log_start = self.log_path.stat().st_size if self.log_path is not None and self.log_path.is_file() else 0
        before = processes.children()
        self.loop = self.new_loop()
        try:
            start = time.perf_counter()
            with processes.output_to(self.log_path):
                self.llm = self.loop.run_until_complete(self._build())
            self.build_s = time.perf_counter() - start
        except BaseException as exc:
            self._restore_env()
            self.loop.close()
            self.loop = None
            if isinstance(exc, Exception):
                raise EngineBuildError(self._failure(exc)) from exc
            raise
        self._processes = processes.started_since(before)
        self._reaper = processes.start_reaper(self._processes)
        if self.device_type == "cpu":
            self._unpin = processes.keep_off_worker_cpus(self._processes)
        self.kv_cache_tokens = self._kv_cache_tokens()
        self.timeline.watch(self.llm)
        self.graph = graph.reported(self.llm.vllm_config, self._log_text())
        self.memory.update()
        return self

    def new_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the engine serves on: a new one of asyncio's (the stand-in may run a virtual clock)."""
        return asyncio.new_event_loop()

    def provenance(self) -> dict[str, Any]:
        """Provenance columns this engine knows better than the session does: none in process."""
        return {}

    def _log_text(self) -> str:
        """What this build's processes wrote: the log is appended to, so earlier runs' lines stay out."""
        if self.log_path is None or not self.log_path.is_file():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_start)
            return log.read().decode("utf-8", errors="replace")

    def _kv_cache_tokens(self) -> int:
        cache = self.llm.vllm_config.cache_config
        return int(cache.num_gpu_blocks or 0) * int(cache.block_size or 0)

    async def _build(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**self._with_load_counter(self.config.llm_kwargs(self.spec)))
        return AsyncLLM.from_engine_args(args, **self.timeline.vllm_kwargs(AsyncLLM))

    def _with_load_counter(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """vLLM's arguments with lorabench's worker extension, which counts the adapters vLLM
        loads from disk (``disk_loads``), unless the config brings its own: then the counts
        stay blank, and a warning says why."""
        if self.spec.enable_lora:
            kwargs.setdefault("worker_extension_cls", vllm_worker.QUALNAME)
            self.counts_disk_loads = kwargs["worker_extension_cls"] == vllm_worker.QUALNAME
            if not self.counts_disk_loads:
                warnings.warn(vllm_worker.REPLACED, RuntimeWarning, stacklevel=2)
        return kwargs

    def _failure(self, exc: Exception) -> str:
        """One line: what the engine's own processes said, else what this process caught."""
        said = processes.root_cause(self._log_text())
        caught = f"{type(exc).__name__}: {exc}".splitlines()[0]
        where = f" (engine log: {self.log_path})" if self.log_path is not None else ""
        return f"{said} [{caught}]{where}" if said and said not in caught else f"{caught}{where}"

    def run(self, coroutine: Any) -> Any:
        """Run a coroutine on the engine's event loop."""
        return self.loop.run_until_complete(coroutine)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def _shutdown(self) -> None:
        # vLLM closes the engine's sockets through callbacks on this loop: they must run
        # before the loop closes, or tearing down the ZMQ context blocks forever.
        self.llm.shutdown()
        await asyncio.sleep(0.1)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        try:
            if self.llm is not None:
                self.run(self._shutdown())
        except Exception:
            if not self.died:  # shutting down a dead engine core may fail; nothing is left to free
                raise
        finally:
            self.llm = None
            if self.loop is not None:
                self.loop.close()
                self.loop = None
            gc.collect()
            self._restore_env()
            if self._unpin is not None:
                self._unpin()
                self._unpin = None
            if self._reaper is not None:
                self._reaper.stdin.close()  # the reaper kills whatever shutdown left behind
                self._reaper.wait(timeout=30)
                self._reaper = None
        self.memory.wait_released()

    def _restore_env(self) -> None:
        if self._env is not None:
            self._env.__exit__(None, None, None)
            self._env = None

    def check_alive(self) -> None:
        """Raise ``EngineDied`` if a process the engine started is gone.

        vLLM notices a dead engine core from a monitor thread; a request sent before it
        does can wait forever, so each case checks first.
        """
        gone = processes.first_gone(self._processes)
        if gone is not None:
            raise EngineDied(f"engine process {gone.pid} is gone (killed, crashed or out of memory)")

    def unfinished_requests(self) -> int | None:
        """Requests sent and neither finished nor aborted, as vLLM's front end counts them
        (``AsyncLLM.get_num_unfinished_requests``; an aborted request leaves the count at once,
        and the engine core drops it once its step in flight ends): what a caller that needs an
        idle engine waits on. None where the engine cannot tell: an HTTP target's server."""
        if self.target != "inprocess":
            return None
        # AsyncLLM counts them from vLLM 0.29 on; its output processor does in every release.
        count = getattr(self.llm, "get_num_unfinished_requests", None)
        return int(count() if count else self.llm.output_processor.get_num_unfinished_requests())

    def draft_tokens(self) -> int | None:
        """Draft tokens speculative decoding proposed on this engine so far: vLLM's
        ``vllm:spec_decode_num_draft_tokens``, counted by the front end's stat logger in this
        process's Prometheus registry. None where nothing counts them (no speculation, or an
        HTTP target's server)."""
        if self.target != "inprocess":
            return None
        own = getattr(self.llm, "draft_tokens", None)  # a stand-in counts its own
        if own is not None:
            return own()
        from vllm.v1.metrics.reader import Counter, get_metrics_snapshot  # the front end imported vLLM already

        found = [m.value for m in get_metrics_snapshot() if isinstance(m, Counter) and m.name == DRAFTS]
        return int(sum(found)) if found else None

    async def wait_idle(self, timeout_s: float) -> tuple[float | None, int | None]:
        """Wait until no request is unfinished, ``timeout_s`` at most: requests aborted at the end
        of one measurement must not take the next one's first steps. The seconds waited and the
        requests still unfinished then (0 once idle); both None where the engine cannot tell,
        which is not waited on."""
        started = now()
        left = self.unfinished_requests()
        if left is None:
            return None, None
        while left and now() - started < timeout_s:
            await asyncio.sleep(IDLE_POLL_S)
            left = self.unfinished_requests()
        return now() - started, left


class VllmBackend:
    """What the plugin builds engines with: in-process vLLM on the platform vLLM detects.

    A test (or a user's conftest) replaces it through the ``pytest_lorabench_backend``
    hook, as ``lorabench.targets.standin`` does with its stand-in engine.
    """

    checks_vllm_args = True

    def platform(self) -> Platform:
        return detect_platform()

    def engine(self, config: BenchConfig, spec: EngineSpec, device_type: str, log_path: Path | None) -> Engine:
        return Engine(config, spec, device_type, log_path=log_path)
