"""The server's state from its Prometheus ``/metrics``: what a client can read of the engine.

vLLM exports (among many) ``vllm:kv_cache_usage_perc`` (0-1, despite the name),
``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and ``vllm:lora_requests_info``,
a gauge whose labels name adapters (comma-separated) and the configured ``max_lora``. Each
gauge carries labels (``model_name``, ``engine``); a server with several engines (data
parallel) has one sample per engine, summed here.

The adapter labels say less than their names: vLLM 0.32's front end keeps an entry per
adapter once one of its requests has had an output, until its requests finish, and writes
the entries' names, not their counts, into both labels. So an adapter whose requests all run
is named among the waiting ones too (seen on the CPU build: 2 adapters "waiting" while no
request waited), and one whose requests all wait for a slot is named in neither.
``ServerState.running_adapters`` bounds the running ones by the request gauges; which
adapters wait, only the client knows (``lorabench.targets.http.telemetry``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# name{labels} value [timestamp]
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class ServerState:
    """One scrape of ``/metrics``: None where the server exports no such gauge."""

    kv_usage: float | None = None
    running: int | None = None
    waiting: int | None = None
    adapters_running: list[str] = field(default_factory=list)
    adapters_waiting: list[str] = field(default_factory=list)
    max_lora: int | None = None
    # vllm:cache_config_info's num_gpu_blocks x block_size: the KV cache, in tokens.
    kv_cache_tokens: int | None = None
    # vllm:cache_config_info's enable_prefix_caching: whether the server caches prompt prefixes.
    prefix_caching: bool | None = None
    # vllm:cache_config_info's block_size: the tokens of one KV block, the prefix cache's unit.
    block_size: int | None = None
    # Counters since the server started (a timeline takes their differences): engine steps
    # (the count of the tokens-per-step histogram), preemptions, prompt and generated tokens.
    steps: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0

    def running_adapters(self) -> int:
        """Adapters with a request running: the label's names, of which no more can run than
        requests do, nor than the server's adapter slots. Exact where no request waits (every
        named adapter has one running); where requests both run and wait, a bound."""
        return min(len(self.adapters_running), self.running or 0, self.max_lora or len(self.adapters_running))


# The counters a timeline record sums, by the ServerState field they add to.
COUNTERS = {
    "vllm:iteration_tokens_total_count": "steps",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
}


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition: (name, labels, value); comments skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        out.append((name, dict(_LABEL.findall(labels or "")), number))
    return out


def _names(label: str) -> list[str]:
    return [n for n in label.split(",") if n]


def server_state(text: str) -> ServerState:
    """The gauges lorabench reads, from one scrape."""
    state = ServerState()
    lora_info: tuple[float, dict[str, str]] | None = None
    for name, labels, value in samples(text):
        if name == "vllm:kv_cache_usage_perc":
            state.kv_usage = max(state.kv_usage or 0.0, value)
        elif name == "vllm:num_requests_running":
            state.running = (state.running or 0) + int(value)
        elif name == "vllm:num_requests_waiting":
            state.waiting = (state.waiting or 0) + int(value)
        elif name == "vllm:lora_requests_info" and (lora_info is None or value >= lora_info[0]):
            lora_info = (value, labels)  # the latest sample: its value is when it was set
        elif name in COUNTERS:
            setattr(state, COUNTERS[name], getattr(state, COUNTERS[name]) + int(value))
        elif name == "vllm:cache_config_info":
            if labels.get("enable_prefix_caching") in ("True", "False"):
                state.prefix_caching = labels["enable_prefix_caching"] == "True"
            if labels.get("num_gpu_blocks", "").isdigit():
                blocks, size = int(labels["num_gpu_blocks"]), int(labels.get("block_size", "0") or 0)
                state.kv_cache_tokens = (state.kv_cache_tokens or 0) + blocks * size
                state.block_size = size or state.block_size
    if lora_info is not None:
        labels = lora_info[1]
        state.adapters_running = _names(labels.get("running_lora_adapters", ""))
        state.adapters_waiting = _names(labels.get("waiting_lora_adapters", ""))
        if labels.get("max_lora", "").isdigit():
            state.max_lora = int(labels["max_lora"])
    return state
