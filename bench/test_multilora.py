"""Multi-LoRA batches: every request names an adapter, chosen by the workload
(distinct, uniform or identical adapters across the batch)."""

import pytest


@pytest.mark.scenario("multilora")
def test_multilora(lorabench, engine, workload, batch_size):
    lorabench.run(engine, workload=workload, batch_size=batch_size)
