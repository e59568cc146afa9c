"""Where a run's wall time goes (issue 27): the summary's split into engine builds, measured
work, warm-ups and the harness, on the stand-in engine, whose costs the test sets, so a cost
planted in the timed batches must come out in the measured share and the warm-ups'."""

from __future__ import annotations

import re
import time

import pytest

from lorabench.measure.wallclock import BUILDS, HARNESS, MEASURED, WARMUPS, WallClock
from lorabench.targets.standin import Costs, StandIn, write_config
from tests.helpers import ROOT

SPLIT = re.compile(
    r"wall time ([\d.]+) s: engine builds ([\d.]+) s \(\d+ %\), measured ([\d.]+) s \(\d+ %\), "
    r"warm-ups ([\d.]+) s \(\d+ %\), harness ([\d.]+) s \(\d+ %\)"
)


def test_a_planted_cost_comes_out_in_the_measured_and_warm_up_shares(pytester):
    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
    step_ms, steps = 25, 8  # a round: 8 steps of 25 ms (no prefill or LoRA cost), 0.2 s
    matrix = {"workloads": ["distinct"], "batch_sizes": [2], "output_len": steps, "warmup_rounds": 1, "rounds": 2}
    config = write_config(pytester.path / "run", adapters=2, matrix=matrix)
    costs = Costs(prefill_ms_per_token=0, decode_ms_per_step=step_ms)
    result = pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", plugins=[StandIn(costs)])
    result.assert_outcomes(passed=1)
    (line,) = [line for line in result.outlines if line.startswith("wall time ")]
    wall, builds, measured, warmups, harness = map(float, SPLIT.fullmatch(line).groups())
    round_s = step_ms * steps / 1000
    # The case's 2 measured rounds and its no-LoRA baseline's 2; one warm-up round of each.
    assert 4 * round_s <= measured <= 4 * round_s + 0.3, line
    assert 2 * round_s <= warmups <= 2 * round_s + 0.2, line
    # The build's digests (3 greedy answers of 8 steps before the first case) are the harness's.
    assert harness >= 3 * 8 * step_ms / 1000, line
    assert wall == pytest.approx(builds + measured + warmups + harness, abs=0.25), line


def test_the_split_sums_to_the_wall_time_and_says_each_share(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("lorabench.measure.wallclock.time.perf_counter", lambda: now[0])
    clock = WallClock(started=now[0])
    clock.add(BUILDS, 112.0)
    clock.add(MEASURED, 180.0)
    with clock.timing(WARMUPS):
        now[0] += 90.0
    now[0] += 446.0 - 90.0
    assert clock.split() == {BUILDS: 112.0, MEASURED: 180.0, WARMUPS: 90.0, HARNESS: 64.0}
    assert clock.line() == (
        "wall time 446.0 s: engine builds 112.0 s (25 %), measured 180.0 s (40 %), warm-ups 90.0 s (20 %), "
        "harness 64.0 s (14 %)"
    )


class _Pedantic:
    """pytest-benchmark's pedantic mode as far as Context.time uses it: warm-ups, then rounds."""

    disabled = False

    def pedantic(self, target, rounds, warmup_rounds, iterations):
        for _ in range(warmup_rounds + rounds):
            target()


def test_a_warm_up_that_fails_is_counted_a_warm_up_not_measured():
    from lorabench.scenarios.base import Context

    calls = []

    def work():
        calls.append(1)
        time.sleep(0.02)
        if len(calls) == 2:
            raise RuntimeError("the second warm-up fails")

    ctx = Context(None, _Pedantic(), None, None, clock=WallClock())
    with pytest.raises(RuntimeError):
        ctx.time(work, rounds=1, warmup_rounds=3)
    assert ctx.clock.spent[MEASURED] == 0.0, "no measured round ran"
    assert ctx.clock.spent[WARMUPS] >= 0.04
