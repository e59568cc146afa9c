"""Adapter isolation under prefix caching: an adapter that finds another adapter's prompt
cached must answer as it does with nothing cached (greedy-output digests)."""

import pytest


# Nothing here is timed: the canaries are greedy answers, checked, not measured.
@pytest.mark.filterwarnings("ignore:Benchmark fixture was not used")
@pytest.mark.scenario("isolation")
def test_isolation(lorabench, engine):
    lorabench.run(engine)
