"""Graph mode: which one an engine configuration asks for, and which one the engine ran.

LoRA's cost depends on it. On a 910B, LoRA ran at a fraction of the base model's
tokens/s until LoRA and ACLGraph worked together; CUDA graphs and torch.compile change
the picture on GPUs. So the settings that choose it (``enforce_eager``, vLLM's
``compilation_config``, vllm-ascend's ``additional_config``) may be lists in the config,
each value its own engine configuration, and they are part of the case key: a
comparison never matches an eager run against a graph run.

What was asked is not always what runs: vLLM's CPU backend turns compilation off for
LoRA engines, and a platform may change the CUDA-graph mode. So every row also records
the modes the engine's own configuration reports after the build, and the compile and
graph-capture times vLLM logs.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

# Engine arguments that choose the graph mode; each may be a list in the config.
GRAPH_KEYS = ("enforce_eager", "compilation_config", "additional_config")
# The part of them a configuration's graph_config column and name carry (enforce_eager has its own).
_SETTINGS_KEYS = GRAPH_KEYS[1:]
# vLLM's wording across versions: "torch.compile takes 12.3 s in total" (up to 0.11),
# "torch.compile took ..." and "torch.compile and initial profiling/warmup run together took ...".
_CAPTURE = re.compile(r"Graph capturing finished in ([\d.]+) secs")
_COMPILE = re.compile(r"torch\.compile (?:and [^.]*? )?(?:takes|took) ([\d.]+) s")


def canonical(settings: dict[str, Any]) -> str | None:
    """``compilation_config`` / ``additional_config`` as one stable JSON string, or None
    when neither is set: the case key's value, equal for equal settings in any key order."""
    chosen = {k: settings[k] for k in _SETTINGS_KEYS if settings.get(k) is not None}
    return json.dumps(chosen, sort_keys=True, separators=(",", ":")) if chosen else None


def engine_kwargs(enforce_eager: bool | None, graph_config: str | None) -> dict[str, Any]:
    """The arguments for vLLM's engine: only what the configuration sets, so vLLM's defaults stay its own."""
    kwargs: dict[str, Any] = json.loads(graph_config) if graph_config else {}
    if enforce_eager is not None:
        kwargs["enforce_eager"] = enforce_eager
    return kwargs


def name_suffix(enforce_eager: Any, graph_config: Any) -> str:
    """``-eager`` / ``-graph`` when ``enforce_eager`` is set, and ``-g`` with a short hash of
    the other settings: configurations that differ in graph mode get different names."""
    suffix = ""
    text = str(enforce_eager).lower()
    if text in ("true", "1"):
        suffix += "-eager"
    elif text in ("false", "0"):
        suffix += "-graph"
    if isinstance(graph_config, str) and graph_config:
        suffix += "-g" + hashlib.sha1(graph_config.encode()).hexdigest()[:6]
    return suffix


@dataclass(frozen=True)
class GraphFacts:
    """What the engine ran with, as its configuration reports after the build, and the
    times vLLM logged while building (None where it logged none: no compilation, no capture)."""

    compilation_mode: str = ""
    cudagraph_mode: str = ""
    compile_s: float | None = None
    graph_capture_s: float | None = None
    # vLLM's own kernels in use instead of torch's ("all", "none", or "+op"/"-op" each): eager
    # and graph engines differ here even where both report compilation mode NONE.
    custom_ops: str = ""

    def columns(self) -> dict[str, Any]:
        return {
            "compilation_mode": self.compilation_mode,
            "cudagraph_mode": self.cudagraph_mode,
            "compile_s": self.compile_s,
            "graph_capture_s": self.graph_capture_s,
            "custom_ops": self.custom_ops or None,
        }


def _mode_name(value: Any) -> str:
    return str(getattr(value, "name", value if value is not None else ""))


def reported(vllm_config: Any, log_text: str) -> GraphFacts:
    """Read from the front end's copy of the engine configuration (plain attributes, no
    device call: the modes after vLLM's platform checks) and from what this build logged;
    with several workers, the longest time, the one the build waited for."""
    compilation = getattr(vllm_config, "compilation_config", None)
    # vLLM up to 0.11 calls the mode ``level``.
    mode = getattr(compilation, "mode", None)
    mode = mode if mode is not None else getattr(compilation, "level", None)
    captures = [float(v) for v in _CAPTURE.findall(log_text)]
    compiles = [float(v) for v in _COMPILE.findall(log_text)]
    return GraphFacts(
        compilation_mode=_mode_name(mode),
        cudagraph_mode=_mode_name(getattr(compilation, "cudagraph_mode", None)),
        compile_s=max(compiles) if compiles else None,
        graph_capture_s=max(captures) if captures else None,
        custom_ops=",".join(map(str, getattr(compilation, "custom_ops", None) or ())),
    )
