"""What a target cannot run of a config, said before any engine or server starts (apart from
``target``, which the config's own schema imports)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lorabench.config import ConfigFile, EngineSpec
from lorabench.config.target import INPROCESS, URL, Target
from lorabench.targets.http.metrics import ServerState


def problems(path: Path, file: ConfigFile, target: Target, specs: Sequence[EngineSpec]) -> list[str]:
    """What this target cannot run of the config's selected cases (``specs``: their engine
    configurations), each one line naming the field and the fix; checked before any engine or
    server starts. A URL is one server, so the selection may hold one configuration: ``-k``
    picks it from a config that lists several, as it picks any other subset."""
    found = []
    backend = (file.engine.model_extra or {}).get("distributed_executor_backend")
    if target.kind == INPROCESS and backend == "ray":
        found.append(
            f"{path}: engine.distributed_executor_backend 'ray' is not run in process (the pytest process would "
            "host the Ray driver, and memory is read for local devices only): serve the model with vllm serve "
            '--distributed-executor-backend ray and set "target": {"url": "http://HOST:PORT"} (docs/serve.md)'
        )
    names = sorted({s.name for s in specs})
    if target.kind == URL and len(names) > 1:
        choices = " or ".join(f"-k {name}" for name in names)
        found.append(
            f"{path}: target {target.url} is one server, but the selected cases run {len(names)} engine "
            f"configurations ({', '.join(names)}): select the one the server was started as ({choices}), "
            "or list one value of each LoRA and graph setting in the engine block"
        )
    return found


# The LoRA knobs vLLM's /server_info (VLLM_SERVER_DEV_MODE=1) gives under vllm_config.lora_config.
LORA_KNOBS = ("max_loras", "max_lora_rank", "max_cpu_loras")


def server_mismatches(
    spec: EngineSpec, max_model_len: int | None, state: ServerState, models: list[dict], lora: dict | None = None
) -> list[str]:
    """Where a running server contradicts the configuration its rows will name: a row that says
    ``max_loras`` 2 for a server started with 8 would be a false number. The server tells its
    ``max_lora`` on ``/metrics`` (``vllm:lora_requests_info``, once it has served an adapter),
    its ``max_model_len`` on ``/v1/models``, and, in vLLM's dev mode, every LoRA knob on
    ``/server_info`` (``lora``), and whether it caches prefixes on ``/metrics``
    (``vllm:cache_config_info``); what it does not tell is taken on trust."""
    found = []
    for knob in LORA_KNOBS if spec.enable_lora and lora else ():
        if lora.get(knob) is not None and lora[knob] != getattr(spec, knob):
            found.append(f"{knob} {lora[knob]} (its /server_info), not {getattr(spec, knob)}")
    told = bool(lora and lora.get("max_loras") is not None)
    if spec.enable_lora and not told and state.max_lora is not None and state.max_lora != spec.max_loras:
        found.append(f"max_loras {state.max_lora} (its /metrics vllm:lora_requests_info), not {spec.max_loras}")
    if state.prefix_caching is not None and state.prefix_caching != spec.enable_prefix_caching:
        found.append(
            f"enable_prefix_caching {state.prefix_caching} (its /metrics vllm:cache_config_info), "
            f"not {spec.enable_prefix_caching}"
        )
    served = {m.get("max_model_len") for m in models if not m.get("parent")} - {None}
    if max_model_len is not None and served and max_model_len not in served:
        found.append(f"max_model_len {', '.join(map(str, sorted(served)))} (its /v1/models), not {max_model_len}")
    return found
