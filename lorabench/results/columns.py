"""What a column of the result file is: its group, its role in the keys, the direction
``lorabench compare`` judges it in. The columns themselves are declared once, in
``lorabench.results.schema``; this module is the vocabulary they are declared in.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

# Column groups, in file order.
PROVENANCE, PARAMETER, TRACE, METRIC, ONLINE, CAPACITY, ENGINE = (
    "provenance",
    "parameter",
    "trace",
    "metric",
    "online",
    "capacity",
    "engine",
)
PERCENTILES = (50, 90, 99)
# The direction ``lorabench compare`` judges a metric in.
HIGHER, LOWER = "higher", "lower"
PER_REQUEST_METRICS = ("ttft_ms", "prefill_ms", "decode_ms", "request_e2e_ms", "queue_ms")


def column(
    group: str,
    *,
    key: bool = False,
    engine: bool = False,
    optional: bool = False,
    by_engine: bool = False,
    engine_only: bool = False,
    older: str | None = None,
    better: str | None = None,
) -> Any:
    """A column: ``key`` columns identify a case across runs, ``engine`` ones an engine
    configuration; ``by_engine`` optional columns are filled or not by the engine, not the
    scenario; ``engine_only`` ones only an in-process engine can fill (its own timestamps and
    caches), so they stay blank on HTTP targets; ``older``: what a file written before the
    column existed meant (compare reads its rows so); ``better``: ``HIGHER`` or ``LOWER``, the
    direction ``lorabench compare`` judges the column in (left out: not judged)."""
    metadata = {
        "group": group,
        "key": key,
        "engine": engine,
        "by_engine": by_engine or engine,
        "engine_only": engine_only,
        "older": older,
        "better": better,
    }
    return field(default=None, metadata=metadata) if optional else field(metadata=metadata)
