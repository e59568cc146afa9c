"""A/B results compared pair by pair: base and new measured in alternation on one node.

``lorabench ab`` leaves one result file per side and pair (``base/pair-003.csv``,
``new/pair-003.csv``). Within a pair the two sides ran back to back, so the machine's
state, which drifts between runs by as much as the changes people look for, is nearly
the same for both; the unit of the test is therefore the pair, not the build.

Per case-metric and pair, ``d = log(new / base)``. The pairs alternate which side runs
first (ABBA...), so a linear drift over the session adds ``+g`` to the pairs where new
ran second and ``-g`` where it ran first. With both orders present and 3 pairs or more,
``d`` is fitted as ``mu + g * order`` and ``mu`` is tested against the residual spread
(``n - 2`` degrees of freedom); otherwise the mean of ``d`` is tested (``n - 1``). Each
case-metric has its own spread, since pairs of different cases share the pair's state;
the p-values are adjusted over every case-metric (Benjamini-Hochberg) and judged with
the same threshold rule and verdicts as ``lorabench.analysis.compare.analysis``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lorabench.analysis.cases import case_of
from lorabench.analysis.compare import CompareError
from lorabench.analysis.compare.analysis import (
    Comparison,
    Finding,
    judge,
    shared_cases,
)
from lorabench.analysis.compare.failures import failures
from lorabench.analysis.compare.load import Run, load_run
from lorabench.analysis.compare.noise import Noise, case_run_means, detectable, t_sf

PAIRS = "A/B pairs (sd of one pair's log ratio new/base, drift removed)"
PAIR_NAME = re.compile(r"pair-(\d+)\.csv")
NO_RUNS = (np.array([], dtype=int), np.array([], dtype=float))  # a case one side did not measure


def pair_file(side_dir: Path, pair: int) -> Path:
    return side_dir / f"pair-{pair:03d}.csv"


def pair_files(side_dir: Path) -> dict[int, Path]:
    """The finished pair files of one side, by pair index (the files' ``ab_pair`` column where
    it is filled, else their name)."""
    found = {}
    for path in sorted(Path(side_dir).glob("pair-*.csv")):
        match = PAIR_NAME.fullmatch(path.name)
        if not match:
            continue
        column = pd.read_csv(path, usecols=lambda c: c == "ab_pair")
        filled = column["ab_pair"].dropna() if "ab_pair" in column else pd.Series(dtype=float)
        found[int(filled.iloc[0]) if len(filled) else int(match.group(1))] = path
    return found


def is_ab_side(path: Path) -> bool:
    """A folder of A/B pair files (its files are read by ``pair_files``, once)."""
    return Path(path).is_dir() and any(PAIR_NAME.fullmatch(p.name) for p in Path(path).glob("pair-*.csv"))


def load_pairs(base_dir: Path, new_dir: Path) -> tuple[Run, Run, np.ndarray]:
    """Both sides' complete pairs as runs (run ``i`` of each is pair ``i`` of the result),
    and each pair's order: +1 where new ran second, -1 where it ran first."""
    sides = [pair_files(Path(d)) for d in (base_dir, new_dir)]
    for d, files in zip((base_dir, new_dir), sides):
        if not files:
            raise CompareError(
                f"{d}: no A/B pair files (pair-NNN.csv) there; give the base/ and new/ folders of lorabench ab --out"
            )
    complete = sorted(set(sides[0]) & set(sides[1]))
    if not complete:
        raise CompareError(f"{base_dir} and {new_dir} have no pair in common: no finished pair to compare")
    base, new = (load_run([files[p] for p in complete]) for files in sides)
    return base, new, pair_order(base, new)


def pair_order(base: Run, new: Run) -> np.ndarray:
    """Each pair's order (run ``i`` of each side is pair ``i``), from when its turns
    started: +1 where new ran second, -1 where it ran first."""
    started = [run.all_rows.groupby("_run")["timestamp"].min() for run in (base, new)]
    return np.array([1.0 if started[1][i] > started[0][i] else -1.0 for i in range(len(base.paths))])


@dataclass(frozen=True)
class PairFit:
    """One case-metric's pairs: the mean log ratio new/base with linear drift removed."""

    estimate: float
    sd: float  # residual standard deviation of one pair's log ratio
    df: int
    scale: float  # the estimate's standard error is sd * scale
    pairs: int

    @property
    def p_value(self) -> float:
        se = self.sd * self.scale
        if se == 0:
            return 1.0 if self.estimate == 0 else 0.0
        return 2 * t_sf(abs(self.estimate) / se, self.df)


