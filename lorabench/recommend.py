"""Which engine configuration to choose: for each trace shape a capacity search ran, the
configuration with the highest capacity, and whether its lead over the next best is
larger than what separates builds of the same configuration.

Builds of one configuration differ (see docs/compare.md), so a lead is only called
beyond the spread when every build of the best configuration served more than every
build of the next; with one build each, the spread is unknown and the line says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import pandas as pd

from lorabench.capacity import ABOVE_RANGE
from lorabench.schema import CASE_KEY, ENGINE_KEY, ResultRow, engine_name

SHAPE_KEY = [c for c in CASE_KEY if c not in ENGINE_KEY]


@dataclass(frozen=True)
class Choice:
    """One configuration's capacity over its builds (0 where no probe passed)."""

    engine: str
    capacities: tuple[float, ...]
    kv_cache_tokens: float
    peak_memory_mb: float
    open_ended: bool  # the search passed its max_rate: the capacity is at least this

    @property
    def mean(self) -> float:
        return sum(self.capacities) / len(self.capacities)


def for_session(rows: Sequence[ResultRow]) -> list[str]:
    """``recommendations`` for the rows a session wrote."""
    capacity = [{**asdict(r), "engine": engine_name(*(getattr(r, c) for c in ENGINE_KEY))} for r in rows]
    frame = pd.DataFrame(capacity)
    return recommendations(frame[frame["scenario"] == "capacity"]) if capacity else []


def recommendations(rows: pd.DataFrame) -> list[str]:
    """One line per trace shape of the capacity rows in ``rows`` (a result file's columns,
    with ``engine``: the configuration's name), best configuration first."""
    frame = rows[rows["scenario"] == "capacity"] if "scenario" in rows else rows.iloc[0:0]
    if frame.empty:
        return []
    keys = [c for c in SHAPE_KEY if c in frame]
    lines = []
    for _, shape in frame.groupby(keys, sort=False, dropna=False):
        lines.append(_line(shape))
    return lines


def _choices(shape: pd.DataFrame) -> list[Choice]:
    choices = []
    for engine, builds in shape.groupby("engine", sort=True):
        capacities = tuple(0.0 if pd.isna(v) else float(v) for v in builds["capacity_rps"])
        choices.append(
            Choice(
                engine=str(engine),
                capacities=capacities,
                kv_cache_tokens=float(builds["kv_cache_tokens"].mean()),
                peak_memory_mb=float(builds["peak_memory_mb"].max()),
                open_ended=bool((builds["search_stop"] == ABOVE_RANGE).any()),
            )
        )
    return sorted(choices, key=lambda c: c.mean, reverse=True)


def _line(shape: pd.DataFrame) -> str:
    first = shape.iloc[0]
    choices = _choices(shape)
    best = choices[0]
    head = f"capacity, {_shape_label(first)}: "
    if best.mean == 0:
        return head + "no configuration met the SLOs at the lowest rate a probe can judge"
    at_least = "at least " if best.open_ended else ""
    said = (
        f"{head}choose {best.engine}: {at_least}{best.mean:.3g} req/s{_range(best)}, "
        f"{best.kv_cache_tokens:.0f} KV cache tokens, peak {best.peak_memory_mb:.0f} MiB"
    )
    if len(choices) == 1:
        return said + " (the only configuration searched)"
    runner_up = choices[1]
    margin = best.mean / runner_up.mean - 1 if runner_up.mean > 0 else math.inf
    lead = f"{margin:.0%}" if math.isfinite(margin) else "all the way"
    other = f"{runner_up.engine} ({runner_up.mean:.3g} req/s{_range(runner_up)})"
    return f"{said}; {lead} over {other}, {_verdict(best, runner_up)}"


def _verdict(best: Choice, runner_up: Choice) -> str:
    if len(best.capacities) < 2 or len(runner_up.capacities) < 2:
        return "spread between builds unknown with one build (--bench-builds 2 or more to know)"
    if min(best.capacities) > max(runner_up.capacities):
        return "beyond the spread between builds (every build of it served more)"
    return "within the spread between builds: not a difference these builds can show"


def _range(choice: Choice) -> str:
    if len(choice.capacities) < 2:
        return ""
    return f", builds {min(choice.capacities):.3g}-{max(choice.capacities):.3g}"


def _shape_label(row: pd.Series) -> str:
    """The trace shape as a reader names it, and the SLOs it was searched under."""
    parts = [str(row["trace_suite"]), f"{int(row['trace_num_adapters'])} adapters"]
    if isinstance(row.get("trace_file"), str) and row["trace_file"]:
        parts.append(str(row["trace_file"]))
    else:
        parts.append(f"alpha {row['trace_alpha']:g}, cv {row['trace_cv']:g}")
    slo = f"TTFT {row['slo_ttft_ms']:g} ms and TPOT {row['slo_tpot_ms']:g} ms for {row['slo_target']:.0%} of requests"
    return f"{' '.join(parts[:1])} ({', '.join(parts[1:])}; {slo})"
