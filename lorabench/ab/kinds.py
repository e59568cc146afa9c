"""The kinds of change ``lorabench bisect`` can look for: those an A/B session's comparison
tells apart.

``lorabench ab`` exits 1 for any finding (a slower metric, a changed output, a fallen prefix
hit rate, a case no longer measured, ...: docs/compare.md#what-else-fails-a-comparison), so
its exit status cannot steer a search for one of them: in a chain whose outputs changed at
one environment and whose timings at a later one, the search would find whichever it met
first and call it slower. So each session records how many findings of each kind its
comparison had (``found`` in its ``ab.json``), and bisect judges every step by the kind it
was asked for alone; the others are said on the step's line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lorabench.analysis.compare.analysis import Comparison


@dataclass(frozen=True)
class Kind:
    """One kind of finding: how to count it in a comparison and how bisect says it."""

    name: str  # as --kind takes it
    count: Callable[[Comparison], int]
    one: str  # a count's noun: "1 changed adapter output", "2 changed adapter outputs"
    many: str
    first: str  # the answer: "first slower environment: nightly-03"
    none: str  # the last environment has none against the first: "no slowdown: nightly-15 against nightly-00"
    evidence: str  # what a bad step's comparison showed, against the first environment (``{first}``)


def _slower(c: Comparison) -> int:
    """Timings and capacities that got worse: the metrics' regressions, capacities judged on
    their bounds that regressed, and capacities that collapsed below the search's range."""
    return len(c.regressions) + sum(b.change < 0 for b in c.capacity_bounds) + len(c.capacity_collapses)


SLOWDOWN = "slowdown"
KINDS = {
    kind.name: kind
    for kind in (
        Kind(
            SLOWDOWN,
            _slower,
            "slower metric",
            "slower metrics",
            "first slower environment",
            "no slowdown",
            "timings slower than {first}'s past the threshold, significant over the step's pairs",
        ),
        Kind(
            "output",
            lambda c: len(c.digest_changes),
            "changed adapter output",
            "changed adapter outputs",
            "first environment with an output change",
            "no output change",
            "greedy output digests differ from {first}'s",
        ),
        Kind(
            "hit-rate",
            lambda c: len(c.hit_rate_falls),
            "prefix hit rate fallen",
            "prefix hit rates fallen",
            "first environment with a fallen prefix hit rate",
            "no fallen prefix hit rate",
            "less of the prompts found in the prefix cache than in {first}",
        ),
        Kind(
            "unfinished",
            lambda c: len(c.unfinished_rises),
            "case with more requests unfinished",
            "cases with more requests unfinished",
            "first environment with more requests unfinished",
            "no rise in unfinished requests",
            "a larger share of requests left unfinished than in {first} (Fisher's exact test)",
        ),
        Kind(
            "unmeasured",
            lambda c: len(c.unmeasured),
            "case no longer measured",
            "cases no longer measured",
            "first environment with a case no longer measured",
            "no case left unmeasured",
            "cases {first} measured, measured on no build (no request finished)",
        ),
        Kind(
            "churn",
            lambda c: len(c.churn_failures),
            "churn case with failed operations",
            "churn cases with failed operations",
            "first environment with failed adapter loads or unloads",
            "no failed churn operation",
            "adapter loads or unloads failed in churn cases",
        ),
        Kind(
            "isolation",
            lambda c: len(c.isolation_failures),
            "isolation finding",
            "isolation findings",
            "first environment with broken adapter isolation",
            "no broken isolation",
            "isolation canaries found a breach, or caching that changed outputs or was off, where {first}'s held",
        ),
        Kind(
            "capacity-not-found",
            lambda c: len(c.capacity_unjudged),
            "capacity search with no verdict",
            "capacity searches with no verdict",
            "first environment whose capacity searches found no capacity",
            "no capacity search without a verdict",
            "capacity searches stopped with no verdict (requests failed, or the client fell behind)",
        ),
    )
}


def found_in(result: Comparison) -> dict[str, int]:
    """How many findings of each kind the comparison had: what its session records for bisect."""
    return {name: kind.count(result) for name, kind in KINDS.items()}


def counted(found: Mapping[str, int], names: list[str]) -> str:
    """The kinds ``names`` that were found, with their counts: "1 changed adapter output"."""
    return ", ".join(f"{found[n]} {KINDS[n].one if found[n] == 1 else KINDS[n].many}" for n in names if found.get(n))


def said(verdict: str, found: Mapping[str, int], kind: str) -> str:
    """A step's verdict on ``kind`` with what its comparison found: of that kind, then the
    rest, which did not steer ("good; also found, not judged: 1 changed adapter output")."""
    asked, others = counted(found, [kind]), counted(found, [k for k in KINDS if k != kind])
    return verdict + (f": {asked}" if asked else "") + (f"; also found, not judged: {others}" if others else "")


def evidence(kind: str, first: str, found: Mapping[str, int]) -> str:
    """What the answer rests on: the kind's evidence against the first environment ``first``,
    with the count the bad step's comparison found."""
    count = counted(found, [kind])
    return KINDS[kind].evidence.format(first=first) + (f"; {count}" if count else "")


def against_itself(kind: str) -> str:
    """Why the first environment found ``kind`` against itself, and what to do."""
    if kind == SLOWDOWN:
        return "called slower than itself: raise --pairs"
    return f"has {KINDS[kind].many} against itself: not repeatable on this selection, so --kind {kind} cannot bisect"
