"""Compare two benchmark runs: what got slower or faster, by how much, and is it real.

Cases are matched on their key (model, device, scenario, workload, batch size,
lengths, LoRA settings), never on file order or test id. A case-metric is a
regression or an improvement only when its change passes the threshold *and* it is
significant against the noise between engine builds.

Why builds and not rounds: rounds within one engine build agree closely, but builds of
the same code settle at speeds up to 20 % or more apart on a shared CPU, so a test on
rounds calls that offset a change. The unit of the test is therefore one build of a
case (its row). Each metric's build-to-build spread is pooled over all shared cases
(in log space, as the noise is relative) with degrees of freedom counted per engine
build, not per case, since a build's offset moves all its cases together. Each
case-metric gets a t-test on its builds' mean log values, and the p-values are
adjusted over every case-metric (Benjamini-Hochberg): when nothing changed, as between
two runs of the same code, the chance of flagging anything is alpha; when things did
change, about alpha of the flags are expected to be false. With one build a side there
is no noise estimate and nothing is tested: the output says so.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lorabench.compare.load import METRICS, CompareError, Run, case_of
from lorabench.schema import STACK_COLUMNS

PROVENANCE_CHECKED = STACK_COLUMNS
DEFAULT_THRESHOLD = 0.10
DEFAULT_ALPHA = 0.05

REGRESSED, IMPROVED = "regressed", "improved"
WITHIN, NOT_SIGNIFICANT, TOO_FEW = "within threshold", "not significant", "too few builds"


def _log_builds(run: Run, key: str, metric: str) -> np.ndarray:
    """log(value) of every build of a case: the noise is relative, so it is additive in logs."""
    values = run.all_rows.loc[run.all_rows["_key"] == key, metric].to_numpy(dtype=float)
    return np.log(values[np.isfinite(values) & (values > 0)])


@dataclass
class Noise:
    """One metric's spread between builds of the same case, pooled over the shared cases."""

    sd: float  # standard deviation of log(value) of one build; nan when no case has 2 builds a side
    df: int  # degrees of freedom: engine builds, not cases, are the independent draws
    builds: int  # typical builds per case and side

    @property
    def pct(self) -> float:
        return (math.exp(self.sd) - 1.0) * 100.0


def _noise(base: Run, new: Run, logs: dict[str, tuple[np.ndarray, np.ndarray]], metric: str) -> Noise:
    """Pool the spread of each case's builds around the case's mean, on both sides.

    The spread is estimated from every case, but its degrees of freedom come from the
    builds behind it: all cases of one build share that build's offset.
    """
    squares, case_df, counts = 0.0, 0, []
    for y in (y for pair in logs.values() for y in pair):
        if len(y):
            squares += float(((y - y.mean()) ** 2).sum())
            case_df += len(y) - 1
            counts.append(len(y))
    keys = list(logs)
    df = 0
    for run in (base, new):
        shared = run.all_rows[run.all_rows["_key"].isin(keys) & run.all_rows[metric].notna()]
        df += sum(
            max(n - 1, 0)
            for n in shared.groupby("_engine")[["_run", "build"]].apply(lambda g: len(g.drop_duplicates()))
        )
    sd = math.sqrt(squares / case_df) if case_df else math.nan
    builds = Counter(counts).most_common(1)[0][0] if counts else 0
    return Noise(sd, df, builds)


@dataclass
class Finding:
    case: dict[str, str]
    metric: str
    base: float
    new: float
    ratio: float
    change_pct: float
    threshold_pct: float
    builds: tuple[int, int]  # builds behind base and new
    p_value: float | None  # t-test on the builds' log values, before adjustment
    p_adjusted: float | None  # Benjamini-Hochberg over every tested case-metric; decides the verdict
    verdict: str

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
    # and in every case at once (a change of the whole machine or engine).
    detectable_pct: dict[str, tuple[float, float]] = field(default_factory=dict)
    only_base: list[dict[str, str]] = field(default_factory=list)
    only_new: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Adapters whose greedy output changed between the runs: (model, adapter, base digests, new digests).
    digest_changes: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == REGRESSED]

    @property
    def failed(self) -> bool:
        """A regression, or an adapter that answers differently: what fails a gate."""
        return bool(self.regressions or self.digest_changes)


def digest_changes(base: Run, new: Run) -> list[tuple[str, str, str, str]]:
    """Adapters of the same model and device whose greedy digests differ between the sides."""
    if base.digests.empty or new.digests.empty:
        return []
    key = ["model", "device_type", "adapter"]
    sides = [d.groupby(key)["digest"].agg(lambda v: ", ".join(sorted(set(v)))) for d in (base.digests, new.digests)]
    both = sides[0].to_frame("base").join(sides[1].to_frame("new"), how="inner")
    changed = both[both["base"] != both["new"]]
    return [(model, adapter, row.base, row.new) for (model, _, adapter), row in changed.iterrows()]


