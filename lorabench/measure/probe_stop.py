"""A capacity probe that stops as soon as it is certainly over (docs/capacity.md#the-search).

**SLO lost.** A probe passes when at least ``target`` of its measured requests meet both SLOs.
Once more than ``1 - target`` of the measured requests it plans to send have certainly missed,
it fails even if every other one met them: if at most half of them are sent yet, so that the
overload is clear (``CLEAR_SHARE``), it stops there, saying so, and fails as it would have.
Certainly missed means by the engine, from the request's send: a request that missed only by
its client's send lag is not counted, since a fail those alone account for is the client's
(``replay_summary.late_sends_fail``) and no verdict; nor does a probe stop while its sends so
far are behind by the 10 % rule (``client_behind``), which voids it. A request counts as
missed when

- it finished late (TTFT from its send over ``slo_ttft_ms``, or TPOT over ``slo_tpot_ms``);
- its first token came late, or, in process, none has come ``slo_ttft_ms`` after its send,
  or its decode has run past ``(output_len - 1) × slo_tpot_ms``. In process the replay times a
  token when it gets it, so one still to come is later than now: the miss is certain. Over
  HTTP the client times the bytes when they arrive and holds a stream's finishing tokens
  until its usage follows (``targets.http.engine``): a request that shows no token may have
  one timed already, so only what it has shown counts there.

**A growing queue** is not decided mid-probe: the drain's test (requests still running when
every request's drain bound has passed, docs/capacity.md#the-drain) cannot be applied before
the last arrival's bound, and an engine may yet catch up. A growing queue stops a probe
anyway: the requests waiting in it pass their TTFT limit and count above (over HTTP once their
first token comes).

**Its record.** A stopped probe fails, as it would have; ``requests`` and ``met`` are its
requests whose SLO verdict was due by the stop (``settled``): chosen by arrival and length,
never by outcome (a miss is known before a meet), each met or missed as recorded, one still
running a miss. The edge's interval takes none of them as trials
(``lorabench.measure.capacity_edge`` says why), only the fail it made certain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lorabench.config.trace_sections import MIN_REQUESTS
from lorabench.measure.replay import ReplayedRequest
from lorabench.measure.replay_summary import client_behind
from lorabench.measure.replay_tasks import Stop

# A probe's ``stopped_early`` starts with it (then ": " and the counts); blank: it ran whole.
SLO_LOST = "SLO lost"
# A probe stops only while at most this share of its planned measured requests is sent: then
# more than twice ``1 - target`` of those sent missed, an overload beyond doubt, and the edge's
# interval keeps its coverage (``lorabench.measure.capacity_edge``).
CLEAR_SHARE = 0.5


class SloLost(Stop):
    """The SLO-lost rule of one probe (the module's docstring): ``planned`` measured requests
    (arrived after ``warmup_s``), of which ``target`` must meet both SLOs. ``live``: tokens are
    timed as the replay gets them (in process). A probe of fewer than ``MIN_REQUESTS`` decides
    nothing anyway (it is rerun longer): it is never stopped; nor is one past ``CLEAR_SHARE``
    of its planned requests sent."""

    def __init__(self, planned: int, target: float, slos: tuple[float, float], warmup_s: float, *, live: bool) -> None:
        super().__init__()
        self.planned, self.target, self.warmup_s, self.live = planned, target, warmup_s, live
        self.slo_ttft_ms, self.slo_tpot_ms = slos
        self.missed = self.sent = 0  # of the measured requests
        # Requests looked at so far (by index), and the measured ones sent whose verdict is open.
        self._seen = 0
        self._open: list[ReplayedRequest] = []

    def check(self, records: Sequence[ReplayedRequest], now_s: float) -> str:
        if self.planned < MIN_REQUESTS or self.sent > CLEAR_SHARE * self.planned:
            return ""
        while self._seen < len(records) and records[self._seen].sent_s == records[self._seen].sent_s:
            if records[self._seen].scheduled_s >= self.warmup_s:
                self._open.append(records[self._seen])
                self.sent += 1
            self._seen += 1
        if self.sent > CLEAR_SHARE * self.planned:  # past the half: it runs whole
            return ""
        still = []
        for r in self._open:
            verdict = self.missed_by_engine(r, now_s)
            if verdict is None:
                still.append(r)
            self.missed += bool(verdict)
        self._open = still
        if (self.planned - self.missed) / self.planned >= self.target:
            return ""
        lags = [r.send_lag_ms for r in records[: self._seen] if r.scheduled_s >= self.warmup_s]
        if client_behind(lags, self.slo_ttft_ms):  # its verdict is the client's: no overload to stop
            return ""
        most = self.planned - self.missed
        return (
            f"{SLO_LOST}: {self.missed} of {self.planned} planned requests missed, "
            f"at most {most} could meet the SLOs, under {self.target:.0%}"
        )

    def missed_by_engine(self, r: ReplayedRequest, now_s: float) -> bool | None:
        """Whether ``r`` certainly missed the SLOs by the engine at ``now_s``: True, False (met,
        or failed: a failure is no miss but voids the probe), or None while it may go either way."""
        if r.failed:
            return False
        if r.finished:
            return not (r.ttft_from_send_ms <= self.slo_ttft_ms and not r.tpot_ms > self.slo_tpot_ms)
        if r.token_times:
            if r.ttft_from_send_ms > self.slo_ttft_ms:
                return True
            decoding_ms = (now_s - r.token_times[0]) * 1000.0
            if self.live and r.output_len > 1 and decoding_ms > (r.output_len - 1) * self.slo_tpot_ms:
                return True
            return None
        if self.live and (now_s - r.sent_s) * 1000.0 > self.slo_ttft_ms:
            return True
        return None


def settled(
    measured: Sequence[ReplayedRequest], at_s: float, slo_ttft_ms: float, slo_tpot_ms: float
) -> tuple[int, int]:
    """Of a stopped probe's measured requests, those whose SLO verdict was due by ``at_s``
    (their whole budget, ``slo_ttft_ms + output_len × slo_tpot_ms`` from their arrival, run out),
    and how many of them met both SLOs. One still running is a miss: in process certainly; over
    HTTP unless its client held its finishing tokens for a TPOT budget and more."""
    due = [r for r in measured if r.scheduled_s + (slo_ttft_ms + r.output_len * slo_tpot_ms) / 1000.0 < at_s]
    return len(due), _met(due, slo_ttft_ms, slo_tpot_ms)


def _met(requests: Sequence[ReplayedRequest], slo_ttft_ms: float, slo_tpot_ms: float) -> int:
    """Those that finished within both SLOs, from their arrival, as a probe's attainment counts."""
    return sum(r.finished and r.ttft_ms <= slo_ttft_ms and not r.tpot_ms > slo_tpot_ms for r in requests)


def judged(
    measured: Sequence[ReplayedRequest], stop: SloLost, slo_ttft_ms: float, slo_tpot_ms: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A probe's counts as ``capacity.Probe`` takes them, and those its record adds: its measured
    requests, those that met both SLOs and those the drain left unfinished; for a probe stopped
    early, those due by the stop (``settled``) and none unfinished (the stop, not the drain,
    aborted what still ran), with why and when it stopped."""
    sent = {"sent": len(measured), "finished": sum(r.finished for r in measured), "stopped_at_s": stop.at_s}
    if stop.at_s is None:
        unfinished = sum(not r.finished and not r.failed for r in measured)
        counts = {"requests": len(measured), "met": _met(measured, slo_ttft_ms, slo_tpot_ms), "unfinished": unfinished}
    else:
        requests, met = settled(measured, stop.at_s, slo_ttft_ms, slo_tpot_ms)
        counts = {"requests": requests, "met": met, "unfinished": 0, "stopped": stop.why}
    return {**counts, "planned": stop.planned}, sent
