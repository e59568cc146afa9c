"""``lorabench ab --sequential``: after each pair from the third, the finished pairs are
compared at the look's level and the session stops where its verdict is decided
(``lorabench.analysis.compare.sequential`` has the design). What each look saw goes into the
session's record (``ab.json``), and the stop says how many pairs it saved."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from lorabench.ab.kinds import SLOWDOWN, found_in
from lorabench.ab.plan import BASE, NEW
from lorabench.analysis.compare.analysis import Comparison
from lorabench.analysis.compare.sequential import CLEARED, FIRST_LOOK, FOUND, decision, look_alpha, looks

SAID = {
    FOUND: "found what fails the session",
    CLEARED: "no case-metric can be slower than its threshold",
}


def needing_no_test(result: Comparison) -> int:
    """The comparison's findings that a look takes as they are: every kind but the timings'
    slowdowns, which ``decision`` judges on their bounds; collapsed capacities and capacities
    that regressed on their intervals (judged on intervals already)."""
    found = sum(n for kind, n in found_in(result).items() if kind != SLOWDOWN)
    return found + len(result.capacity_collapses) + sum(b.change < 0 for b in result.capacity_bounds)


@dataclass
class Looks:
    """The looks of one session: called with the number of complete pairs after each pair."""

    out: Path
    args: argparse.Namespace
    record: dict

    @staticmethod
    def design(args: argparse.Namespace) -> dict:
        """What a session's record keeps of its design, which ``--resume`` may not change: a
        sequential session's looks, their level and thresholds; nothing of a fixed one's."""
        if not args.sequential:
            return {"sequential": False}
        return {"sequential": True, "pairs": args.pairs, "alpha": args.alpha, "threshold": list(args.threshold)}

    @property
    def alpha(self) -> float:
        return look_alpha(self.args.alpha, self.args.pairs)

    def after(self, pairs: int, seconds_a_pair: float) -> bool:
        """Whether the session stops after ``pairs`` complete pairs."""
        if pairs < FIRST_LOOK or pairs >= self.args.pairs:
            return False
        from lorabench.analysis.compare import CompareError, compare_pairs, parse_thresholds

        threshold, per_metric = parse_thresholds(self.args.threshold)
        try:
            result = compare_pairs(
                self.out / BASE, self.out / NEW, threshold=threshold, per_metric=per_metric, alpha=self.alpha
            )
        except CompareError:
            return False
        found = needing_no_test(result)
        decided = decision(result, found, self.alpha)
        seen = self.record.setdefault("sequential", {"max_pairs": self.args.pairs, "looks": []})
        seen["looks"].append({"pairs": pairs, "found": found, "decided": decided})
        if decided is None:
            return False
        saved = self.args.pairs - pairs
        seen.update(stopped_at=pairs, saved_pairs=saved, decided=decided)
        print(
            f"lorabench ab: decided after {pairs} of {self.args.pairs} pairs ({SAID[decided]}, each look at alpha "
            f"{self.alpha:.3g} of {looks(self.args.pairs)} looks): {saved} pairs saved, about "
            f"{saved * seconds_a_pair / 60:.0f} min",
            file=sys.stderr,
        )
        return True
