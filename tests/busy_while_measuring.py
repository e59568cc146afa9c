"""A pytest plugin for the slowed side of the real A/B test (tests/test_ab.py), loaded with
``PYTEST_PLUGINS=tests.busy_while_measuring``: a busy loop beside each case while it runs,
none while its engine builds or shuts down.

The loop is a real slowdown of what the turn measures. It runs on the cores the turn was
started on (read when the plugin loads, before lorabench moves this process off the
engine worker's cores): the test pins the turn to one core, the worker's.
``scripts/ab/busy-python``'s loops run for the whole turn instead, and doubled the slowed
side's engine builds, which no verdict reads. The loop ends when this process does, killed
or not: it spins only while its parent is the process that started it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Generator

import pytest

CORES = os.sched_getaffinity(0)
# The parent's pid comes as an argument: read in the child, it could already be init's.
LOOP = "import os, sys\nwhile os.getppid() == int(sys.argv[1]): pass"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    loop = subprocess.Popen([sys.executable, "-c", LOOP, str(os.getpid())])
    os.sched_setaffinity(loop.pid, CORES)
    try:
        return (yield)
    finally:
        loop.kill()
        loop.wait()
