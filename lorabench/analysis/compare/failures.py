"""Failures a new side counts in its rows, which fail a comparison whatever the timings say.

A churn row's load and unload latencies are over the operations that succeeded, so a new
side whose loads fail (a server without the runtime load API, an adapter it cannot read)
can look as fast as ever, or faster. An isolation row whose canaries found an adapter
answering from another adapter's cached blocks is wrong answers at full speed. Every case
whose new side counts one is named on its own, with the base side's count beside it;
failures on the base side only do not fail: the new side fixed them.
"""

from __future__ import annotations

from dataclasses import dataclass

from lorabench.analysis.cases import CORE_METRICS, case_of
from lorabench.analysis.compare.capacity import capacity_verdicts
from lorabench.analysis.compare.load import Run


@dataclass(frozen=True)
class Counted:
    """A kind of failure: the column counting it, the column counting what was tried, and the line's words."""

    failed: str
    done: str | None  # None: the count alone is said
    title: str
    what: str
    then: str = ""
    # Listed only where the base side counted none: a known failure of both sides is history.
    only_new: bool = False


CHURN = Counted(
    "churn_failed_ops",
    "churn_ops",
    "CHURN OPERATIONS FAILED",
    "loads and unloads failed",
    "; their latencies are left out of load_ms and unload_ms",
)
ISOLATION = Counted(
    "isolation_broken",
    "isolation_checked",
    "ADAPTER ISOLATION BROKEN",
    "answers of adapters sent a prompt another adapter had cached were not their own or reused its blocks",
    " (the run's isolation.csv has the answers)",
)
RELOAD = Counted(
    "isolation_reload_broken",
    None,
    "STALE KV AFTER A RELOAD",
    "builds' adapters reloaded in place found the KV of the weights they replaced",
    " (the run's isolation.csv has the answers)",
    only_new=True,
)
CACHING_CHANGED = Counted(
    "isolation_control_changed",
    None,
    "PREFIX CACHING CHANGED OUTPUTS",
    "answers differed from their uncached ones with nothing of another adapter's found cached",
    " (the run's isolation.csv has the answers)",
    only_new=True,  # an engine whose cached prefill differs in its numerics does so on both sides
)


CACHE_OFF = Counted(
    "isolation_uncached",
    None,
    "PREFIX CACHING NOT IN EFFECT",
    "controls found nothing of their own prompt cached: the canaries could not see a breach",
    only_new=True,
)


def _counts(run: Run, kind: Counted) -> dict[str, tuple[int, int]]:
    """Per case: failures and tries, summed over its builds (and runs)."""
    rows = run.all_rows
    columns = [c for c in (kind.failed, kind.done) if c is not None]
    if any(c not in rows for c in columns):
        return {}
    sums = rows[rows[kind.failed].notna()].groupby("_key")[columns].sum()
    return {key: (int(row[kind.failed]), int(row[kind.done]) if kind.done else 0) for key, row in sums.iterrows()}


def new_failures(base: Run, new: Run, kind: Counted) -> list[str]:
    """Cases whose new side counted a failure of ``kind``, with the base side's count beside it."""
    before = _counts(base, kind)
    found = []
    for key, (failed, done) in _counts(new, kind).items():
        if not failed or (kind.only_new and before.get(key, (0, 0))[0]):
            continue
        label = ", ".join(f"{k}: {v}" for k, v in case_of(key).items() if v)
        base_failed, base_done = before.get(key, (0, 0))
        of = (lambda n, d: f"{n} of {d}") if kind.done else (lambda n, d: f"{n}")
        was = f"base: {of(base_failed, base_done)}" if key in before else "not in base"
        found.append(f"{kind.title}: {label}: {of(failed, done)} {kind.what} on the new side ({was}){kind.then}")
    return found


def failed_operations(base: Run, new: Run) -> list[str]:
    """Churn cases whose new side had a load or unload fail."""
    return new_failures(base, new, CHURN)


# A case's prefix hit rate is its workload's sharing, found by a keyed lookup: on the same
# trace and configuration it repeats to within eviction's few points (measured matched the
# prediction exactly on the CPU engine, docs/lab/2026-11-measurements.md). A fall past this
# many is the cache no longer reusing what the workload shares.
HIT_RATE_FALL = 0.05


def _hit_rates(run: Run) -> dict[str, float]:
    rows = run.all_rows
    if "prefix_hit_rate" not in rows or "enable_prefix_caching" not in rows:
        return {}
    cached = rows[(rows["enable_prefix_caching"].astype(str) == "True") & rows["prefix_hit_rate"].notna()]
    return cached.groupby("_key")["prefix_hit_rate"].mean().to_dict()


def fallen_hit_rates(base: Run, new: Run) -> list[str]:
    """Cases with prefix caching on whose new side found ``HIT_RATE_FALL`` less of its prompts
    cached than the base side (means over builds): caching that stopped taking effect (with
    LoRA, vllm #23301) is a latency change, but this says why."""
    before = _hit_rates(base)
    found = []
    for key, rate in _hit_rates(new).items():
        if key in before and rate < before[key] - HIT_RATE_FALL:
            label = ", ".join(f"{k}: {v}" for k, v in case_of(key).items() if v)
            found.append(
                f"PREFIX CACHE HIT RATE FELL: {label}: {rate:.1%} of prompt tokens found cached on the new side, "
                f"{before[key]:.1%} on the base side"
            )
    return found


