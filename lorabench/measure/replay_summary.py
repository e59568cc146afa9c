"""What a replay measured (``lorabench.measure.replay``): its row's aggregates, each adapter's share,
its samples, and whether its client kept to the schedule.

Every latency runs from the scheduled arrival (``ReplayedRequest.ttft_ms``); the same from the
send is kept apart (``ttft_from_send_ms``). A replay whose client fell behind its schedule
offered the engine less than the trace says: ``client_behind`` says so, by the rule in
docs/metrics.md#online-rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lorabench.measure.replay import ReplayedRequest
from lorabench.results.records import AdapterRecord, Sample
from lorabench.results.search_stops import BEHIND
from lorabench.results.stats import percentile, summary

# The client fell behind when more than LATE_SHARE of the measured requests were sent more
# than BEHIND_SHARE of the TTFT SLO after their scheduled arrival: then the load the engine saw
# came later than the trace's for more requests than a 90 % target forgives, each of them short
# of a quarter of its budget before the engine had it (docs/metrics.md#online-rows).
BEHIND_SHARE = 0.25
LATE_SHARE = 0.1


def client_behind(lags_ms: Sequence[float], slo_ttft_ms: float) -> str:
    """Why the client fell behind its schedule, or "" when it kept to it."""
    limit = BEHIND_SHARE * slo_ttft_ms
    late = sum(lag > limit for lag in lags_ms)
    if lags_ms and late > LATE_SHARE * len(lags_ms):
        return (
            f"{BEHIND}: {late} of {len(lags_ms)} requests sent over {limit:.3g} ms late "
            f"({BEHIND_SHARE:.0%} of slo_ttft_ms), the most {max(lags_ms):.3g} ms"
        )
    return ""


def late_sends_fail(
    measured: Sequence[ReplayedRequest], *, slo_ttft_ms: float, slo_tpot_ms: float, target: float
) -> str:
    """Why a probe's fail is its client's, or "": it fails its ``target`` only through requests
    the engine served within the SLOs from their send, late by the client's lag alone. The 10 %
    rule (``client_behind``) cannot see this at a target above 90 %: 3 late requests in 40
    fail a 95 % target, and the fail would be read as the engine's overload. A request the
    drain aborted fails the probe whatever the client did (an overload never passes), so
    then the fail is the engine's."""
    if any(not r.finished and not r.failed for r in measured):
        return ""
    met = sum(_meets_slo(r, slo_ttft_ms, slo_tpot_ms) for r in measured)
    lagged = sum(
        r.finished
        and not _meets_slo(r, slo_ttft_ms, slo_tpot_ms)
        and r.ttft_from_send_ms <= slo_ttft_ms
        and not r.tpot_ms > slo_tpot_ms
        for r in measured
    )
    if met < target * len(measured) <= met + lagged:
        return (
            f"{BEHIND}: {lagged} of {len(measured)} requests missed the TTFT SLO only by their send lag, "
            f"enough to fail the {target:.0%} target"
        )
    return ""


def probe_behind(measured: Sequence[ReplayedRequest], *, slo_ttft_ms: float, slo_tpot_ms: float, target: float) -> str:
    """Why a capacity probe's client fell behind (docs/capacity.md#the-search), or "": the
    10 % rule, or a fail its late sends alone account for."""
    lags = [r.send_lag_ms for r in measured]
    return client_behind(lags, slo_ttft_ms) or late_sends_fail(
        measured, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, target=target
    )


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all values are equal, 1/n when one takes everything."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0 or not np.any(arr):
        return float("nan")
    return float(arr.sum() ** 2 / (arr.size * np.square(arr).sum()))


def _meets_slo(r: ReplayedRequest, slo_ttft_ms: float, slo_tpot_ms: float) -> bool:
    """Finished, with its TTFT and TPOT (when it has one) within the targets."""
    return r.finished and r.ttft_ms <= slo_ttft_ms and (np.isnan(r.tpot_ms) or r.tpot_ms <= slo_tpot_ms)


def hit_rates(records: Sequence[ReplayedRequest]) -> dict[str, float]:
    """``prefix_hit_rate`` and ``prefix_hit_rate_predicted`` of finished requests: their prompt
    tokens found cached (where the engine told every one) and predicted by hash ids (where the
    trace had them), over their prompt tokens (docs/metrics.md#prefix-caching)."""
    done = [r for r in records if r.finished]
    prompt = sum(r.input_len for r in done)
    rates: dict[str, float] = {}
    if not prompt:
        return rates
    cached, predicted = [r.cached_tokens for r in done], [r.predicted_cached for r in done]
    if None not in cached:
        rates["prefix_hit_rate"] = sum(cached) / prompt  # type: ignore[arg-type]
    if None not in predicted:
        rates["prefix_hit_rate_predicted"] = sum(predicted) / prompt  # type: ignore[arg-type]
    return rates


