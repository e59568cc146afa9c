"""What a configuration and a build are called, from the columns that key them
(``ENGINE_KEY`` in ``lorabench.results.schema``): test ids, the summary, compare and the
report all name them so."""

from __future__ import annotations

from typing import Any

from lorabench.results.graph import name_suffix


def engine_name(
    enable_lora: Any,
    max_loras: Any = None,
    max_lora_rank: Any = None,
    max_cpu_loras: Any = None,
    enforce_eager: Any = None,
    graph_config: Any = None,
    enable_prefix_caching: Any = None,
    engine_variant: Any = None,
) -> str:
    """``lora-off`` or ``loras8-rank16-cpu8``, with ``-pc`` where prefix caching is on, and
    ``-eager`` / ``-graph`` and a graph settings hash where set, and a variant build's name last
    (``-ngram``): how test ids, the summary and compare name a configuration."""
    mode = ("-pc" if _true(enable_prefix_caching) else "") + name_suffix(enforce_eager, graph_config)
    if not _true(enable_lora):
        return "lora-off" + mode
    variant = f"-{engine_variant}" if engine_variant else ""
    return f"loras{max_loras}-rank{max_lora_rank}-cpu{max_cpu_loras}{mode}{variant}"


def _true(value: Any) -> bool:
    """A flag as a row or a spec holds it: a bool, or its spelling in a CSV file."""
    return str(value).lower() in ("true", "1")


def engine_id(name: str, build: int) -> str:
    """One build of a configuration: ``loras8-rank16-cpu8-build1``."""
    return f"{name}-build{build}"
