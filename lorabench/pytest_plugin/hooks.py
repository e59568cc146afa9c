"""lorabench's own pytest hook: what builds the engines a benchmark session runs on."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec(firstresult=True)
def pytest_lorabench_backend(config: pytest.Config) -> Any:
    """Return what builds this session's engines, or None for in-process vLLM.

    The object has ``platform()`` (a ``lorabench.host.device.Platform``),
    ``engine(config, spec, device_type, log_path)`` (an ``Engine`` to enter), and
    ``checks_vllm_args`` (whether engine arguments are checked against vLLM's own).
    ``lorabench.targets.standin.StandIn`` is one: a stand-in engine whose costs a test sets.
    """
