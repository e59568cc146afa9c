"""Which engine configuration to choose: for each trace shape a capacity search ran, the
configuration with the highest capacity, and whether its lead over the next best is real.

A capacity is known only to the search's precision (the bracket between its highest
passing and lowest failing rate), and builds of one configuration differ (see
docs/compare.md). So a lead is called real only when each side has 2 builds or more and
every build of the best passed a rate at which every build of the next failed: beyond
both. The rule is docs/capacity.md's "The recommendation".
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import pandas as pd

from lorabench.config.target import URL
from lorabench.results.naming import engine_name
from lorabench.results.schema import CASE_KEY, ENGINE_KEY, ResultRow
from lorabench.results.search_stops import BELOW_RANGE, NO_VERDICT

SHAPE_KEY = [c for c in CASE_KEY if c not in ENGINE_KEY]


@dataclass(frozen=True)
class Choice:
    """One configuration's searches over its builds: highest passing and lowest failing rates."""

    engine: str
    capacities: tuple[float, ...]  # 0 where the search fell below its range; NaN where it stopped with none
    overs: tuple[float, ...]  # NaN where no probe failed
    stops: tuple[str, ...]
    kv_cache_tokens: float
    peak_memory_mb: float  # NaN where the figure is not the configuration's (a URL target's client)

    @property
    def mean(self) -> float:
        return sum(self.capacities) / len(self.capacities)

    @property
    def no_verdict(self) -> str:
        """The first build's stop that left its search with no verdict (failed requests, a
        client behind), or "": such a capacity is what passed before the search stopped."""
        return next((s for s in self.stops if s.startswith(NO_VERDICT)), "")

    @property
    def incomplete(self) -> str:
        """Why some of its builds' searches found no capacity while others did ('' if none):
        such a configuration has no mean, and is not ranked, whatever its other builds passed."""
        missing = [stop for c, stop in zip(self.capacities, self.stops) if math.isnan(c)]
        if not missing or len(missing) == len(self.capacities):
            return ""
        return f"{len(missing)} of {len(self.capacities)} searches stopped before a probe passed ({', '.join(missing)})"

    @property
    def open_ended(self) -> bool:
        """No build found a failing rate: the capacity is at least what it passed."""
        return all(math.isnan(o) for o in self.overs)


def for_session(rows: Sequence[ResultRow]) -> list[str]:
    """``recommendations`` for the rows a session wrote."""
    capacity = [{**asdict(r), "engine": engine_name(*(getattr(r, c) for c in ENGINE_KEY))} for r in rows]
    return recommendations(pd.DataFrame(capacity)) if capacity else []


def recommendations(rows: pd.DataFrame) -> list[str]:
    """One line per trace shape (and SLOs) of the capacity rows in ``rows`` (a result
    file's columns, with ``engine``: the configuration's name)."""
    frame = rows[rows["scenario"] == "capacity"] if "scenario" in rows else rows.iloc[0:0]
    return [_line(shape) for _, shape in shapes(frame)]


