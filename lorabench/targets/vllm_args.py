"""The names of vLLM's engine arguments, without importing vLLM each time they are needed.

Importing ``vllm.engine.arg_utils`` takes seconds (it pulls in torch and most of vLLM),
and a config is checked against those names at every session start. The names are kept
in the cache folder under a fingerprint of the install, read without importing anything:
the interpreter, the versions of vLLM, vllm-ascend, torch and torch-npu (from the
packages' metadata, ``device.stack_versions``), and the path, size and modification time
of the ``arg_utils.py`` the import system would load. Another install, an upgrade or an
edited ``arg_utils.py`` misses the cache, and the names are read from a real import.

An entry says that this install imported once. An import that fails is never kept, so a
vLLM that does not import fails the check every time until it does; a library that goes
missing later while the install stays the same shows at the engine build instead. Where
the module would not load from a plain file (not installed, or a finder of its own),
nothing is cached and the import decides.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from lorabench.host.device import stack_versions
from lorabench.load import builtin

MODULE = "vllm.engine.arg_utils"
CLASS = "EngineArgs"
FOLDER = "vllm-engine-args"


def engine_arg_names() -> frozenset[str]:
    """vLLM's ``EngineArgs`` field names; raises what the import raises when there is no cached
    entry for this install and vLLM is missing (``ModuleNotFoundError``) or fails to import."""
    return field_names(MODULE, CLASS)


def field_names(module: str, qualname: str) -> frozenset[str]:
    """The field names of the dataclass ``module.qualname``: from the module where it is
    imported already, else from the cache where this install was read before, else from
    an import (kept in the cache for the next time)."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        return frozenset(getattr(loaded, qualname).__dataclass_fields__)
    fingerprint = _fingerprint(module)
    if fingerprint is not None:
        cached = _read(module, qualname, fingerprint)
        if cached is not None:
            return cached
    names = frozenset(getattr(importlib.import_module(module), qualname).__dataclass_fields__)
    if fingerprint is not None:
        _write(module, qualname, fingerprint, names)
    return names


def _find_spec(name: str) -> ModuleSpec | None:
    """The spec the import system would load ``name`` from, without importing its parents:
    each finder on ``sys.meta_path`` asked in turn, as ``import`` does, the parents' folders
    found the same way."""
    parent, _, _ = name.rpartition(".")
    path = None
    if parent in sys.modules:
        path = getattr(sys.modules[parent], "__path__", None)
        if path is None:
            return None
    elif parent:
        parent_spec = _find_spec(parent)
        if parent_spec is None or not parent_spec.submodule_search_locations:
            return None
        path = list(parent_spec.submodule_search_locations)
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, path) if find is not None else None
        if spec is not None:
            return spec
    return None


def _fingerprint(module: str) -> dict[str, Any] | None:
    """What the cached names are valid for; None when the module would not load from a
    plain source file (not installed, frozen, or a finder of its own): then nothing is cached."""
    spec = _find_spec(module)
    origin = spec.origin if spec is not None else None
    if not origin or not spec.has_location or not origin.endswith(".py"):
        return None
    try:
        st = os.stat(origin)
        versions = stack_versions()
    except Exception:  # noqa: BLE001 - an unreadable file or package metadata: no cache, a real import
        return None
    return {
        "python": sys.version,
        "executable": sys.executable,
        "stack": versions,
        "file": [origin, st.st_size, st.st_mtime_ns],
    }


def _entry(module: str, qualname: str, fingerprint: dict[str, Any]) -> Path:
    key = hashlib.sha256(json.dumps([module, qualname, fingerprint], sort_keys=True).encode()).hexdigest()[:16]
    return builtin.cache_dir() / FOLDER / f"{module}.{qualname}-{key}.json"


def _read(module: str, qualname: str, fingerprint: dict[str, Any]) -> frozenset[str] | None:
    try:
        data = json.loads(_entry(module, qualname, fingerprint).read_text(encoding="utf-8"))
        names = data["names"]
        if data["fingerprint"] != fingerprint or not all(isinstance(n, str) for n in names) or not names:
            return None
        return frozenset(names)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(module: str, qualname: str, fingerprint: dict[str, Any], names: frozenset[str]) -> None:
    """Written whole or not at all (a temporary file renamed); a cache that cannot be
    written costs the next session the import, nothing else."""
    path = _entry(module, qualname, fingerprint)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"fingerprint": fingerprint, "names": sorted(names)}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
