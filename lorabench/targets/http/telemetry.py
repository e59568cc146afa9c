"""The online timeline over HTTP: the server's ``/metrics`` scraped while a replay runs, into
the records an in-process replay's ``lorabench.targets.timeline.Recorder`` writes, so the online and
capacity rows' timeline columns and the report's timeline figures fill over HTTP too.

A client sees the server's gauges only when it asks, so a record is one scrape, not one
engine step: its state (KV cache in use, requests running and waiting, adapters running from
``vllm:lora_requests_info`` as ``ServerState.running_adapters`` bounds them) is the gauges' at
that moment, adapters waiting are those this client's requests await a first token for, and
its counts (``steps``, preemptions, prompt and generated
tokens) are the counters' increase since the previous scrape (since ``start`` for the
first). What happened between two scrapes and did not last till one (a short burst of
waiting requests) is missed: ``PERIOD_S`` is 0.25 s.

Scraping runs on the replay's event loop; only the lines lorabench reads are parsed (a vLLM
server's exposition is tens of kilobytes), so a scrape holds the loop for well under a
millisecond of parsing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from lorabench.load.adapters import Adapter
from lorabench.results.records import TimelineRecord
from lorabench.targets.clock import now
from lorabench.targets.http.client import Client
from lorabench.targets.http.metrics import COUNTERS, ServerState, server_state
from lorabench.targets.timeline import OFF, recording_on

PERIOD_S = 0.25
GAUGES = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:lora_requests_info",
    *COUNTERS,
)
NO_GAUGES = "the server's /metrics has no vllm:num_requests_running; no timeline recorded"
NO_METRICS = "the server's /metrics did not answer; no timeline recorded"


async def scrape(client: Client) -> ServerState:
    """The server's state from one scrape of ``/metrics``, all of it parsed; empty where the
    server does not answer."""
    status, text = await client.get("/metrics")
    return server_state(text) if status == 200 else ServerState()


async def requests_in_server(client: Client) -> int | None:
    """The requests the server's ``/metrics`` counts running or waiting; None where it exports
    neither gauge (or does not answer)."""
    state = await scrape(client)
    if state.running is None and state.waiting is None:
        return None
    return (state.running or 0) + (state.waiting or 0)


def read(text: str) -> ServerState:
    """The gauges and counters a timeline needs, from one scrape; other lines are skipped unparsed."""
    return server_state("\n".join(line for line in text.splitlines() if line.startswith(GAUGES)))


class Awaiting:
    """This client's requests sent and not yet given an output, by adapter: which adapters wait
    (``vllm:lora_requests_info`` cannot say, see ``lorabench.targets.http.metrics``)."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()

    def adapters(self) -> int:
        """The distinct adapters with a request awaiting its first output."""
        return sum(1 for n in self.requests.values() if n)

    async def track(self, adapter: Adapter | None, outputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """``outputs`` of a request for ``adapter`` (an ``Adapter``, or None for the base
        model), counted from the send until the first output or the end."""
        name = adapter.name if adapter is not None else None
        if name is not None:
            self.requests[name] += 1
        try:
            async for output in outputs:
                if name is not None:
                    self.requests[name] -= 1
                    name = None
                yield output
        finally:
            if name is not None:
                self.requests[name] -= 1


class Scraper:
    """An HTTP engine's timeline, with the ``Recorder``'s interface that replays use: ``start``
    and ``stop`` around a replay (on its clock), ``rows``, and ``why_none``."""

    # A record's counts are those since the previous scrape, up to its t_s (a Recorder's: from its t_s on).
    counts_until_t = True

    def __init__(
        self,
        client: Callable[[], Client | None],
        awaiting: Callable[[], int],
        clock: Callable[[], float] = now,
    ) -> None:
        self.client, self.awaiting, self.clock = client, awaiting, clock
        self.why_none: str | None = None
        self.rows: list[TimelineRecord] = []
        self._t0: float | None = None
        self._task: asyncio.Task | None = None
        self._before: ServerState | None = None  # the last scrape's counters

    @property
    def recording(self) -> bool:
        return self._t0 is not None

    def start(self, t0: float) -> None:
        """Scrape from now on, on the running loop, times in seconds since ``t0``; nothing
        when recording is off (``LORABENCH_TIMELINE``), as in process."""
        self.rows, self.why_none = [], None if recording_on() else OFF
        if self.why_none is None:
            self._t0 = t0
            self._task = asyncio.get_running_loop().create_task(self._scrape())

    async def flush(self) -> None:
        """One last scrape at the replay's end: the counts since the last scheduled one (up
        to PERIOD_S of tokens, preemptions and prefix queries) would be lost otherwise."""
        if self._task is None:
            return
        self._task.cancel()
        self._task = None
        state = await self._get()
        if self._t0 is not None and state is not None and state.running is not None:
            self.rows.append(_record(self.clock() - self._t0, state, self._before, self.awaiting()))

    def stop(self) -> list[TimelineRecord]:
        if self._task is not None:
            self._task.cancel()
        self._task, self._t0 = None, None
        return self.rows

    async def _get(self) -> ServerState | None:
        try:
            status, text = await self.client().get("/metrics", timeout_s=2.0)
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None
        return read(text) if status == 200 else None

    async def _scrape(self) -> None:
        """One scrape every PERIOD_S, kept to its schedule; a scrape that fails is skipped, and
        a server whose metrics never answer or lack the gauges leaves the reason in why_none."""
        t0, due = self._t0, self.clock()
        self._before = await self._get()
        while True:
            due += PERIOD_S
            await asyncio.sleep(max(0.0, due - self.clock()))
            state = await self._get()
            if state is None:
                self.why_none = None if self.rows else NO_METRICS
                continue
            if state.running is None:
                self.why_none = NO_GAUGES
                self._task = None  # nothing for flush to add either
                return
            self.rows.append(_record(self.clock() - t0, state, self._before, self.awaiting()))
            self.why_none, self._before = None, state


def _record(t_s: float, state: ServerState, before: ServerState | None, adapters_waiting: int) -> TimelineRecord:
    """One scrape as a timeline record: the gauges, the counters' increase since ``before``, and
    the adapters this client's requests await a first token for (the labels cannot say it)."""
    counts = {
        f: getattr(state, f) - (getattr(before, f) if before is not None else getattr(state, f))
        for f in COUNTERS.values()
    }
    return TimelineRecord(
        t_s=t_s,
        kv_usage=state.kv_usage or 0.0,
        running=state.running or 0,
        waiting=state.waiting or 0,
        adapters_running=state.running_adapters(),
        adapters_waiting=adapters_waiting,
        **counts,
    )
