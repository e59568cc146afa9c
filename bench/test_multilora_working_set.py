"""Working sets: requests cycling through W adapters, W from below max_loras to above
max_cpu_loras, so the cliffs in throughput and TTFT show."""

import pytest


@pytest.mark.scenario("working_set")
def test_multilora_working_set(lorabench, engine, working_set):
    lorabench.run(engine, working_set=working_set)
