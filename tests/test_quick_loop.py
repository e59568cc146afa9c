"""`pytest` alone runs the quick loop on 2 workers; every other command line as given."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from tests.helpers import ROOT


def _root_conftest():
    spec = importlib.util.spec_from_file_location("lorabench_root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _workers(source=pytest.Config.ArgsSource.TESTPATHS, markexpr="not engine", worker=False, usepdb=False, given=None):
    """The number of workers the root conftest gives a command line (``given``: its -n)."""
    options = SimpleNamespace(markexpr=markexpr, numprocesses=given, usepdb=usepdb)
    config = SimpleNamespace(args_source=source, option=options, pluginmanager=SimpleNamespace(hasplugin=bool))
    if worker:
        config.workerinput = {}
    _root_conftest().pytest_cmdline_main(config)
    return options.numprocesses


def test_pytest_alone_runs_on_two_workers_and_nothing_else_does():
    assert _workers() == 2
    assert _workers(source=pytest.Config.ArgsSource.ARGS) is None, "a file named: this process"
    assert _workers(markexpr="engine") is None, "real engines: one at a time"
    assert _workers(usepdb=True) is None
    assert _workers(worker=True) is None, "a worker's own empty command line starts no workers of its own"
    assert _workers(given=0) == 0, "-n 0 runs it serially"
