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
import sys
import time
from types import TracebackType
from typing import Any, Callable, Sequence

import psutil

from lorabench.adapters import Adapter
from lorabench.config import BenchConfig, EngineSpec
from lorabench.memory import PeakMemory
from lorabench.workload import Batch


class Engine:
    """Builds, serves and shuts down one configuration's engine, and watches its processes."""

    def __init__(self, config: BenchConfig, spec: EngineSpec, device_type: str) -> None:
        self.config = config
        self.spec = spec
        self.memory = PeakMemory(device_type)
        self.device_type = device_type
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

    def __enter__(self) -> Engine:
        env = {k: str(v) for k, v in self.config.file.env.items()}
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        self.memory.start()
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            start = time.perf_counter()
            self.llm = self._build()
            self.build_s = time.perf_counter() - start
        except BaseException:
            self._restore_env()
            if self.loop is not None:
                self.loop.close()
                self.loop = None
            raise
        self._processes = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        self._reaper = _start_reaper(self._processes)
        if self.device_type == "cpu":
            self._unpin = _keep_off_worker_cpus(self._processes)
        self.memory.update()
        return self

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
        for proc in self._processes:
            try:
                gone = proc.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                gone = True
            if gone:
                raise EngineDied(f"engine process {proc.pid} is gone (killed, crashed or out of memory)")

    @property
    def vocab_size(self) -> int:
        model_config = self.llm.model_config if self.spec.online else self.llm.llm_engine.model_config
        return int(model_config.get_vocab_size())

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


def _set_affinity(process: psutil.Process, cpus: set[int]) -> None:
    """Every thread of ``process``: a process-wide call would move its main thread only."""
    for thread in process.threads():
        try:
            os.sched_setaffinity(thread.id, cpus)
        except OSError:  # the thread ended meanwhile
            pass


def _keep_off_worker_cpus(engine_processes: Sequence[psutil.Process]) -> Callable[[], None] | None:
    """Keep this process and the engine core off the cores vLLM bound its CPU workers to.

    vLLM's CPU backend binds each worker's OpenMP threads to cores and reserves the rest
    for the engine core and the front end, but it does not bind those two there (vLLM
    0.32). Left free, the engine core's busy loop sometimes lands on a worker's core and
    the build runs slower for as long as it stays there. Returns what undoes it for this
    process, so the next build starts from the full set of cores.
    """
    me = psutil.Process()
    allowed = set(os.sched_getaffinity(0))
    worker_cpus: set[int] = set()
    others = [me]
    for proc in engine_processes:
        try:
            cpus = set(proc.cpu_affinity())
        except psutil.Error:
            continue
        if cpus < allowed:
            worker_cpus |= cpus
        else:
            others.append(proc)
    rest = allowed - worker_cpus
    if not worker_cpus or not rest:
        return None
    for proc in others:
        try:
            _set_affinity(proc, rest)
        except psutil.Error:
            pass
    return lambda: _set_affinity(me, allowed)


# Blocks until its stdin closes (the engine was closed, or this process died, even by
# kill -9), then kills the engine's processes that are still running.
_REAPER = """
import sys, psutil
procs = []
for pid in sys.argv[1:]:
    try:
        procs.append(psutil.Process(int(pid)))
    except psutil.Error:
        pass
sys.stdin.read()
for proc in procs:
    try:
        proc.kill()
    except psutil.Error:
        pass
"""


def _start_reaper(processes: Sequence[psutil.Process]) -> subprocess.Popen | None:
    if not processes:
        return None
    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, *(str(p.pid) for p in processes)],
        stdin=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C meant for pytest must not reach it first
    )


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
