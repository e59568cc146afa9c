"""One in-process vLLM engine per engine configuration, alive inside a ``with`` block.

Batch cases use ``vllm.LLM``; online configurations use vLLM's ``AsyncLLM`` on an
event loop the engine owns. The engine core keeps its own process (vLLM's default):
shutting it down returns its memory to the system, which an in-process engine core
does not do reliably. That is what lets one pytest session build several
configurations one after another.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Sequence

import psutil

from lorabench import processes
from lorabench.adapters import Adapter
from lorabench.config import BenchConfig, EngineSpec
from lorabench.memory import ACCELERATORS, PeakMemory
from lorabench.workload import Batch

SPAWN = "VLLM_WORKER_MULTIPROC_METHOD"


class EngineBuildError(RuntimeError):
    """An engine failed to build; the message carries the reason its own processes gave."""


class Engine:
    """Builds, serves and shuts down one configuration's engine, and watches its processes."""

    def __init__(self, config: BenchConfig, spec: EngineSpec, device_type: str, log_path: Path | None = None) -> None:
        self.config = config
        self.spec = spec
        self.memory = PeakMemory(device_type, num_devices=config.devices_per_engine)
        self.device_type = device_type
        self.log_path = log_path
        self.kv_cache_tokens = 0
        self._unpin: Callable[[], None] | None = None
        self.build_s = 0.0
        self.llm: Any = None
        self._lora_ids = {a.name: i + 1 for i, a in enumerate(config.adapters)}
        self._saved_env: dict[str, str | None] = {}
        # Set when the engine died while serving: the case it died in, and why.
        self.died: str | None = None
        self._processes: list[psutil.Process] = []
        self._reaper: subprocess.Popen | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def id(self) -> str:
        return self.spec.id

    def _environment(self) -> dict[str, str]:
        """The config's variables, plus spawn for the engine's processes on an accelerator.

        vLLM forks its engine core unless something forces spawn; it forces it for an
        initialized CUDA context and on the CPU, not on Ascend, where a forked child
        cannot initialize torch_npu again. Spawn is safe everywhere; a value the user set
        (in the environment or the config's ``env``) wins.
        """
        env = {k: str(v) for k, v in self.config.file.env.items()}
        if self.device_type in ACCELERATORS and SPAWN not in env and SPAWN not in os.environ:
            env[SPAWN] = "spawn"
        return env

    def __enter__(self) -> Engine:
        env = self._environment()
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        self.memory.start()
        before = processes.children()
        try:
            start = time.perf_counter()
            with processes.output_to(self.log_path):
                self.llm = self._build()
            self.build_s = time.perf_counter() - start
        except BaseException as exc:
            self._restore_env()
            if self.loop is not None:
                self.loop.close()
                self.loop = None
            if isinstance(exc, Exception):
                raise EngineBuildError(self._failure(exc)) from exc
            raise
        self._processes = processes.started_since(before)
        self._reaper = processes.start_reaper(self._processes)
        if self.device_type == "cpu":
            self._unpin = processes.keep_off_worker_cpus(self._processes)
        cache = self.vllm_config.cache_config
        self.kv_cache_tokens = int(cache.num_gpu_blocks or 0) * int(cache.block_size or 0)
        self.memory.update()
        return self

    def _failure(self, exc: Exception) -> str:
        """One line: what the engine's own processes said, else what this process caught."""
        said = ""
        if self.log_path is not None and self.log_path.is_file():
            said = processes.root_cause(self.log_path.read_text(encoding="utf-8", errors="replace"))
        caught = f"{type(exc).__name__}: {exc}".splitlines()[0]
        where = f" (engine log: {self.log_path})" if self.log_path is not None else ""
        return f"{said} [{caught}]{where}" if said and said not in caught else f"{caught}{where}"

    @property
    def vllm_config(self) -> Any:
        return self.llm.vllm_config if self.spec.online else self.llm.llm_engine.vllm_config

    def _build(self) -> Any:
        kwargs = self.config.llm_kwargs(self.spec)
        if not self.spec.online:
            from vllm import LLM

            return LLM(**kwargs)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        async def build() -> Any:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

        # The async engine lives on one event loop for its whole life; cases run on it.
        self.loop = asyncio.new_event_loop()
        return self.loop.run_until_complete(build())

    async def _shutdown_async(self) -> None:
        # vLLM closes the async engine's sockets through callbacks on this loop: they
        # must run before the loop closes, or tearing down the ZMQ context blocks forever.
        self.llm.shutdown()
        await asyncio.sleep(0.1)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def run(self, coroutine: Any) -> Any:
        """Run a coroutine on the async engine's event loop (online configurations only)."""
        return self.loop.run_until_complete(coroutine)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self.llm is not None and self.spec.online:
                self.run(self._shutdown_async())
            elif self.llm is not None:
                self.llm.llm_engine.engine_core.shutdown()
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
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}

    def check_alive(self) -> None:
        """Raise ``EngineDied`` if a process the engine started is gone.

        vLLM notices a dead engine core from a monitor thread; a request sent before it
        does can wait forever, so each case checks first.
        """
        gone = processes.first_gone(self._processes)
        if gone is not None:
            raise EngineDied(f"engine process {gone.pid} is gone (killed, crashed or out of memory)")

    @property
    def vocab_size(self) -> int:
        return int(self.vllm_config.model_config.get_vocab_size())

    def lora_request(self, adapter: Adapter) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(adapter.name, self._lora_ids[adapter.name], str(adapter.path))

    def load_adapters(self, adapters: Sequence[Adapter]) -> float:
        """Load the adapters not yet in the engine's CPU cache; returns the seconds it took.

        Moving an adapter from the CPU cache into one of the ``max_loras`` slots still
        happens while serving; that is part of multi-LoRA cost and stays in the timings.
        """
        if not adapters:
            return 0.0
        if self.spec.online:
            resident = self.run(self.llm.list_loras())
            add = lambda request: self.run(self.llm.add_lora(request))  # noqa: E731
        else:
            resident = self.llm.llm_engine.list_loras()
            add = self.llm.llm_engine.add_lora
        start = time.perf_counter()
        for adapter in adapters:
            if self._lora_ids[adapter.name] not in resident:
                add(self.lora_request(adapter))
        return time.perf_counter() - start

    def generate(self, batch: Batch, output_len: int) -> list[Any]:
        """Serve one batch; every request produces exactly ``output_len`` tokens."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(n=1, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=output_len)
        prompts = [
            TokensPrompt(prompt_token_ids=r.prompt) if isinstance(r.prompt, list) else r.prompt
            for r in batch.requests
        ]
        loras = [self.lora_request(r.adapter) if r.adapter is not None else None for r in batch.requests]
        kwargs = {"lora_request": loras} if self.spec.enable_lora else {}
        return self.llm.generate(prompts, params, use_tqdm=False, **kwargs)


class EngineDied(RuntimeError):
    """A process of the engine is gone."""


def is_engine_dead(exc: BaseException) -> bool:
    """Whether ``exc`` means the engine core is gone (killed, crashed, out of memory)."""
    if isinstance(exc, EngineDied):
        return True
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:
        return False
    return isinstance(exc, EngineDeadError) or isinstance(exc.__cause__, EngineDeadError)
