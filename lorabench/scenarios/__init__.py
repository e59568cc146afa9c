"""The scenarios: what a benchmark test can run on an engine, one module each.

The plugin, the engine and compare know scenarios only through ``SCENARIOS``; adding one
is a module here that subclasses ``Scenario`` and a line below.
"""

from __future__ import annotations

from lorabench.scenarios import canary, capacity, churn, isolation, multilora, no_lora, online, residency, working_set
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        no_lora.SCENARIO,
        multilora.SCENARIO,
        online.SCENARIO,
        residency.SCENARIO,
        working_set.SCENARIO,
        capacity.SCENARIO,
        churn.SCENARIO,
        isolation.SCENARIO,
        canary.SCENARIO,
    )
}

__all__ = ["SCENARIOS", "Context", "Outcome", "Parametrization", "Scenario"]
