"""When the CPU tier can be measured (pure logic; the tiers on a real engine are in
test_scenarios.py)."""

from types import SimpleNamespace

import pytest

from lorabench.scenarios.residency import _check_cpu_tier


def engine(max_loras, max_cpu_loras):
    spec = SimpleNamespace(max_loras=max_loras, max_cpu_loras=max_cpu_loras)
    return SimpleNamespace(spec=spec, id=f"loras{max_loras}-cpu{max_cpu_loras}")


def test_the_cpu_tier_runs_when_the_cache_outlives_the_slots_and_enough_adapters_evict():
    _check_cpu_tier(engine(2, 4), adapters=3)


@pytest.mark.parametrize(
    ("max_loras", "max_cpu_loras", "adapters", "reason"),
    [(2, 2, 8, "loras2-cpu2 has max_cpu_loras 2"), (2, 4, 2, "and 3 adapters (loras2-cpu4 has")],
)
def test_the_cpu_tier_skips_with_the_reason(max_loras, max_cpu_loras, adapters, reason):
    with pytest.raises(pytest.skip.Exception, match=reason.replace("(", r"\(")):
        _check_cpu_tier(engine(max_loras, max_cpu_loras), adapters=adapters)
