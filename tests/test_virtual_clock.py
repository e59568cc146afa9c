"""The stand-in on a virtual clock (lorabench.targets.standin.virtual_clock): a replay takes no real
time, the same replay gives the same times to the nanosecond, and a planted cost comes out
exactly, where the wall clock adds up to a millisecond of the loop's rounding and any stall
of a busy host."""

from __future__ import annotations

import asyncio
import time

import pytest

from lorabench.config import engine_specs, read_config_file, resolve_config
from lorabench.load.traces.synthetic import TraceRequest
from lorabench.measure import replay
from lorabench.targets.standin import Costs, StandInEngine, write_config
from lorabench.targets.standin.virtual_clock import START_S, VirtualClockLoop, block

# Ten requests over two adapters, 20 ms apart: later ones arrive while earlier ones decode.
TRACE = [TraceRequest(0.02 * i, f"a{i % 2}", 20 + i, 3 + i % 3) for i in range(10)]


def replayed(tmp_path, costs: Costs, trace=TRACE, virtual_clock: bool = True) -> list[replay.ReplayedRequest]:
    path = write_config(tmp_path, adapters=2)
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    spec = engine_specs(config.file, with_lora_off=False)[0]
    adapters = {a.name: a for a in config.adapters}
    with StandInEngine(config, spec, "cpu", None, costs=costs, weights={}, virtual_clock=virtual_clock) as engine:
        return engine.run(replay.replay(engine, trace, adapters))


def timings(records: list[replay.ReplayedRequest]) -> list[tuple]:
    return [(r.sent_s, tuple(r.token_times), r.queue_ms, r.finished) for r in records]


@pytest.mark.timeout(60)
def test_two_replays_on_the_virtual_clock_give_identical_per_request_timings(tmp_path):
    costs = Costs(prefill_ms_per_token=0.1, decode_ms_per_step=7.0, lora_ms_per_adapter=1.5, disk_load_ms=30)
    started = time.perf_counter()
    first, second = replayed(tmp_path / "1", costs), replayed(tmp_path / "2", costs)
    assert timings(first) == timings(second)
    assert all(r.finished for r in first) and first[-1].token_times[-1] > 0.2, "the trace's span, in virtual time"
    assert time.perf_counter() - started < first[-1].token_times[-1] * 2, "less real time than the traffic spans"


@pytest.mark.timeout(60)
def test_a_planted_cost_comes_out_exactly_on_the_virtual_clock(tmp_path):
    """One request alone: its first token ends the step that prefills it, each later one a
    decode step; sent exactly on schedule, however long the sender blocked before."""
    costs = Costs(prefill_ms_per_token=0.5, decode_ms_per_step=7.0, send_block_ms=3.0)
    (record,) = replayed(tmp_path, costs, [TraceRequest(0.05, "a0", 40, 5)])
    assert record.send_lag_ms == pytest.approx(0.0, abs=1e-9)
    assert record.ttft_ms == pytest.approx(3.0 + 40 * 0.5 + 7.0, abs=1e-9), "the block, then one step"
    assert record.tpot_ms == pytest.approx(7.0, abs=1e-9)
    assert record.queue_ms == pytest.approx(0.0, abs=1e-9)


def test_the_clock_moves_only_to_the_next_timer_and_by_a_blocking_call():
    loop = VirtualClockLoop()
    seen: list[float] = []

    async def main() -> None:
        await asyncio.sleep(2.5)
        seen.append(loop.time())
        block(0.25)  # the loop blocked: its clock moves on, no real time passes
        seen.append(loop.time())
        await asyncio.gather(asyncio.sleep(1.0), asyncio.sleep(0.5))
        seen.append(loop.time())

    started = time.perf_counter()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert seen == [START_S + 2.5, START_S + 2.75, START_S + 3.75]
    assert time.perf_counter() - started < 1.0


@pytest.mark.timeout(30)
def test_a_thread_the_loop_awaits_is_waited_for_not_timed_out_in_no_time():
    """``run_in_executor`` under a timeout: the clock jumped to the timeout while the thread
    still ran, so a 0.2 s call timed out at 5 virtual seconds after 2 ms of real time. The
    loop now waits for the thread (in real time, its timers not moved past) before jumping."""
    loop = VirtualClockLoop()

    async def main() -> str:
        return await asyncio.wait_for(loop.run_in_executor(None, lambda: (time.sleep(0.2), "done")[1]), timeout=5)

    try:
        assert loop.run_until_complete(main()) == "done"
        assert loop.time() < START_S + 5
    finally:
        loop.close()
