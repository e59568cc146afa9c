"""LoRA correctness canaries (docs/canaries.md): one case a class of real multi-LoRA bug, each a
few greedy answers judged against a reference of the same session; the classes a CPU engine
cannot run are named and skipped with the reason. Selected by ``-k canary``, not part of
``-k multilora``: the base_changed check needs the lora-off build, which the default run does
not build."""

import pytest


# Nothing here is timed: the canaries are greedy answers, checked, not measured.
@pytest.mark.filterwarnings("ignore:Benchmark fixture was not used")
@pytest.mark.scenario("canary")
def test_canary(lorabench, engine, canary):
    lorabench.run(engine, canary=canary)
