"""A replay's requests in flight, and what ends them: the drain's timeout, or a rule that stops
the replay before its end (a capacity probe already over, ``lorabench.measure.probe_stop``).
Either way what still runs is aborted by cancelling its stream, as vLLM (in process or behind
its server) and the stand-in abort a request whose client goes; the engine is then left to
drop them, which the next probe waits for (``Engine.wait_idle``)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

from lorabench.targets import clock

# How often a stop rule is asked, in the replay's seconds: a stop comes at most this late, and
# each look costs the loop only the requests still undecided (``probe_stop.SloLost``).
STOP_EVERY_S = 0.05


class InFlight:
    """The requests' tasks still running, and the errors they raised: a finished request's
    task is let go, so a long trace does not hold every task, coroutine and context to its end."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()
        self.errors: list[BaseException] = []

    def add(self, task: asyncio.Task) -> None:
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(task.exception())

    async def drain(self, timeout_s: float) -> None:
        """Wait for the requests still running; abort those past the timeout (so they are
        reported unfinished rather than holding the engine), and raise the first real error."""
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()  # vLLM aborts a request whose stream is cancelled
            await asyncio.gather(*pending, return_exceptions=True)
        if self.errors:
            raise self.errors[0]


class Stop:
    """A rule that may end a replay early. ``check(records, now_s)`` is asked every
    ``every_s`` of the replay with its records so far and its time; a reason it gives ends the
    replay there, and the replay then sets ``why`` and ``at_s`` (its seconds when it stopped).
    Left blank when the replay ran to its end: a rule that fires as the replay ends anyway
    stopped nothing."""

    every_s = STOP_EVERY_S

    def __init__(self) -> None:
        self.why = ""
        self.at_s: float | None = None

    def check(self, records: Sequence[Any], now_s: float) -> str:
        return ""


async def until_stopped(
    work: Coroutine[Any, Any, None], stop: Stop | None, records: Sequence[Any], start: float, in_flight: InFlight
) -> None:
    """``work`` (a replay's sends and its drain) to its end or, with ``stop``, until its rule
    gives a reason first: then no more is sent, every request still running is aborted, as
    at the drain's end, and ``stop`` says why and when. An error of either is raised."""
    if stop is None:
        await work
        return
    sending = asyncio.ensure_future(work)
    watching = asyncio.ensure_future(_watch(stop, records, start))
    try:
        await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the replay itself was cancelled
        sending.cancel()
        watching.cancel()
        raise
    if sending.done():
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        sending.result()
        return
    why, at_s = watching.result()
    sending.cancel()
    await asyncio.gather(sending, return_exceptions=True)
    stop.why, stop.at_s = why, at_s
    await in_flight.drain(0.0)


async def _watch(stop: Stop, records: Sequence[Any], start: float) -> tuple[str, float]:
    """Asks the rule every ``stop.every_s`` until it gives a reason: that, and when."""
    while True:
        await asyncio.sleep(stop.every_s)
        now_s = clock.now() - start
        why = stop.check(records, now_s)
        if why:
            return why, now_s
