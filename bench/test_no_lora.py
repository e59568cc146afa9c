"""Baseline: the same batches with no adapter, on an engine without LoRA and on every
LoRA-enabled engine, so the cost of merely enabling LoRA shows."""

import pytest


@pytest.mark.scenario("no_lora")
def test_no_lora(lorabench, engine, batch_size):
    lorabench.run(engine, batch_size=batch_size)