def fit_pairs(d: np.ndarray, order: np.ndarray) -> PairFit | None:
    """Fit ``d = mu + g * order`` where both orders are present and 3 pairs or more, else
    ``d = mu``; None under 2 pairs, where nothing can be tested."""
    n = len(d)
    if n >= 3 and len(set(order)) == 2:
        design = np.column_stack([np.ones(n), order])
        beta, *_ = np.linalg.lstsq(design, d, rcond=None)
        residual, df = d - design @ beta, n - 2
        scale = math.sqrt(np.linalg.inv(design.T @ design)[0, 0])
    elif n >= 2:
        beta, residual, df, scale = np.array([d.mean()]), d - d.mean(), n - 1, 1 / math.sqrt(n)
    else:
        return None
    return PairFit(float(beta[0]), math.sqrt(float(residual @ residual) / df), df, scale, n)


def compare_pairs(
    base_dir: Path,
    new_dir: Path,
    *,
    threshold: float,
    per_metric: dict[str, float] | None = None,
    alpha: float,
) -> Comparison:
    """Every shared case-metric of an A/B session, judged pair by pair."""
    base, new, order = load_pairs(base_dir, new_dir)
    return compare_paired_runs(base, new, order, threshold=threshold, per_metric=per_metric, alpha=alpha)


def compare_paired_runs(
    base: Run,
    new: Run,
    order: np.ndarray,
    *,
    threshold: float,
    per_metric: dict[str, float] | None = None,
    alpha: float,
) -> Comparison:
    """``compare_pairs`` on pairs loaded already: run ``i`` of each side is pair ``i``, run
    in the order ``order[i]`` (``pair_order``)."""
    common, metrics = shared_cases(base, new, alpha)
    findings, fits, partial = [], {m: [] for m in metrics}, {m: 0 for m in metrics}
    run_logs = {m: (case_run_means(base, m), case_run_means(new, m)) for m in metrics}
    for key in common:
        for metric in metrics:
            (b_runs, b), (n_runs, n) = (side.get(key, NO_RUNS) for side in run_logs[metric])
            pairs, in_b, in_n = np.intersect1d(b_runs, n_runs, assume_unique=True, return_indices=True)
            if not len(pairs):
                continue
            b, n = b[in_b], n[in_n]
            partial[metric] += len(pairs) < len(order)
            fit = fit_pairs(n - b, order[pairs])
            if fit is not None:
                fits[metric].append(fit)
            p = None if fit is None else fit.p_value
            ratio = math.exp(fit.estimate if fit else float(n.mean() - b.mean()))
            limit = (per_metric or {}).get(metric, threshold) * 100.0
            means = (float(np.exp(b).mean()), float(np.exp(n).mean()))  # over the pairs compared, as the ratio
            counts = (len(pairs), len(pairs))
            spread = {} if fit is None else {"se": fit.sd * fit.scale, "df": fit.df}
            findings.append(
                Finding(case_of(key), metric, *means, ratio, (ratio - 1) * 100, limit, counts, p, None, "", **spread)
            )
    judge(findings, alpha)
    noise = {m: _pooled_noise(f) for m, f in fits.items() if f}
    result = Comparison(base, new, findings, noise=noise, **failures(base, new, threshold, per_metric, alpha))
    result.only_base = [case_of(k) for k in base.rows.index if k not in new.rows.index]
    result.only_new = [case_of(k) for k in new.rows.index if k not in base.rows.index]
    result.detectable_pct = detectable(noise, sum(f.p_value is not None for f in findings), alpha)
    result.notes = [_order_note(order)]
    if len(order) < 4:
        result.warnings.append(_few_pairs_warning(len(order)))
    result.warnings += [
        f"{metric}: {count} case(s) not measured on both sides in every one of the {len(order)} pairs; each is "
        "compared on the pairs that measured it on both (a side that failed to measure it now and then?)"
        for metric, count in partial.items()
        if count
    ]
    return result


def _few_pairs_warning(pairs: int) -> str:
    if pairs < 2:
        return f"only {pairs} complete pair: nothing can be tested; run 6 pairs (lorabench ab's default)"
    return (
        f"only {pairs} complete pairs: each case-metric is tested on 1 degree of freedom, so only a change far "
        "above the noise is flagged; run 6 pairs (lorabench ab's default)"
    )


def _pooled_noise(fits: list[PairFit]) -> Noise:
    """One figure per metric for the header: the cases' residual spreads pooled, at the
    typical case's pairs (each case is tested on its own spread)."""
    sd = math.sqrt(sum(f.sd**2 * f.df for f in fits) / sum(f.df for f in fits))
    typical = max(fits, key=lambda f: sum(g.pairs == f.pairs for g in fits))
    return Noise(sd, typical.df, typical.pairs, PAIRS, typical.scale)


def _order_note(order: np.ndarray) -> str:
    sequence = "".join("AB" if o > 0 else "BA" for o in order)
    return (
        f"A/B: {len(order)} complete pairs, run in the order {sequence} (A base, B new); each case-metric is tested "
        "on its pairs' log ratios new/base, with linear drift over the session removed"
    )
