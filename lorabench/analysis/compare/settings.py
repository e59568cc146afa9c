"""The settings two sides ran with, from the config file each run kept
(``<run>.logs/config.json``, ``lorabench.results.files.CONFIG_COPY``).

Only the LoRA knobs, graph mode and prefix caching are in the case key; the rest of the
engine's arguments (``max_num_seqs``, ``max_model_len``, the KV cache's size in ``env``)
and the measurement's own (warm-up rounds, an online suite's warm-up) are not, yet they
move every latency. A comparison of two runs configured apart names each difference, so
that a change of settings is not read as a change of code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lorabench.config.read import COMMENT_PREFIX
from lorabench.results.files import CONFIG_COPY

# Where the run's files went and comments: no bearing on what was measured.
_IGNORED = ("results_dir", "output")


def _flat(value: Any, prefix: str = "") -> dict[str, str]:
    """``{"engine": {"max_num_seqs": 16}}`` -> ``{"engine.max_num_seqs": "16"}``; a list is one value."""
    if not isinstance(value, dict):
        return {prefix: json.dumps(value, sort_keys=True)}
    flat: dict[str, str] = {}
    for key, item in value.items():
        if key.startswith(COMMENT_PREFIX) or (not prefix and key in _IGNORED):
            continue
        flat.update(_flat(item, f"{prefix}.{key}" if prefix else key))
    return flat


def run_settings(path: Path) -> dict[str, str] | None:
    """The settings the run of result file ``path`` ran with, flat (``"engine.max_num_seqs":
    "16"``); None where it kept no config (a file from before lorabench kept one, or moved
    without its logs folder): unknown."""
    try:
        config = json.loads((Path(path).with_suffix(".logs") / CONFIG_COPY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _flat(config)


def changed_settings(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """``"rounds: 10 -> 3"`` for each setting two runs ran with apart (absent: ``-``)."""
    return [
        f"{key}: {before.get(key, '-')} -> {after.get(key, '-')}"
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    ]


def _side_settings(paths: Sequence[Path]) -> dict[str, set[str]] | None:
    """Each setting's values over a side's runs; None where some run's are unknown."""
    settings: dict[str, set[str]] = {}
    for path in paths:
        flat = run_settings(path)
        if flat is None:
            return None
        for key, value in flat.items():
            settings.setdefault(key, set()).add(value)
    return settings


def setting_differences(base_paths: Sequence[Path], new_paths: Sequence[Path]) -> list[str]:
    """``"engine.max_num_seqs: 16 -> 256"`` for each setting the sides ran with apart
    (absent on a side: ``-``); none where either side's settings are unknown."""
    base, new = _side_settings(base_paths), _side_settings(new_paths)
    if base is None or new is None:
        return []
    return [
        f"{key}: {' | '.join(sorted(base.get(key, {'-'})))} -> {' | '.join(sorted(new.get(key, {'-'})))}"
        for key in sorted(base.keys() | new.keys())
        if base.get(key) != new.get(key)
    ]
