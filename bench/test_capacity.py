"""Capacity: for each trace shape of the config's capacity block, the highest request rate
each LoRA configuration serves within its SLOs, found by probing. Long: not part of
``-k multilora``; run it with ``pytest bench -k capacity``."""

import pytest


@pytest.mark.scenario("capacity")
def test_capacity(lorabench, engine, capacity_case):
    lorabench.run(engine, capacity_case=capacity_case)
