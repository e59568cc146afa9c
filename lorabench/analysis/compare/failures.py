"""Failed churn operations in a comparison. A churn row's load and unload latencies are
over the operations that succeeded, so a new side whose loads fail (a server without the
runtime load API, an adapter it cannot read) can look as fast as ever, or faster: every
case whose new side failed an operation is named on its own, and fails the comparison."""

from __future__ import annotations

from lorabench.analysis.cases import case_of
from lorabench.analysis.compare.load import Run

FAILED, DONE = "churn_failed_ops", "churn_ops"


def _counts(run: Run) -> dict[str, tuple[int, int]]:
    """Per case: operations failed and done, summed over its builds (and runs)."""
    rows = run.all_rows
    if FAILED not in rows or DONE not in rows:
        return {}
    churned = rows[rows[FAILED].notna()]
    sums = churned.groupby("_key")[[FAILED, DONE]].sum()
    return {key: (int(row[FAILED]), int(row[DONE])) for key, row in sums.iterrows()}


def failed_operations(base: Run, new: Run) -> list[str]:
    """Cases whose new side had a load or unload fail, with the base side's count beside it."""
    before = _counts(base)
    found = []
    for key, (failed, done) in _counts(new).items():
        if not failed:
            continue
        label = ", ".join(f"{k}: {v}" for k, v in case_of(key).items() if v)
        base_failed, base_done = before.get(key, (0, 0))
        was = f"base: {base_failed} of {base_done}" if key in before else "not in base"
        found.append(
            f"CHURN OPERATIONS FAILED: {label}: {failed} of {done} loads and unloads failed on the new side "
            f"({was}); their latencies are left out of load_ms and unload_ms"
        )
    return found
