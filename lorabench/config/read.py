"""Read a configuration file and report every problem in it readably, at once.

pydantic's errors name union members and nested paths; here each becomes one line that
names the file, the field, the bad value and what to do, with a suggestion for a
misspelt key. Keys starting with ``//`` are comments.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from lorabench.config.expand import engine_specs
from lorabench.config.schema import RESERVED_ENGINE_KEYS, ConfigFile

COMMENT_PREFIX = "//"


class ConfigError(Exception):
    """A configuration that cannot be run; the message lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def strip_comments(node: Any) -> Any:
    """Drop keys starting with ``//``: JSON has no comments, these stand in for them."""
    if isinstance(node, dict):
        return {k: strip_comments(v) for k, v in node.items() if not k.startswith(COMMENT_PREFIX)}
    if isinstance(node, list):
        return [strip_comments(v) for v in node]
    return node


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out == "env":  # a variable's name, whatever its case
            out += f".{part}"
        elif not part.isidentifier() or part in _UNION_TAGS or part[0].isupper():
            continue  # pydantic's name for a union member, not a field
        else:
            out += f".{part}" if out else part
    return out


_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict"}


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The valid keys of the object that holds ``loc``'s last part."""
    model: Any = ConfigFile
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            continue
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), model)
    return list(getattr(model, "model_fields", {}))


def _meant(error: dict[str, Any]) -> str | None:
    """The field an unknown key is closest to (its path), or None."""
    loc = tuple(error["loc"])
    close = difflib.get_close_matches(str(loc[-1]), _fields_at(loc), n=1) if error["type"] == "extra_forbidden" else []
    return _loc((*loc[:-1], close[0])) if close else None


def _describe(error: dict[str, Any], file: Path) -> str:
    loc = tuple(error["loc"])
    field = _loc(loc)
    if error["type"] == "extra_forbidden":
        key = loc[-1]
        close = difflib.get_close_matches(str(key), _fields_at(loc), n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(_fields_at(loc))}"
        return f"{file}: unknown key '{field}': {hint} (or prefix it with '//' to keep it as a comment)"
    if error["type"] == "missing":
        return f"{file}: missing required field '{field}': add it (see config/common.json for an example)"
    # A validator's own ValueError reads as its message, without pydantic's "Value error, ".
    msg = error["msg"].removeprefix("Value error, ")
    return f"{file}: field '{field}' has bad value {error.get('input')!r}: {msg}"


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError([f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"]) from None
    except UnicodeDecodeError as exc:  # a file saved as UTF-16 by an editor, or not text at all
        raise ConfigError([f"{path}: not UTF-8 text (byte {exc.start}): save it as UTF-8 JSON"]) from None


def read_config_file(path: Path) -> ConfigFile:
    """Parse and schema-check one config file; no other file is touched."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{path}: config file not found: pass an existing file with --bench-config"])
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ConfigError([f"{path}: the top level must be a JSON object, got {type(raw).__name__}"])
    try:
        # Strict, as JSON: true is not the number 1, nor "4" the number 4 (lax pydantic took
        # both), while a JSON array still fills a tuple and a string a path.
        parsed = ConfigFile.model_validate_json(json.dumps(strip_comments(raw)), strict=True)
    except ValidationError as exc:
        # A value that matches no member of a union is reported once per member; keep the first.
        first = {_loc(tuple(e["loc"])): e for e in reversed(exc.errors())}
        # ...and a list with one bad item is reported at the item, not at the list.
        deepest = [f for f in first if not any(g.startswith((f + "[", f + ".")) for g in first)]
        errors = [first[f] for f in reversed(deepest)]
        # A misspelt required key is one problem, its "did you mean", not also a missing field.
        meant = {_meant(e) for e in errors}
        problems = [
            _describe(e, path) for e in errors if not (e["type"] == "missing" and _loc(tuple(e["loc"])) in meant)
        ]
        raise ConfigError(problems) from None
    problems = _check_engine_args(parsed, path)
    if problems:
        raise ConfigError(problems)
    return parsed


def _finite(value: Any) -> bool:
    """No Infinity or NaN anywhere in an engine argument, its objects and lists included."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


# vLLM's arguments that lorabench reads itself, each a count: "256" failed inside lorabench.
COUNTS_READ = ("max_model_len", "max_num_seqs", "tensor_parallel_size", "pipeline_parallel_size")


def _check_engine_args(parsed: ConfigFile, path: Path) -> list[str]:
    problems = []
    extra = parsed.engine.model_extra or {}
    for key, why in RESERVED_ENGINE_KEYS.items():
        if key in extra:
            problems.append(f"{path}: field 'engine.{key}' cannot be set here: {why}")
    for key in COUNTS_READ:
        value = extra.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            problems.append(f"{path}: field 'engine.{key}' has bad value {value!r}: give a whole number, 1 or more")
    if not isinstance(extra.get("worker_extension_cls", ""), str):
        value = extra["worker_extension_cls"]
        problems.append(
            f"{path}: field 'engine.worker_extension_cls' has bad value {value!r}: give a class's dotted path"
        )
    problems += [
        f"{path}: field 'engine.{key}' has bad value {value!r}: give a finite number"
        for key, value in parsed.engine.model_dump().items()
        if not _finite(value)
    ]
    for spec in engine_specs(parsed, with_lora_off=False):
        if spec.max_cpu_loras < spec.max_loras:
            problems.append(
                f"{path}: field 'engine.max_cpu_loras' has bad value {spec.max_cpu_loras}: it is below "
                f"max_loras={spec.max_loras}; vLLM needs max_cpu_loras >= max_loras"
            )
    return problems


def check_against_vllm(parsed: ConfigFile, path: Path, engine_args: Callable[[], frozenset[str]]) -> list[str]:
    """Catch typos in engine arguments by comparing them with vLLM's own EngineArgs.

    Without vLLM there is nothing to compare with, and the engine build says what to
    install. A vLLM that is installed but fails to import (a missing library, a torch of
    another build) would fail every engine build after the session started: say so now.
    The names are kept in the cache for this install once it has imported
    (``lorabench.targets.vllm_args``): the import takes seconds.
    """
    try:
        known = engine_args()
    except Exception as exc:  # noqa: BLE001 - whatever a broken install raises is reported
        if isinstance(exc, ModuleNotFoundError) and exc.name == "vllm":
            return []
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return [
            f"{path}: engine arguments cannot be checked: vLLM is installed but does not import ({reason}): "
            "run python -c 'import vllm' to see why"
        ]
    problems = []
    for key in parsed.engine.model_extra or {}:
        if key not in known and key not in RESERVED_ENGINE_KEYS:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean '{close[0]}'?" if close else "see vllm.EngineArgs for the valid names"
            problems.append(f"{path}: unknown key 'engine.{key}' (not a vllm.LLM argument): {hint}")
    return problems
