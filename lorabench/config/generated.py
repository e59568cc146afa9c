"""A config's generated adapters (``adapters.generate``), checked before any is written: a
rank above ``engine.max_lora_rank`` found only by reading the written adapters back had
already cost the disk (ranks [8, 100000] wrote 11 GB before the config was refused), and a
module the model does not have failed inside the generator."""

from __future__ import annotations

import json
from pathlib import Path

from lorabench.config.expand import as_list
from lorabench.config.schema import ConfigFile, GeneratedAdapters
from lorabench.load.adapters import module_shapes


def check_generation(path: Path, parsed: ConfigFile, model: Path) -> list[str]:
    """The problems of ``adapters.generate`` for ``model``; none for adapters from a file."""
    if not isinstance(parsed.adapters, GeneratedAdapters):
        return []
    spec, problems = parsed.adapters.generate, []
    limit = min(as_list(parsed.engine.max_lora_rank))  # every configuration's
    over = [rank for rank in spec.ranks if rank > limit]
    if over:
        problems.append(
            f"{path}: field 'adapters.generate.ranks' has bad value {over[0]}: it is above "
            f"engine.max_lora_rank={limit}: lower the rank to {limit} or less, or raise max_lora_rank"
        )
    base = model / "config.json"
    try:
        shape = json.loads(base.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [*problems, f"{path}: field 'model': {base} does not read as JSON ({exc}): give a model folder"]
    try:
        module_shapes(shape, spec.target_modules)
    except ValueError as exc:  # a module the generator does not know
        problems.append(f"{path}: field 'adapters.generate.target_modules': {exc}")
    except (KeyError, TypeError, ZeroDivisionError, AttributeError) as exc:
        problems.append(
            f"{path}: field 'adapters.generate': {base} does not give a Llama-like decoder's shape "
            f"({type(exc).__name__}: {exc}), which generated adapters are shaped by: list adapters from a file instead"
        )
    return problems
