"""Adapter churn: an online trace replayed while adapters outside its working set are loaded
and unloaded at the config's rate (its ``churn`` block); the rows give the operations'
latency and the TTFT of requests sent during loads against outside them."""

import pytest


@pytest.mark.scenario("churn")
def test_multilora_churn(lorabench, engine, churn_case):
    lorabench.run(engine, churn_case=churn_case)
