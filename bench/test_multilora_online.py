"""Online multi-LoRA: synthetic traces (Gamma arrivals, power-law adapter popularity)
replayed in real time, one case per trace of the config's suites, on the same engine
builds as the batch cases."""

import pytest


@pytest.mark.scenario("online")
def test_multilora_online(lorabench, engine, online_case):
    lorabench.run(engine, online_case=online_case)
