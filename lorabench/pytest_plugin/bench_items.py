"""Which collected tests are benchmark cases, and what the plugin reads off each: a case
uses the ``engine`` fixture, is marked with its scenario and may be marked with the
device it needs."""

from __future__ import annotations

import pytest

from lorabench.host.device import DEVICE_TYPES, Platform
from lorabench.scenarios import SCENARIOS, Scenario

ENGINE_FIXTURE = "engine"


def scenario_of(item: pytest.Item, problems: list[str] | None = None) -> Scenario | None:
    """The scenario ``item`` is marked with; ``None``, and a line in ``problems``, if none is."""
    marker = item.get_closest_marker("scenario")
    name = marker.args[0] if marker and marker.args else None
    if name not in SCENARIOS:
        if problems is not None:
            problems.append(
                f"{item.nodeid}: uses the '{ENGINE_FIXTURE}' fixture, so it needs "
                f"@pytest.mark.scenario(NAME) with NAME one of {', '.join(SCENARIOS)} (got {name!r})"
            )
        return None
    return SCENARIOS[name]


def device_skip(item: pytest.Item, platform: Platform) -> str | None:
    """Why ``item`` cannot run on ``platform``: a device mark for another platform."""
    for device in DEVICE_TYPES:
        if item.get_closest_marker(device) and platform.device_type != device:
            note = f"; {platform.note}" if platform.note else ""
            return f"needs vLLM's {device} platform; this host runs {platform.device_type}{note}"
    return None
