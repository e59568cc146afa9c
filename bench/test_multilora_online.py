"""Online multi-LoRA: synthetic traces (Gamma arrivals, power-law adapter popularity)
replayed against vLLM's async engine, one case per trace of the config's suites."""

import pytest


@pytest.mark.scenario("online")
def test_multilora_online(lorabench, engine, online_case):
    lorabench.run_online(engine, online_case)
