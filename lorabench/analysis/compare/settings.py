"""The settings a run ran with, from the config file it kept (``<run>.logs/config.json``,
``lorabench.results.files.CONFIG_COPY``): ``compare`` names where two sides differ, the
history where the runs around a change point do.

Only the LoRA knobs, graph mode and prefix caching are in the case key; the rest of the
engine's arguments (``max_num_seqs``, ``max_model_len``, the KV cache's size in ``env``)
and the measurement's own (warm-up rounds, an online suite's warm-up) are not, yet they
move every latency. A comparison of runs configured apart names each difference, so that
a change of settings is not read as a change of code. What is read is the config file:
a command-line option (``--bench-builds``) or the shell's environment is not in it.
Comments are left out, and credentials hidden as a bug bundle hides them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lorabench.config.read import strip_comments
from lorabench.host.redact import redact_tree
from lorabench.results.files import CONFIG_COPY, CONFIG_RUN

# Where the run's files went, and the history gate's own thresholds: no bearing on what was measured.
_IGNORED = ("results_dir", "output", "history")
# Config sections of one scenario each: another scenario's section moves none of this one's cases.
SCENARIO_SECTIONS = ("online", "residency", "working_set", "capacity", "churn")


def _flat(value: Any, prefix: str = "") -> dict[str, str]:
    """``{"engine": {"max_num_seqs": 16}}`` -> ``{"engine.max_num_seqs": "16"}``; a list is one value."""
    if not isinstance(value, dict):
        return {prefix: json.dumps(value, sort_keys=True)}
    flat: dict[str, str] = {}
    for key, item in value.items():
        if not prefix and key in _IGNORED:
            continue
        flat.update(_flat(item, f"{prefix}.{key}" if prefix else key))
    return flat


def run_settings(path: Path, run_id: str | None = None, *, named_only: bool = False) -> dict[str, str] | None:
    """The settings the run of result file ``path`` ran with, flat (``"engine.max_num_seqs":
    "16"``); None where unknown: no config kept (a file from before lorabench kept one, or
    moved without its logs folder), or, given ``run_id``, a config kept for another run
    (a later run into the same logs folder), or, with ``named_only``, kept by a lorabench
    that did not name its run (a file of several runs: whose it is cannot be told)."""
    logs = Path(path).with_suffix(".logs")
    try:
        config = json.loads((logs / CONFIG_COPY).read_text(encoding="utf-8"))
        kept_for = (logs / CONFIG_RUN).read_text(encoding="utf-8").strip() if (logs / CONFIG_RUN).exists() else None
    except (OSError, ValueError):
        return None
    if (run_id is not None and kept_for is not None and kept_for != run_id) or (named_only and kept_for is None):
        return None
    return _flat(redact_tree(strip_comments(config)))


# Lists of the cases a config runs: a case's own entry is in its key (its max_loras, batch
# size, working set), so a list that grew names no change of that case.
CASE_LISTS = frozenset(
    {
        "engine.max_loras",
        "engine.max_lora_rank",
        "engine.max_cpu_loras",
        "engine.enforce_eager",
        "engine.enable_prefix_caching",
        "matrix.batch_sizes",
        "matrix.workloads",
        "working_set.sizes",
        "churn.rate",
    }
)


def for_case(settings: dict[str, str], scenario: str) -> dict[str, str]:
    """The settings that can move a case of ``scenario``: not another scenario's section,
    nor a list of the cases the config runs (``CASE_LISTS``)."""
    others = set(SCENARIO_SECTIONS) - {scenario}
    return {key: value for key, value in settings.items() if key not in CASE_LISTS and key.split(".")[0] not in others}


def changed_settings(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """``"matrix.rounds: 10 -> 3"`` for each setting two runs ran with apart (absent: ``-``)."""
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