def shapes(frame: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    """The capacity rows of each trace shape and SLOs, with the shape's label."""
    keys = [c for c in SHAPE_KEY if c in frame]
    for _, shape in frame.groupby(keys, sort=False, dropna=False) if not frame.empty else ():
        yield shape_label(shape.iloc[0]), shape


def _choices(shape: pd.DataFrame) -> list[Choice]:
    choices = []
    for engine, builds in shape.groupby("engine", sort=True):
        stops = tuple(str(s) for s in builds["search_stop"])
        passed = pd.to_numeric(builds["capacity_rps"], errors="coerce")
        capacities = tuple(0.0 if stop == BELOW_RANGE else float(c) for c, stop in zip(passed, stops))
        choices.append(
            Choice(
                engine=str(engine),
                capacities=capacities,
                overs=tuple(pd.to_numeric(builds["capacity_over_rps"], errors="coerce").astype(float)),
                stops=stops,
                kv_cache_tokens=float(builds["kv_cache_tokens"].mean()),
                peak_memory_mb=_peak_memory(builds),
            )
        )
    # A search stopped with no verdict is ranked with those that passed nothing: its server
    # failed requests or its client fell behind, and what it passed before is no capacity.
    known = sorted(
        (c for c in choices if not math.isnan(c.mean) and not c.no_verdict), key=lambda c: c.mean, reverse=True
    )
    return known + [c for c in choices if math.isnan(c.mean) or c.no_verdict]


def _peak_memory(builds: pd.DataFrame) -> float:
    """The builds' peak memory, or NaN where it is lorabench's own: against a server at a URL
    the figure is the client's RSS (``memory_source`` ``client``), not the server's."""
    client = builds["memory_source"].astype(str).eq("client") if "memory_source" in builds else False
    url = builds["target"].astype(str).eq(URL) if "target" in builds else False
    if (client | url).any():
        return math.nan
    return float(builds["peak_memory_mb"].max())


def _memory(choice: Choice) -> str:
    """Its KV cache and peak memory, or what is not known of them: a server whose /metrics
    gives no cache size leaves ``kv_cache_tokens`` blank (nan here)."""
    kv = f"{choice.kv_cache_tokens:.0f} KV cache tokens" if choice.kv_cache_tokens > 0 else "KV cache not reported"
    if math.isnan(choice.peak_memory_mb):
        return f"{kv}, memory not measured (URL target: lorabench sees only its own client's)"
    return f"{kv}, peak {choice.peak_memory_mb:.0f} MiB"


def _line(shape: pd.DataFrame) -> str:
    choices = _choices(shape)
    best = choices[0]
    head = f"capacity, {shape_label(shape.iloc[0])}: "
    if best.no_verdict:
        return head + f"not found: {best.engine}'s searches stopped with no verdict ({best.no_verdict})"
    if math.isnan(best.mean):
        return head + f"not found: every search stopped before a probe passed ({', '.join(sorted(set(best.stops)))})"
    if best.mean == 0:
        return head + "no configuration met the SLOs at the lowest rate a probe can judge"
    unranked = [c for c in choices if c.incomplete]
    beaten = [c for c in unranked if max(x for x in c.capacities if not math.isnan(x)) >= best.mean]
    if beaten:
        c = beaten[0]
        top = max(x for x in c.capacities if not math.isnan(x))
        return head + (
            f"not decided: {c.engine}'s other builds passed up to {top:.3g} req/s, at or above {best.engine}'s "
            f"{best.mean:.3g}, but {c.incomplete}: run its searches again"
        )
    said = f"{head}choose {best.engine}: {_rate(best)}, {_memory(best)}"
    said += "".join(f"; {c.engine} not ranked: {c.incomplete}" for c in unranked)
    if len(choices) == 1:
        return said + " (the only configuration searched)"
    runner_up = choices[1]
    if runner_up.no_verdict:
        return f"{said}; {runner_up.engine}'s searches stopped with no verdict ({runner_up.no_verdict})"
    if math.isnan(runner_up.mean):
        return f"{said}; {runner_up.engine}'s searches stopped before a probe passed"
    if any(math.isnan(o) for o in runner_up.overs):
        # Its capacity has no upper bound: a lead over it in percent would read a bound as a value.
        return (
            f"{said}; {runner_up.engine} ({_rate(runner_up)}): no lead shown: a build of {runner_up.engine} "
            "failed no rate probed, so its capacity has no upper bound (raise max_rate to tell them apart)"
        )
    lead = f"{best.mean / runner_up.mean - 1:.0%}" if runner_up.mean > 0 else "all the way"
    return f"{said}; {lead} over {runner_up.engine} ({_rate(runner_up)}), {_verdict(best, runner_up)}"


def _verdict(best: Choice, runner_up: Choice) -> str:
    """A lead is real when each side has 2 builds or more (one build says nothing of the
    spread between builds) and every build of the best passed a rate at which every build
    of the runner-up failed: beyond both the searches' precision and the builds' spread.
    (A runner-up build that failed no rate has no upper bound: ``_line`` shows no lead.)"""
    builds = min(len(best.capacities), len(runner_up.capacities))
    if builds < 2:
        return f"{builds} build: lead not tested (a lead needs 2 builds a side: capacity.builds or --bench-builds 2)"
    if max(runner_up.overs) <= min(best.capacities):
        return "a real lead: every build of it passed a rate every build of the other failed"
    return "not shown: within the searches' precision and the spread between builds"


def _rate(choice: Choice) -> str:
    at_least = "at least " if choice.open_ended else ""
    spread = ""
    if len(choice.capacities) > 1:
        spread = f", builds {min(choice.capacities):.3g}-{max(choice.capacities):.3g}"
    return f"{at_least}{choice.mean:.3g} req/s{spread}"


def shape_label(row: pd.Series) -> str:
    """The trace shape as a reader names it, and the SLOs it was searched under."""
    parts = [f"{int(row['trace_num_adapters'])} adapters"]
    if isinstance(row.get("trace_file"), str) and row["trace_file"]:
        parts.append(str(row["trace_file"]))
    elif isinstance(row.get("trace_sha256"), str) and row["trace_sha256"]:
        parts.append(f"trace {row['trace_sha256'][:12]}")
    else:
        parts.append(f"alpha {row['trace_alpha']:g}, cv {row['trace_cv']:g}")
    slo = f"TTFT {row['slo_ttft_ms']:g} ms and TPOT {row['slo_tpot_ms']:g} ms for {row['slo_target']:.0%} of requests"
    return f"{row['trace_suite']} ({', '.join(parts)}; {slo})"
