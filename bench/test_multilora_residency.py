"""Adapter residency: TTFT and prefill of requests whose adapter is in a device slot, in
the CPU cache only, or on disk, on every LoRA engine."""

import pytest


@pytest.mark.scenario("residency")
def test_multilora_residency(lorabench, engine, tier):
    lorabench.run(engine, tier=tier)
