"""A pytest plugin for the slowed side of the real A/B test (tests/test_ab.py), loaded with
``PYTEST_PLUGINS=tests.busy_while_measuring``: a busy loop beside each case while it runs,
none while its engine builds or shuts down.

The loop is a real slowdown of what the turn measures, on the cores the turn may use (it
inherits the turn's affinity). ``scripts/ab/busy-python``'s loops run for the whole turn
instead, and doubled the slowed side's engine builds, which no verdict reads.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Generator

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        return (yield)
    finally:
        loop.kill()
        loop.wait()
