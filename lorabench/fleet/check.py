"""Interference, measured (``--bench-fleet-check``): whether a row measured beside neighbours
reads like one measured alone on this node.

Workers of a fleet share the host's cores, memory bandwidth and PCIe even when each has
its own accelerator. The check runs one engine configuration alone on the first slot, then
again while a copy of it runs on every other slot, alternating the two ``pairs`` times so
that a drift of the host falls on both sides alike. Each pair gives one ratio: the
geometric mean, over the configuration's cases, of beside / alone for a latency. The
ratio's interval is Student's t over the pairs' log ratios. Rows of a parallel run compare
with sequential ones when the whole interval lies within ``1 +- TOLERANCE``; they do not
when it lies wholly above; anything else is not shown either way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PAIRS = 3
TOLERANCE = 0.05  # the smallest slowdown a user of compare's default thresholds would mind
CONFIDENCE = 0.95
# The latencies compared, each where the case's rows fill it: a batch's end-to-end time and
# the decode and first-token medians every scenario with requests records.
METRICS = ("e2e_ms", "decode_ms_p50", "ttft_ms_p50")
# What a check's probe worker is told, so that a test can plant interference where the
# stand-in cannot feel it: "alone" or "beside".
ROLE_ENV = "LORABENCH_FLEET_CHECK"
_BUILD = re.compile(r"-build\d+$")


@dataclass(frozen=True)
class Verdict:
    metric: str
    ratio: float  # beside / alone, the geometric mean over pairs
    low: float
    high: float
    pairs: int

    @property
    def comparable(self) -> bool | None:
        """True: within the tolerance; False: beyond it, slower or faster beside neighbours;
        None: not shown either way."""
        if 1 - TOLERANCE <= self.low and self.high <= 1 + TOLERANCE:
            return True
        if self.low > 1 + TOLERANCE or self.high < 1 - TOLERANCE:
            return False
        return None

    @property
    def off_by(self) -> float:
        """How far the interval's nearer end lies from 1, as a factor."""
        return max(self.low, 1 / self.high)


def pair_ratio(alone: Mapping[str, float], beside: Mapping[str, float]) -> float | None:
    """The geometric mean of beside / alone over the cases both measured (positive values)."""
    logs = [math.log(beside[c] / alone[c]) for c in alone if c in beside and alone[c] > 0 and beside[c] > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def verdict(metric: str, ratios: Sequence[float]) -> Verdict | None:
    """The ratio over the pairs with its interval; None with fewer than two pairs."""
    if len(ratios) < 2:
        return None
    from scipy import stats  # a second of imports, for the check alone

    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, len(logs) - 1) * sd / math.sqrt(len(logs))
    return Verdict(metric, math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(ratios))


# On the CPU "alone" is one slot's cores, while a sequential run's engine has all of them.
CPU_CAVEAT = (
    " that ran on one slot's cores: a sequential run's engine has all the machine's (device_count says how many)"
)


def configuration(engine_id: str) -> str:
    """The engine configuration a task builds: its engine id without the build."""
    return _BUILD.sub("", engine_id)


def lines(engine_id: str, neighbours: int, verdicts: Sequence[Verdict], on_the_cpu: bool = False) -> list[str]:
    """What the check prints: a line a metric, then what it means for this node's rows of the
    configuration checked, named: the check measured that one only (``coverage`` names the rest)."""
    if not verdicts:
        return [f"fleet check: {engine_id}: no latency measured on both sides; nothing to tell"]
    checked = configuration(engine_id)
    others = f"{neighbours} other worker{'s' if neighbours > 1 else ''}"
    said = [
        f"fleet check: {engine_id} beside {others} / alone, {v.metric}: {v.ratio:.3f}x "
        f"({CONFIDENCE:.0%} interval {v.low:.3f}-{v.high:.3f}, {v.pairs} pairs)"
        for v in verdicts
    ]
    states = {v.comparable for v in verdicts}
    if False in states:
        worst = max((v for v in verdicts if v.comparable is False), key=lambda v: v.off_by)
        said.append(
            f"fleet check: NOT COMPARABLE for {checked}: beside its neighbours {engine_id} ran {worst.ratio:.2f}x as "
            f"long ({worst.metric}); compare a parallel run of this node with parallel runs only, or run sequentially"
        )
    elif states == {True}:
        said.append(
            f"fleet check: comparable for {checked} only: within {TOLERANCE:.0%} of alone on every latency; its rows "
            "of a parallel run compare with sequential ones on this node" + (CPU_CAVEAT if on_the_cpu else "")
        )
    else:
        said.append(
            f"fleet check: not shown either way for {checked}: an interval reaches past {TOLERANCE:.0%}; "
            "run the check again, or compare parallel runs with parallel runs only"
        )
    return said


def coverage(probe: str, engine_ids: Sequence[str]) -> list[str]:
    """The line that names the session's configurations the check did not measure: its verdict
    is the probe's configuration's alone. Another may feel its neighbours otherwise (more
    adapters, larger batches: more memory traffic), so none is implied comparable."""
    checked = configuration(probe)
    unchecked = list(dict.fromkeys(c for c in map(configuration, engine_ids) if c != checked))
    if not unchecked:
        return []
    total = len(unchecked) + 1
    return [
        f"fleet check: not checked: {', '.join(unchecked)} ({len(unchecked)} of the {total} configurations "
        f"selected): the verdict is {checked}'s alone; check another with -k selecting its cases"
    ]
