"""vLLM's engine argument names, kept in the cache per install: read from a real import
once, then without importing vLLM until the install changes; a failed import is never kept.

A fake package on ``sys.path`` stands for vLLM, in a cache folder of the test's own.
"""

from __future__ import annotations

import itertools
import json
import os
import sys

import pytest

from lorabench.targets import vllm_args
from tests.test_config import break_import, problems_of

ARG_UTILS = """\
from dataclasses import dataclass


@dataclass
class EngineArgs:
{fields}
"""
names = itertools.count()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A package ``fakevllmN.engine.arg_utils`` (a name of its own each test) with an
    ``EngineArgs`` dataclass; returns its module name and a writer of its fields."""
    package = f"fakevllm{next(names)}"
    folder = tmp_path / "site" / package / "engine"
    folder.mkdir(parents=True)
    for init in (folder.parent / "__init__.py", folder / "__init__.py"):
        init.write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("LORABENCH_CACHE_DIR", str(tmp_path / "cache"))
    module = f"{package}.engine.arg_utils"
    mtime = iter(range(1_000_000_000, 2_000_000_000, 10))

    def write(*fields: str, body: str | None = None) -> None:
        path = folder / "arg_utils.py"
        path.write_text(body or ARG_UTILS.format(fields="\n".join(f"    {f}: int = 0" for f in fields)))
        os.utime(path, (next(mtime), next(mtime)))  # each version its own time, however fast the test

    yield module, write
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


def forget(module: str) -> None:
    """As a new session would start: nothing of the package imported."""
    package = module.split(".")[0]
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


def entries(tmp_path):
    return sorted((tmp_path / "cache" / vllm_args.FOLDER).glob("*.json"))


def test_the_names_are_read_once_then_from_the_cache_until_the_file_changes(fake, tmp_path):
    module, write = fake
    write("model", "max_num_seqs")
    assert vllm_args.field_names(module, "EngineArgs") == {"model", "max_num_seqs"}
    assert module in sys.modules and len(entries(tmp_path)) == 1
    forget(module)
    assert vllm_args.field_names(module, "EngineArgs") == {"model", "max_num_seqs"}
    assert module not in sys.modules, "a second session reads the names without the import"
    write("model", "max_num_seqs", "max_loras")  # an upgrade, or an edited arg_utils.py
    assert vllm_args.field_names(module, "EngineArgs") == {"model", "max_num_seqs", "max_loras"}
    assert module in sys.modules and len(entries(tmp_path)) == 2


def test_an_install_that_fails_to_import_is_never_cached(fake, tmp_path):
    module, write = fake
    write(body="raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    for _ in range(2):
        with pytest.raises(ImportError, match="libcudart"):
            vllm_args.field_names(module, "EngineArgs")
        forget(module)
    assert not entries(tmp_path)


def test_a_damaged_or_unwritable_cache_costs_an_import_nothing_else(fake, tmp_path, monkeypatch):
    module, write = fake
    write("model")
    vllm_args.field_names(module, "EngineArgs")
    (entry,) = entries(tmp_path)
    for damaged in ("{", json.dumps({"fingerprint": {}, "names": ["model"]}), json.dumps({"names": [1]})):
        entry.write_text(damaged)
        forget(module)
        assert vllm_args.field_names(module, "EngineArgs") == {"model"}
        assert module in sys.modules, "a damaged entry is not believed"
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("LORABENCH_CACHE_DIR", str(tmp_path / "not-a-folder"))
    forget(module)
    assert vllm_args.field_names(module, "EngineArgs") == {"model"}


def test_vllms_names_come_from_the_cache_and_a_broken_import_is_still_said(tiny_config, tmp_path, monkeypatch):
    """The cache stands in for vLLM's own import: an entry (written here, with one name
    vLLM does not have) is what the check reads. An import that fails is still reported,
    cache or not: the import system's own finders say where the module would come from,
    and one that is not a plain file (here, the failing finder's) is never looked up."""
    monkeypatch.setenv("LORABENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delitem(sys.modules, vllm_args.MODULE, raising=False)
    fingerprint = vllm_args._fingerprint(vllm_args.MODULE)
    assert fingerprint is not None, "vLLM's arg_utils.py is found without importing it"
    vllm_args._write(vllm_args.MODULE, vllm_args.CLASS, fingerprint, frozenset({"max_num_seqs", "only_in_cache"}))
    assert vllm_args.engine_arg_names() == {"max_num_seqs", "only_in_cache"}
    problems = problems_of(tiny_config(engine={"only_in_cache": 1}))
    assert "unknown key 'engine.max_model_len'" in problems and "only_in_cache" not in problems

    # vLLM's own package broken (as its _C extension fails), not arg_utils alone: that would
    # import the real vLLM above it first, seconds of torch for nothing.
    break_import(monkeypatch, "vllm", ImportError("libcudart.so.12: cannot open shared object file"))
    assert "vLLM is installed but does not import (ImportError: libcudart.so.12" in problems_of(tiny_config())
