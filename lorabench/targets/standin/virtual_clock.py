"""An event loop on a virtual clock, for tests of logic on the stand-in.

Its ``time()`` is a counter that moves only when the loop has nothing ready to run and no
I/O ready: then it jumps to the next timer's time instead of waiting for it. Every sleep
takes no real time and ends exactly when due, so a test of a search, a timeline or a churn
replays seconds of traffic in milliseconds, and the same run gives the same times under any
load. Only what the loop itself schedules moves the clock: a real socket is not waited for
(``select`` never blocks while a timer is pending), so tests that need one stay on the wall
clock (the ``realtime`` marker). A thread the loop awaits (``run_in_executor``) is: while
one runs, the loop waits in real time up to its next timer, as a real loop does, and only
then jumps; otherwise a timeout around the thread's call fired at once.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from typing import Any

# Where a virtual clock starts: far enough from 0 that no timestamp reads as "unset".
START_S = 1000.0


class _Selector(selectors.DefaultSelector):
    """Polls without waiting; when nothing is ready and the loop would wait for a timer, its
    loop's clock jumps to that timer instead."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualClockLoop | None = None

    def select(self, timeout: float | None = None) -> list[Any]:
        # A thread the loop awaits (run_in_executor) ends in real time: wait for it as a real
        # loop would, up to the next timer, before the clock may jump past it.
        threads = self.loop is not None and self.loop.threads
        events = super().select(timeout if threads else 0 if timeout is not None else None)
        if not events and timeout and self.loop is not None:
            self.loop.advance_to_next_timer()
        return events


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose ``time()`` is virtual (see the module's docstring)."""

    # What a caller reads to know that timers fire exactly on time here (lorabench.measure.replay).
    virtual = True

    def __init__(self) -> None:
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self
        self._now = START_S
        self.threads = 0  # calls run_in_executor started that have not ended

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> asyncio.Future:
        """As asyncio's, counted while it runs: the clock does not jump while a thread works."""
        future = super().run_in_executor(executor, func, *args)
        self.threads += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: asyncio.Future) -> None:
        self.threads -= 1

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds``, as a blocking call that long would."""
        self._now += max(0.0, seconds)

    def advance_to_next_timer(self) -> None:
        """To the earliest pending timer's time, exactly: the loop asked to wait for it."""
        # asyncio's own heap of timer handles (BaseEventLoop._scheduled), cancelled ones skipped.
        pending = [h.when() for h in self._scheduled if not h.cancelled()]
        if pending:
            self._now = max(self._now, min(pending))


def block(seconds: float) -> None:
    """Block the running loop for ``seconds``: on a virtual clock, the clock moves on by that
    much instead (a blocked loop is what is simulated, not real time spent)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if isinstance(loop, VirtualClockLoop):
        loop.advance(seconds)
    else:
        time.sleep(seconds)