def _unfinished(run: Run) -> dict[str, tuple[int, int]]:
    """Per online case (capacity searches are judged on their bounds): requests left
    unfinished and requests measured, summed over its builds (and runs)."""
    rows = run.all_rows
    if "unfinished" not in rows or "num_requests" not in rows:
        return {}
    online = rows[(rows["scenario"] != "capacity") & rows["unfinished"].notna() & rows["num_requests"].gt(0)]
    sums = online.groupby("_key")[["unfinished", "num_requests"]].sum()
    return {key: (int(row["unfinished"]), int(row["num_requests"])) for key, row in sums.iterrows()}


def more_unfinished(base: Run, new: Run, alpha: float) -> list[str]:
    """Online cases whose new side left a larger share of its requests unfinished than the
    base side, by Fisher's exact test (one-sided, at the comparison's alpha). An online row's
    latencies are over its finished requests, so a new side that aborts more of them at the
    drain keeps only its fastest: its TTFT can read as an improvement
    (docs/compare.md#what-else-fails-a-comparison)."""
    before = _unfinished(base)
    found = []
    for key, (left, sent) in _unfinished(new).items():
        if key not in before or left * before[key][1] <= before[key][0] * sent:
            continue  # not on the base side, or no larger a share
        from scipy.stats import fisher_exact  # a second of imports, for this test alone

        base_left, base_sent = before[key]
        table = [[left, sent - left], [base_left, base_sent - base_left]]
        p = float(fisher_exact(table, alternative="greater").pvalue)
        if p < alpha:
            label = ", ".join(f"{k}: {v}" for k, v in case_of(key).items() if v)
            found.append(
                f"MORE REQUESTS UNFINISHED: {label}: {left} of {sent} requests unfinished on the new side, "
                f"{base_left} of {base_sent} on the base side (p {p:.2g}); the latencies are over finished "
                "requests only, so the new side's describe its survivors"
            )
    return found


def broken_isolation(base: Run, new: Run) -> list[str]:
    """Isolation cases whose new side's canaries found a breach (a reload's only where the base
    side's held), caching that changes outputs, or caching not in effect where the base's was."""
    kinds = (ISOLATION, RELOAD, CACHING_CHANGED, CACHE_OFF)
    return [line for kind in kinds for line in new_failures(base, new, kind)]


def _measured(run: Run) -> dict[str, set[str]]:
    """Per case but capacity searches (judged on their bounds), the core metrics some build measured (above 0)."""
    rows = run.all_rows[run.all_rows["scenario"] != "capacity"]
    positive = rows[list(CORE_METRICS)].gt(0).groupby(rows["_key"]).any()
    return {key: {m for m in CORE_METRICS if row[m]} for key, row in positive.iterrows()}


def lost_measurements(base: Run, new: Run) -> list[str]:
    """Cases both sides ran whose base side measured a core metric and whose new side did not
    on any build: nothing finished (throughput 0, no latency). A value missing on one side
    cannot be tested, so in the timings' table such a case would pass unnoticed."""
    before, after = _measured(base), _measured(new)
    found = []
    for key in (k for k in after if k in before):
        lost = [m for m in CORE_METRICS if m in before[key] and m not in after[key]]
        if lost:
            label = ", ".join(f"{k}: {v}" for k, v in case_of(key).items() if v)
            found.append(
                f"NOT MEASURED ON THE NEW SIDE: {label}: {', '.join(lost)} measured on the base side, on no build of "
                "the new side (did no request finish?)"
            )
    return found


def digest_changes(base: Run, new: Run) -> list[tuple[str, str, str, str]]:
    """Adapters of the same model and device whose greedy digests differ between the sides."""
    if base.digests.empty or new.digests.empty:
        return []
    key = ["model", "device_type", "adapter"]
    sides = [d.groupby(key)["digest"].agg(lambda v: ", ".join(sorted(set(v)))) for d in (base.digests, new.digests)]
    both = sides[0].to_frame("base").join(sides[1].to_frame("new"), how="inner")
    changed = both[both["base"] != both["new"]]
    return [(model, adapter, row.base, row.new) for (model, _, adapter), row in changed.iterrows()]


def unchecked_outputs(base: Run, new: Run) -> list[str]:
    """A warning where the base side recorded greedy digests and the new side none (a digests
    file left behind when the results were copied): the outputs went unchecked, not unchanged."""
    if base.digests.empty or not new.digests.empty:
        return []
    return ["the base side recorded its adapters' greedy-output digests and the new side none: outputs not compared"]


def capacity_threshold(threshold: float, per_metric: dict[str, float] | None) -> float:
    """The threshold capacity bounds are judged with: capacity_rps's own, else the default."""
    return (per_metric or {}).get("capacity_rps", threshold)


def failures(
    base: Run, new: Run, threshold: float, per_metric: dict[str, float] | None, alpha: float
) -> dict[str, list]:
    """What fails a comparison whatever the timings' verdicts say, as ``Comparison``'s fields:
    changed outputs, capacities judged on their bounds, failed churn operations, broken
    isolation, fallen hit rates, more requests left unfinished and metrics the new side no
    longer measured; and a warning where outputs could not be compared."""
    collapses, unjudged, bounds = capacity_verdicts(base, new, capacity_threshold(threshold, per_metric))
    return {
        "digest_changes": digest_changes(base, new),
        "capacity_collapses": collapses,
        "capacity_unjudged": unjudged,
        "capacity_bounds": bounds,
        "churn_failures": failed_operations(base, new),
        "isolation_failures": broken_isolation(base, new),
        "hit_rate_falls": fallen_hit_rates(base, new),
        "unfinished_rises": more_unfinished(base, new, alpha),
        "unmeasured": lost_measurements(base, new),
        "warnings": unchecked_outputs(base, new),
    }
