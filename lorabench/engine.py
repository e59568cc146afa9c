"""One in-process ``vllm.LLM`` per engine configuration, alive inside a ``with`` block.

The engine core keeps its own process (vLLM's default): shutting it down returns its
memory to the system, which an in-process engine core does not do reliably. That is
what lets one pytest session build several configurations one after another.
"""

from __future__ import annotations

import gc
import os
import time
from types import TracebackType
from typing import Any, Sequence

from lorabench.adapters import Adapter
from lorabench.config import BenchConfig, EngineSpec
from lorabench.memory import PeakMemory
from lorabench.workload import Batch


class Engine:
    def __init__(self, config: BenchConfig, spec: EngineSpec, device_type: str) -> None:
        self.config = config
        self.spec = spec
        self.memory = PeakMemory(device_type)
        self.build_s = 0.0
        self.llm: Any = None
        self._lora_ids = {a.name: i + 1 for i, a in enumerate(config.adapters)}
        self._saved_env: dict[str, str | None] = {}

    @property
    def id(self) -> str:
        return self.spec.id

    def __enter__(self) -> Engine:
        env = {k: str(v) for k, v in self.config.file.env.items()}
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        self.memory.start()
        try:
            from vllm import LLM

            start = time.perf_counter()
            self.llm = LLM(**self.config.llm_kwargs(self.spec))
            self.build_s = time.perf_counter() - start
        except BaseException:
            self._restore_env()
            raise
        self.memory.update()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            gc.collect()
        self._restore_env()

    def _restore_env(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}

    @property
    def vocab_size(self) -> int:
        return int(self.llm.llm_engine.model_config.get_vocab_size())

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
        engine = self.llm.llm_engine
        resident = engine.list_loras()
        start = time.perf_counter()
        for adapter in adapters:
            if self._lora_ids[adapter.name] not in resident:
                engine.add_lora(self.lora_request(adapter))
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
