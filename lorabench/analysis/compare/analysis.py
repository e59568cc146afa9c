"""Compare two benchmark runs: what got slower or faster, by how much, and is it real.

Cases are matched on their key (model, device, scenario, workload, batch size,
lengths, LoRA settings), never on file order or test id. A case-metric is a
regression or an improvement only when its change passes the threshold *and* it is
significant against the noise of the level the runs vary at.

Noise has levels: run, engine build, round (Kalibera and Jones, "Rigorous Benchmarking
in Reasonable Time", 2013). Rounds within one build agree closely; builds of one run
settle at speeds 5-20 % apart on a shared CPU; and whole runs of the same code drift
apart by as much again, as the machine's state changes between them. The unit of the
test is the highest level that repeats on a side:

- several runs on a side: each run's mean (over its builds) of a case is one draw, and
  the spread between runs, which holds the build spread within it, is the noise;
- one run a side, with earlier runs of one commit given (``noise_from``): the spread
  between those runs' means is a floor under the noise;
- one run a side and nothing more: builds are the draws; that cannot see drift between
  runs, and the comparison says that it assumes none (``lorabench ab`` measures both
  sides in alternation instead: ``lorabench.analysis.compare.paired``).

Each metric's spread is pooled over all shared cases (in log space, as the noise is
relative), with degrees of freedom counted per draw (engine build or run), not per case,
since a draw's offset moves all its cases together. Each case-metric gets a t-test on
its draws' mean log values, and the p-values are adjusted over every case-metric
(Benjamini-Hochberg): when nothing changed, the chance of flagging anything is alpha;
when things did change, about alpha of the flags are expected to be false. With one
build a side and no run noise there is no noise estimate and nothing is tested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from lorabench.analysis.cases import METRICS, case_of
from lorabench.analysis.compare import CompareError
from lorabench.analysis.compare.capacity import CapacityBound
from lorabench.analysis.compare.failures import failures
from lorabench.analysis.compare.load import Run
from lorabench.analysis.compare.noise import (
    BUILDS,
    Noise,
    benjamini_hochberg,
    detectable,
    estimate_noise,
    raise_to_run_floor,
    side_draws,
    t_sf,
)
from lorabench.analysis.compare.options import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from lorabench.analysis.compare.settings import setting_differences
from lorabench.results.schema import STACK_COLUMNS

PROVENANCE_CHECKED = STACK_COLUMNS

REGRESSED, IMPROVED = "regressed", "improved"
WITHIN, NOT_SIGNIFICANT, TOO_FEW = "within threshold", "not significant", "too few builds"


@dataclass
class Finding:
    case: dict[str, str]
    metric: str
    base: float
    new: float
    ratio: float
    change_pct: float
    threshold_pct: float
    builds: tuple[int, int]  # draws behind base and new: builds, runs or A/B pairs
    p_value: float | None  # t-test on the draws' log values, before adjustment
    p_adjusted: float | None  # Benjamini-Hochberg over every tested case-metric; decides the verdict
    verdict: str
    # A/B pairs: the log ratio's standard error and degrees of freedom (a sequential session's
    # bounds are read from them); None for runs compared build by build.
    se: float | None = None
    df: int | None = None

    @property
    def worse_pct(self) -> float:
        """The change in the bad direction: positive is worse, whichever way 'better' points."""
        return -self.change_pct if METRICS[self.metric] else self.change_pct


@dataclass
class Comparison:
    base: Run
    new: Run
    findings: list[Finding]
    noise: dict[str, Noise] = field(default_factory=dict)
    # Per metric, at this noise: the smallest change that can be flagged in one case alone,
    # and in every case at once (a change of the whole machine or engine); None where no
    # change short of noise.UNTESTABLE_PCT could be.
    detectable_pct: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    only_base: list[dict[str, str]] = field(default_factory=list)
    only_new: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # How the comparison was made and what it assumes, for the header.
    notes: list[str] = field(default_factory=list)
    # Adapters whose greedy output changed between the runs: (model, adapter, base digests, new digests).
    digest_changes: list[tuple[str, str, str, str]] = field(default_factory=list)
    # Cases whose capacity fell below the search's range on the new side (compare.capacity).
    capacity_collapses: list[str] = field(default_factory=list)
    # New searches that stopped with no verdict (requests failed, client fell behind).
    capacity_unjudged: list[str] = field(default_factory=list)
    # Cases whose capacity is a bound on either side, judged on the intervals (compare.capacity).
    capacity_bounds: list[CapacityBound] = field(default_factory=list)
    # Churn cases whose new side failed loads or unloads, isolation cases whose new side's
    # canaries found a breach or outputs changed by caching (compare.failures).
    churn_failures: list[str] = field(default_factory=list)
    isolation_failures: list[str] = field(default_factory=list)
    # Cases with prefix caching on whose new side found less of its prompts cached, cases whose
    # new side measured a core metric on no build (compare.failures).
    hit_rate_falls: list[str] = field(default_factory=list)
    # Online cases whose new side left a larger share of its requests unfinished (compare.failures).
    unfinished_rises: list[str] = field(default_factory=list)
    unmeasured: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == REGRESSED]

    @property
    def failed(self) -> bool:
        """A regression (a capacity bound's included), an adapter that answers differently, a
        capacity gone, a failed churn operation or a broken isolation: what fails a gate."""
        return bool(self.reasons())

    def reasons(self) -> str:
        """What fails it, counted in one phrase ("1 regression, 2 capacities collapsed"), or ""."""
        counts = (
            (len(self.regressions), "regression", "regressions"),
            (len(self.digest_changes), "changed adapter output", "changed adapter outputs"),
            (len(self.capacity_collapses), "capacity collapsed", "capacities collapsed"),
            (len(self.capacity_unjudged), "capacity search with no verdict", "capacity searches with no verdict"),
            (sum(b.change < 0 for b in self.capacity_bounds), "capacity bound regressed", "capacity bounds regressed"),
            (len(self.churn_failures), "churn case with failed operations", "churn cases with failed operations"),
            (len(self.isolation_failures), "isolation finding", "isolation findings"),
            (len(self.hit_rate_falls), "prefix hit rate fallen", "prefix hit rates fallen"),
            (len(self.unfinished_rises), "case with more requests unfinished", "cases with more requests unfinished"),
            (len(self.unmeasured), "case no longer measured", "cases no longer measured"),
        )
        return ", ".join(f"{n} {one if n == 1 else many}" for n, one, many in counts if n)


def _t_test(xs: np.ndarray, ys: np.ndarray, noise: Noise) -> float | None:
    """Two-sided p-value of a difference in mean log value, with the pooled build noise."""
    if noise.df < 1 or not len(xs) or not len(ys):
        return None
    se = noise.sd * math.sqrt(1 / len(xs) + 1 / len(ys))
    diff = float(ys.mean() - xs.mean())
    if math.isnan(se):
        return None
    if se == 0:
        return 1.0 if diff == 0 else 0.0
    return 2 * t_sf(abs(diff) / se, noise.df)


def shared_cases(base: Run, new: Run, alpha: float) -> tuple[list[str], list[str]]:
    """The case keys both sides have, and the metrics both measured (older files lack the newer ones)."""
    if not 0 < alpha < 1:
        raise CompareError(f"--alpha {alpha}: a significance level lies between 0 and 1, such as 0.05")
    common = [k for k in new.rows.index if k in base.rows.index]
    if not common:
        raise CompareError(
            f"{base.label} and {new.label} have no case in common: compare runs of the same model, device and matrix"
        )
    return common, [m for m in METRICS if base.all_rows[m].notna().any() and new.all_rows[m].notna().any()]


def compare(
    base: Run,
    new: Run,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    per_metric: dict[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
    noise_from: Run | None = None,
) -> Comparison:
    """Every shared case-metric with its verdict, the noise it was judged against, and warnings.

    ``noise_from``: earlier runs of one commit, whose spread is a floor under the noise
    when each side is a single run.
    """
    common, metrics = shared_cases(base, new, alpha)
    by_run = len(base.paths) > 1 or len(new.paths) > 1
    logs = {m: side_draws(base, new, m, common, by_run) for m in metrics}
    noise = {metric: estimate_noise(base, new, logs[metric], metric, by_run) for metric in metrics}
    if not by_run and noise_from is not None:
        raise_to_run_floor(noise, logs, noise_from, common)
    findings = _findings(base, new, common, logs, noise, threshold, per_metric or {})
    judge(findings, alpha)
    result = Comparison(
        base,
        new,
        findings,
        noise=noise,
        only_base=[case_of(k) for k in base.rows.index if k not in new.rows.index],
        only_new=[case_of(k) for k in new.rows.index if k not in base.rows.index],
        **failures(base, new, threshold, per_metric, alpha),
    )
    result.detectable_pct = detectable(noise, sum(f.p_value is not None for f in findings), alpha)
    result.warnings += _warnings(base, new, findings)
    result.notes = _notes(by_run, noise, noise_from)
    return result


def _notes(by_run: bool, noise: dict[str, Noise], noise_from: Run | None) -> list[str]:
    if by_run:
        return ["several runs a side: each run's mean is one draw, so drift between runs counts as noise"]
    if any(nz.level != BUILDS for nz in noise.values()):
        return [
            f"one run a side: noise no smaller than the spread of {len(noise_from.paths)} earlier runs of one commit"
        ]
    return [
        "one run a side: verdicts assume no drift between runs (on a shared machine, runs of the same code can "
        "drift 15 % apart); measure both sides in alternation with `lorabench ab`, or give --noise-from "
        "with repeated runs of the base commit"
    ]


def _findings(
    base: Run, new: Run, common: list[str], logs: dict, noise: dict[str, Noise], threshold: float, per_metric: dict
) -> list[Finding]:
    findings = []
    for key in common:
        for metric in noise:
            b, n = float(base.rows.at[key, metric]), float(new.rows.at[key, metric])
            if not (b > 0 and n > 0):  # unmeasured on a side: nothing to test (compare.failures says so)
                continue
            xs, ys = logs[metric][key]
            p = _t_test(xs, ys, noise[metric])
            limit = per_metric.get(metric, threshold) * 100.0
            ratio = _tested_ratio(xs, ys)
            counts = (len(xs), len(ys))
            findings.append(Finding(case_of(key), metric, b, n, ratio, (ratio - 1) * 100, limit, counts, p, None, ""))
    return findings


def _tested_ratio(xs: np.ndarray, ys: np.ndarray) -> float:
    """The change the t-test is on, the ratio of the draws' geometric means, as an A/B
    session's exp(mu): the arithmetic means' can point the other way where one side's builds
    spread widely (docs/compare.md#output-and-exit-status), and a verdict's direction must be
    the one tested."""
    return math.exp(float(ys.mean() - xs.mean()))  # both measured (above 0) on some draw: _findings


def judge(findings: list[Finding], alpha: float) -> None:
    """Adjust the p-values over every tested case-metric, then give each its verdict."""
    tested = [f for f in findings if f.p_value is not None]
    for f, adjusted in zip(tested, benjamini_hochberg([f.p_value for f in tested])):
        f.p_adjusted = float(adjusted)
    for f in findings:
        if abs(f.worse_pct) < f.threshold_pct:
            f.verdict = WITHIN
        elif f.p_adjusted is None:
            f.verdict = TOO_FEW
        elif f.p_adjusted >= alpha:
            f.verdict = NOT_SIGNIFICANT
        else:
            f.verdict = REGRESSED if f.worse_pct > 0 else IMPROVED


def _warnings(base: Run, new: Run, findings: list[Finding]) -> list[str]:
    warnings = []
    if any(f.p_value is None for f in findings):
        warnings.append(
            "one engine build per case on each side: the noise between builds cannot be measured, so no change "
            "is tested; run with matrix.builds >= 2 (or --bench-builds 2), or pool runs as A.csv,B.csv"
        )
    for column in PROVENANCE_CHECKED:
        if column in base.rows and column in new.rows and base.provenance(column) != new.provenance(column):
            warnings.append(f"{column} differs: {base.provenance(column) or '-'} -> {new.provenance(column) or '-'}")
    differences = setting_differences(base.paths, new.paths)
    if differences:
        warnings.append(f"the runs' configs differ, so a change may be the settings': {'; '.join(differences)}")
    beside = {name: _ran_beside(side) for name, side in (("base", base), ("new", new))}
    if beside["base"] != beside["new"]:
        crowded = "base" if beside["base"] else "new"
        warnings.append(
            f"{crowded} ran in a fleet, beside other configurations on its node, and the other side did not: its "
            "latencies include their interference; measure it with --bench-fleet-check (docs/fleet.md)"
        )
    return warnings


def _ran_beside(run: Run) -> bool:
    """Whether some row of ``run`` shared its node with another configuration (a fleet's)."""
    column = run.all_rows.get("fleet_neighbours")
    return column is not None and (column.notna() & column.astype(str).str.strip().ne("")).any()