def _t_test(xs: np.ndarray, ys: np.ndarray, noise: Noise) -> float | None:
    """Two-sided p-value of a difference in mean log value, with the pooled build noise."""
    from scipy.stats import t

    if noise.df < 1 or not len(xs) or not len(ys):
        return None
    se = noise.sd * math.sqrt(1 / len(xs) + 1 / len(ys))
    diff = float(ys.mean() - xs.mean())
    if se == 0:
        return 1.0 if diff == 0 else 0.0
    return float(2 * t.sf(abs(diff) / se, noise.df))


def compare(
    base: Run,
    new: Run,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    per_metric: dict[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> Comparison:
    """Every shared case-metric with its verdict, the noise it was judged against, and warnings."""
    if not 0 < alpha < 1:
        raise CompareError(f"--alpha {alpha}: a significance level lies between 0 and 1, such as 0.05")
    common = [k for k in new.rows.index if k in base.rows.index]
    if not common:
        raise CompareError(
            f"{base.label} and {new.label} have no case in common: compare runs of the same model, device and matrix"
        )
    # Metrics both sides measured (older files lack the newer ones).
    metrics = [m for m in METRICS if base.all_rows[m].notna().any() and new.all_rows[m].notna().any()]
    logs = {m: {k: (_log_builds(base, k, m), _log_builds(new, k, m)) for k in common} for m in metrics}
    noise = {metric: _noise(base, new, logs[metric], metric) for metric in metrics}
    findings = _findings(base, new, common, logs, noise, threshold, per_metric or {})
    _judge(findings, alpha)
    result = Comparison(
        base,
        new,
        findings,
        noise=noise,
        only_base=[case_of(k) for k in base.rows.index if k not in new.rows.index],
        only_new=[case_of(k) for k in new.rows.index if k not in base.rows.index],
    )
    result.detectable_pct = _detectable(noise, sum(f.p_value is not None for f in findings), alpha)
    result.warnings = _warnings(base, new, findings)
    result.digest_changes = digest_changes(base, new)
    return result


def _findings(
    base: Run, new: Run, common: list[str], logs: dict, noise: dict[str, Noise], threshold: float, per_metric: dict
) -> list[Finding]:
    findings = []
    for key in common:
        for metric in noise:
            b, n = float(base.rows.at[key, metric]), float(new.rows.at[key, metric])
            if math.isnan(b) or math.isnan(n) or b == 0:
                continue
            xs, ys = logs[metric][key]
            p = _t_test(xs, ys, noise[metric])
            limit = per_metric.get(metric, threshold) * 100.0
            change = (n - b) / b * 100.0
            findings.append(Finding(case_of(key), metric, b, n, n / b, change, limit, (len(xs), len(ys)), p, None, ""))
    return findings


def _judge(findings: list[Finding], alpha: float) -> None:
    """Adjust the p-values over every tested case-metric, then give each its verdict."""
    from scipy.stats import false_discovery_control

    tested = [f for f in findings if f.p_value is not None]
    if tested:
        for f, adjusted in zip(tested, false_discovery_control([f.p_value for f in tested])):
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


def _detectable(noise: dict[str, Noise], tested: int, alpha: float) -> dict[str, tuple[float, float]]:
    """Per metric, the smallest change flagged in one case alone, and in every case at once."""
    from scipy.stats import t

    out = {}
    for metric, nz in noise.items():
        if nz.df >= 1 and tested:
            lone, every = (t.ppf(1 - a / 2, nz.df) * nz.sd * math.sqrt(2 / nz.builds) for a in (alpha / tested, alpha))
            out[metric] = ((math.exp(lone) - 1.0) * 100.0, (math.exp(every) - 1.0) * 100.0)
    return out


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
    return warnings


def parse_thresholds(values: Sequence[str]) -> tuple[float, dict[str, float]]:
    """``["5%", "decode_ms=2%"]`` -> (0.05, {"decode_ms": 0.02}); a bare number is a percentage."""
    default, per_metric = DEFAULT_THRESHOLD, {}
    for value in values:
        metric, _, amount = value.rpartition("=")
        try:
            fraction = float(amount.strip().rstrip("%")) / 100.0
        except ValueError:
            raise CompareError(f"--threshold {value!r}: expected a percentage such as 10% or decode_ms=5%") from None
        if fraction < 0:
            raise CompareError(f"--threshold {value!r}: must not be negative")
        if not metric:
            default = fraction
        elif metric in METRICS:
            per_metric[metric] = fraction
        else:
            raise CompareError(f"--threshold {value!r}: unknown metric {metric!r}; metrics are {', '.join(METRICS)}")
    return default, per_metric