def adapter_usage(
    records: Sequence[ReplayedRequest], *, slo_ttft_ms: float, slo_tpot_ms: float, warmup_s: float
) -> list[AdapterRecord]:
    """What each adapter got of the replay, over the requests that arrived after ``warmup_s``:
    requests, tokens, latency over its finished requests, and SLO attainment (unfinished
    requests count against it). A starved adapter shows here, whatever the averages say."""
    by_adapter: dict[str, list[ReplayedRequest]] = {}
    for r in records:
        if r.scheduled_s >= warmup_s:
            by_adapter.setdefault(r.adapter, []).append(r)
    usage = []
    for adapter in sorted(by_adapter):
        mine = by_adapter[adapter]
        done = [r for r in mine if r.finished]
        ttfts = [r.ttft_ms for r in done]
        usage.append(
            AdapterRecord(
                adapter=adapter,
                requests=len(mine),
                finished=len(done),
                prompt_tokens=sum(r.input_len for r in mine),
                output_tokens=sum(len(r.token_times) for r in mine),
                ttft_ms=float(np.mean(ttfts)) if ttfts else float("nan"),
                ttft_ms_p50=percentile(ttfts, 50),
                ttft_ms_p99=percentile(ttfts, 99),
                decode_ms_p50=percentile([r.tpot_ms for r in done], 50),
                slo_attainment=sum(_meets_slo(r, slo_ttft_ms, slo_tpot_ms) for r in mine) / len(mine),
                **hit_rates(mine),
            )
        )
    return usage


def summarize_online(
    records: Sequence[ReplayedRequest], *, slo_ttft_ms: float, slo_tpot_ms: float, warmup_s: float
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Aggregates over the requests that arrived after ``warmup_s``, and a per-adapter breakdown
    (from ``adapter_usage``: its requests, attainment and mean TTFT).

    Requests of the warm-up count nowhere: not in ``num_requests``, ``unfinished`` or the
    send lag either. A request meets the SLO when it finished, its TTFT (from its scheduled
    arrival) is within ``slo_ttft_ms`` and its TPOT within ``slo_tpot_ms``; unfinished
    requests (failed ones among them) count against attainment.
    """
    measured = [r for r in records if r.scheduled_s >= warmup_s]
    done = [r for r in measured if r.finished]
    met = sum(_meets_slo(r, slo_ttft_ms, slo_tpot_ms) for r in done)
    span = (max(r.token_times[-1] for r in done) - min(r.sent_s for r in measured)) if done else float("nan")
    metrics: dict[str, float] = {
        "num_requests": len(measured),
        "unfinished": sum(not r.finished for r in measured),
        "request_throughput": len(done) / span if done else 0.0,
        "output_tokens_per_s": sum(len(r.token_times) for r in done) / span if done else 0.0,
        "slo_ttft_ms": slo_ttft_ms,
        "slo_tpot_ms": slo_tpot_ms,
        "slo_attainment": met / len(measured) if measured else float("nan"),
        "goodput_rps": met / span if done else 0.0,
    }
    metrics.update(summary("ttft_ms", [r.ttft_ms for r in done]))
    metrics.update({f"ttft_from_send_ms_p{p}": percentile([r.ttft_from_send_ms for r in done], p) for p in (50, 99)})
    metrics.update(summary("decode_ms", [r.tpot_ms for r in done]))
    metrics.update(summary("request_e2e_ms", [r.e2e_ms for r in done]))
    metrics.update(summary("queue_ms", [r.queue_ms for r in done]))
    metrics.update(hit_rates(measured))
    itl = [gap for r in done for gap in r.itl_ms]
    lags = [r.send_lag_ms for r in measured]
    for name, values in (("itl_ms", itl), ("send_lag_ms", lags)):
        metrics.update({f"{name}_p{p}": percentile(values, p) for p in (50, 99)})
    metrics["send_lag_ms_max"] = max(lags, default=float("nan"))
    metrics["client_fell_behind"] = bool(client_behind(lags, slo_ttft_ms))
    usage = adapter_usage(measured, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, warmup_s=warmup_s)
    per_adapter = [
        {"adapter": a.adapter, "requests": a.requests, "slo_attainment": a.slo_attainment, "ttft_ms": a.ttft_ms}
        for a in usage
    ]
    metrics["fairness"] = jain_index([a.slo_attainment for a in usage])
    return metrics, per_adapter


def samples(records: Sequence[ReplayedRequest], ranks: Mapping[str, int | None]) -> list[Sample]:
    """Every replayed request, finished or not, as a sample row."""
    return [
        Sample(
            round=0,
            request=r.index,
            adapter=r.adapter,
            adapter_rank=ranks.get(r.adapter),
            prompt_tokens=r.input_len,
            output_tokens=len(r.token_times),
            queue_ms=r.queue_ms,
            ttft_ms=r.ttft_ms,
            ttft_from_send_ms=r.ttft_from_send_ms,
            decode_ms=r.tpot_ms,
            request_e2e_ms=r.e2e_ms,
            arrival_s=r.scheduled_s,
            send_lag_ms=r.send_lag_ms,
            finished=r.finished,
            failed=r.failed,
            cached_tokens=r.cached_tokens,
        )
        for r in records
    ]
