"""Every vLLM name lorabench touches, the feature that needs it, and whether a vLLM has it.

One owner: the in-process engine, the HTTP target and the scenarios ask ``lacking(feature)``
instead of guessing from a version number, and ``tests/test_vllm_api.py`` checks this list
against the installed vLLM, and against a release's wheel with ``scripts/vllm_names.py``.
Names are read from the source (``vllm_source``), never by importing vLLM, so the answer is
the same in the pytest process, in ``lorabench doctor`` and for a wheel that cannot run here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from lorabench.targets.vllm_source import Source, installed

# The oldest vLLM lorabench supports, and the newest it has run on: docs/releases.md says
# what was run on each; pyproject's extras and the docs are held to these by tests.
OLDEST = "0.23.0"
NEWEST_RUN = "0.32.0"

ENGINE, LORA = "engine", "lora"
# What each feature gives; a missing one blanks or skips exactly that, with this line.
FEATURES = {
    ENGINE: "an in-process engine (AsyncLLM) and its requests",
    LORA: "LoRA adapters: requests that name one, added and removed at run time",
    "reload_in_place": "the isolation scenario's reload-in-place canary",
    "cache_salt": "cache_salt: rounds and canaries kept off each other's cached prefixes",
    "cached_tokens": "per-request cached prompt tokens (cached_tokens, prefix hit rates)",
    "timeline": "the engine's state over time from its stat loggers (timeline, kv_usage_max, waiting_p99)",
    "disk_loads": "adapter loads counted in vLLM's worker (timed_adapter_loads, load_share)",
    "idle_count": "unfinished requests counted by the front end (the capacity search waits for an idle engine)",
    "serve": "vllm serve targets (--bench-target serve)",
    "metrics": "a server's /metrics read by the HTTP target (telemetry, block size, adapters)",
}


@dataclass(frozen=True)
class Name:
    """A name in ``module``: ``qualname`` (``Class.attr``, ``func(param)``), the module itself
    (blank), or a metric vLLM serves (``vllm:...``)."""

    feature: str
    module: str
    qualname: str = ""

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}" if self.qualname else self.module

    def found_in(self, source: Source) -> bool:
        if not self.qualname:
            return source.has_module(self.module)
        if self.qualname.startswith("vllm:"):
            return source.mentions(self.module, self.qualname)
        return source.has(self.module, self.qualname)


def _names(feature: str, module: str, *qualnames: str) -> list[Name]:
    return [Name(feature, module, q) for q in qualnames]


_ARGS, _ASYNC, _STATS = "vllm.engine.arg_utils", "vllm.v1.engine.async_llm", "vllm.v1.metrics.stats"
_LOGGERS = "vllm.v1.metrics.loggers"
NAMES: tuple[Name, ...] = (
    *_names(ENGINE, _ARGS, "AsyncEngineArgs", "EngineArgs", "EngineArgs.disable_log_stats"),
    *_names(ENGINE, _ASYNC, "AsyncLLM", "AsyncLLM.from_engine_args", "AsyncLLM.generate", "AsyncLLM.shutdown"),
    *_names(ENGINE, _ASYNC, "AsyncLLM.vllm_config", "AsyncLLM.output_processor"),
    *_names(ENGINE, "vllm", "SamplingParams"),
    *_names(ENGINE, "vllm.sampling_params", "RequestOutputKind.DELTA", "RequestOutputKind.FINAL_ONLY"),
    *_names(ENGINE, "vllm.inputs", "TextPrompt", "TokensPrompt"),
    *_names(ENGINE, "vllm.outputs", "RequestOutput.outputs", "RequestOutput.metrics", "CompletionOutput.token_ids"),
    *_names(ENGINE, _STATS, "RequestStateStats.queued_ts", "RequestStateStats.scheduled_ts"),
    *_names(ENGINE, _STATS, "RequestStateStats.first_token_ts", "RequestStateStats.last_token_ts"),
    *_names(ENGINE, "vllm.v1.engine.exceptions", "EngineDeadError"),
    *_names(ENGINE, "vllm.platforms", "current_platform"),
    *_names(LORA, _ARGS, "EngineArgs.enable_lora", "EngineArgs.max_loras", "EngineArgs.max_lora_rank"),
    *_names(LORA, _ARGS, "EngineArgs.max_cpu_loras"),
    *_names(LORA, "vllm.lora.request", "LoRARequest", "LoRARequest.lora_path"),
    *_names(LORA, _ASYNC, "AsyncLLM.add_lora", "AsyncLLM.remove_lora", "AsyncLLM.list_loras"),
    *_names("reload_in_place", "vllm.lora.request", "LoRARequest.load_inplace"),
    *_names("cache_salt", "vllm.inputs", "TokensPrompt.cache_salt", "TextPrompt.cache_salt"),
    *_names("cached_tokens", "vllm.outputs", "RequestOutput.num_cached_tokens"),
    *_names("timeline", _ASYNC, "AsyncLLM.from_engine_args(stat_loggers)"),
    *_names("timeline", _LOGGERS, "StatLoggerBase", "StatLoggerBase.record"),
    *_names("timeline", _STATS, "SchedulerStats.kv_cache_usage", "SchedulerStats.num_running_reqs"),
    *_names("timeline", _STATS, "SchedulerStats.num_waiting_reqs", "SchedulerStats.running_lora_adapters"),
    *_names("timeline", _STATS, "SchedulerStats.prefix_cache_stats", "IterationStats.num_preempted_reqs"),
    *_names("timeline", _STATS, "IterationStats.num_prompt_tokens", "IterationStats.num_generation_tokens"),
    *_names("disk_loads", _ARGS, "EngineArgs.worker_extension_cls"),
    *_names("disk_loads", _ASYNC, "AsyncLLM.collective_rpc"),
    *_names("disk_loads", "vllm.lora.worker_manager", "LRUCacheWorkerLoRAManager._load_adapter"),
    *_names("idle_count", "vllm.v1.engine.output_processor", "OutputProcessor.get_num_unfinished_requests"),
    Name("serve", "vllm.entrypoints.openai.api_server"),
    Name("serve", "vllm.entrypoints.cli.main"),
    *_names("metrics", _LOGGERS, "vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:lora_requests_info"),
    *_names("metrics", _LOGGERS, "vllm:num_requests_waiting", "vllm:cache_config_info", "vllm:num_preemptions"),
    *_names("metrics", _LOGGERS, "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:iteration_tokens_total"),
    *_names("metrics", _LOGGERS, "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"),
)
# Used where present, with the always-present fallback beside it: never a reason to skip.
PREFERRED = (Name("idle_count", _ASYNC, "AsyncLLM.get_num_unfinished_requests"),)


def missing(source: Source, feature: str | None = None) -> list[Name]:
    """The names ``source`` lacks, of one feature or of all."""
    return [n for n in NAMES if (feature is None or n.feature == feature) and not n.found_in(source)]


@cache
def lacking(feature: str) -> str | None:
    """Why the installed vLLM cannot give ``feature``, in one line; None where it can, or where
    there is no vLLM source to read (then the engine build says what is wrong)."""
    source = installed()
    if source is None:
        return None
    gone = missing(source, feature)
    if not gone:
        return None
    return f"{FEATURES[feature]} needs {', '.join(map(str, gone))}, which the installed vLLM lacks"
