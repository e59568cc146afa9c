"""The noise a change is judged against, at the level the draws repeat: engine builds,
runs, or a floor from earlier runs of one commit (A/B pairs: ``paired``).

All in log space: the noise is relative, so it is additive in logs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lorabench.analysis.compare.load import Run

BUILDS = "engine builds (sd of one build)"
RUNS = "runs (sd of one run's mean)"
_NONE = pd.Series([], dtype=float)


def _measured(run: Run, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """The rows where ``metric`` is measured (positive) and their log values. Only the metric's
    column is filtered: filtering the rows copied every column, for each metric and side
    (with ``estimate_noise``'s alike, 40 % of comparing two runs)."""
    values = run.all_rows[metric].to_numpy(dtype=float)
    kept = values > 0
    return kept, np.log(values[kept])


def case_logs(run: Run, metric: str) -> dict[str, pd.Series]:
    """Each case's log(value) of every build, indexed by the run it came from. One pass over
    the rows a metric: filtering them again for every case made a comparison quadratic."""
    kept, values = _measured(run, metric)
    logs = pd.Series(values, index=run.all_rows["_run"].to_numpy()[kept])
    return dict(tuple(logs.groupby(run.all_rows["_key"].to_numpy()[kept], sort=False)))


def run_means(logs: dict[str, pd.Series], key: str) -> pd.Series:
    """Each run's mean of a case's log values, indexed by run."""
    return logs.get(key, _NONE).groupby(level=0).mean()


def case_run_means(run: Run, metric: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each case's ``run_means`` as arrays, its runs (ascending) and their means, from one
    grouping of the rows by case and run, not one for every case: an A/B comparison asks
    for every case's, each metric. Arrays, cut where the sorted grouping's case changes:
    a Series a case took three quarters of this function's time."""
    kept, values = _measured(run, metric)
    means = pd.Series(values).groupby([run.all_rows[c].to_numpy()[kept] for c in ("_key", "_run")]).mean()
    keys, runs = (means.index.get_level_values(level).to_numpy() for level in (0, 1))
    starts = [0, *np.flatnonzero(keys[1:] != keys[:-1]) + 1, len(keys)]
    return {keys[a]: (runs[a:b], means.to_numpy()[a:b]) for a, b in zip(starts, starts[1:]) if a < b}


def log_draws(logs: dict[str, pd.Series], key: str, by_run: bool) -> np.ndarray:
    """A case's draws: every build's log value, or with ``by_run`` each run's mean of them."""
    return (run_means(logs, key) if by_run else logs.get(key, _NONE)).to_numpy()


def side_draws(base: Run, new: Run, metric: str, keys: list[str], by_run: bool) -> dict[str, tuple[np.ndarray, ...]]:
    """Each case's draws of one metric on both sides."""
    b, n = case_logs(base, metric), case_logs(new, metric)
    return {k: (log_draws(b, k, by_run), log_draws(n, k, by_run)) for k in keys}


@dataclass
class Noise:
    """One metric's spread between draws (builds, runs or A/B pairs) of a case, pooled over cases."""

    sd: float  # standard deviation of log(value) of one draw; nan when no case has 2 draws a side
    df: int  # degrees of freedom: draws (builds, runs, pairs), not cases, are independent
    draws: int  # typical draws per case and side
    level: str = BUILDS
    scale: float = math.nan  # a case's change has standard error sd * scale; nan: two-sample, sqrt(2 / draws)

    @property
    def pct(self) -> float:
        return (math.exp(self.sd) - 1.0) * 100.0

    @property
    def se(self) -> float:
        """Standard error of a typical case's change, in log units."""
        scale = self.scale if not math.isnan(self.scale) else math.sqrt(2 / self.draws) if self.draws else math.nan
        return self.sd * scale


def pooled(logs: dict[str, tuple[np.ndarray, ...]]) -> tuple[float, int]:
    """The spread of each case's draws around the case's mean, pooled; and the typical draw count."""
    squares, case_df, counts = 0.0, 0, []
    for y in (y for group in logs.values() for y in group):
        if len(y):
            squares += float(((y - y.mean()) ** 2).sum())
            case_df += len(y) - 1
            counts.append(len(y))
    sd = math.sqrt(squares / case_df) if case_df else math.nan
    return sd, Counter(counts).most_common(1)[0][0] if counts else 0


def estimate_noise(
    base: Run, new: Run, logs: dict[str, tuple[np.ndarray, np.ndarray]], metric: str, by_run: bool
) -> Noise:
    """Pool the spread of each case's draws around the case's mean, on both sides.

    The spread is estimated from every case, but its degrees of freedom come from the
    draws behind it: all cases of one build (or run) share that build's offset.
    """
    sd, draws = pooled(logs)
    keys = list(logs)
    df = 0
    for run in (base, new):
        rows = run.all_rows
        # The shared rows of the columns needed, not the rows whole (that copied every column).
        # The rows the draws come from (``_measured``): a build that measured nothing adds no freedom.
        shared = (rows["_key"].isin(keys) & (rows[metric] > 0)).to_numpy()
        if by_run:
            df += max(len(set(rows["_run"].to_numpy()[shared])) - 1, 0)
            continue
        # Each engine's distinct builds (the build spelled as text, so a missing one is one
        # value): counted in plain Python, a fifth of pandas's time on a run's few rows.
        columns = (rows["_engine"], rows["_run"], rows["build"].astype(str))
        builds = set(zip(*(column.to_numpy()[shared] for column in columns)))
        df += sum(count - 1 for count in Counter(engine for engine, _, _ in builds).values())
    return Noise(sd, df, draws, RUNS if by_run else BUILDS)


def run_floor(runs: Run, keys: list[str], metric: str) -> Noise | None:
    """The spread between the means of earlier runs of one commit: how far one run's mean
    of a case strays, drift between runs included; None with fewer than 2 runs."""
    if len(runs.paths) < 2:
        return None
    earlier = case_logs(runs, metric)
    logs = {k: (log_draws(earlier, k, by_run=True),) for k in keys}
    sd, _ = pooled(logs)
    if math.isnan(sd):
        return None
    level = f"runs, floor from {len(runs.paths)} earlier runs of one commit (sd of one run's mean)"
    return Noise(sd, len(runs.paths) - 1, 1, level)


def raise_to_run_floor(noise: dict[str, Noise], logs: dict, runs: Run, common: list[str]) -> None:
    """Where earlier runs stray more than this run's builds do, test each side's mean against that."""
    for metric in noise:
        floor, current = run_floor(runs, common, metric), noise[metric].se
        if floor is None or (not math.isnan(current) and floor.se <= current):
            continue
        noise[metric] = floor
        logs[metric] = {
            k: tuple(y[:0] if not len(y) else np.array([y.mean()]) for y in xy) for k, xy in logs[metric].items()
        }


# Past this a figure says nothing but "cannot be tested": no benchmark looks for an
# elevenfold change, and on 1 degree of freedom the t quantile runs to astronomical figures.
UNTESTABLE_PCT = 1000.0


def detectable(noise: dict[str, Noise], tested: int, alpha: float) -> dict[str, tuple[float | None, float | None]]:
    """Per metric, the smallest change flagged in one case alone, and in every case at once;
    None where that change would pass ``UNTESTABLE_PCT`` (or is no number at all): at this
    noise and with these degrees of freedom, no change of that kind can be tested."""
    out = {}
    for metric, nz in noise.items():
        if nz.df >= 1 and tested:
            lone, every = (_pct(t_ppf(1 - a / 2, nz.df) * nz.se) for a in (alpha / tested, alpha))
            out[metric] = (lone, every)
    return out


def t_sf(x: float, df: float) -> float:
    """Student's t survival function, computed as ``scipy.stats.t.sf`` computes it
    (``scipy.special.stdtr``) without importing ``scipy.stats``, whose import alone costs
    every ``lorabench compare`` half a second, and without its per-call checks."""
    from scipy.special import stdtr

    return float(stdtr(df, -x))


def t_ppf(q: float, df: float) -> float:
    """Student's t quantile, as ``scipy.stats.t.ppf`` computes it (``scipy.special.stdtrit``)."""
    from scipy.special import stdtrit

    return float(stdtrit(df, q))


def _pct(log_change: float) -> float | None:
    if not math.isfinite(log_change) or log_change > math.log1p(UNTESTABLE_PCT / 100.0):
        return None
    return (math.exp(log_change) - 1.0) * 100.0


def benjamini_hochberg(p_values: Sequence[float]) -> np.ndarray:
    """The p-values adjusted for a false discovery rate, step for step as
    ``scipy.stats.false_discovery_control`` does it (without importing ``scipy.stats``):
    sorted, each times m / rank, then the smallest of it and every one ranked above it."""
    ps = np.asarray(p_values, dtype=float)
    if len(ps) <= 1:
        return ps
    order = np.argsort(ps)
    adjusted = ps[order] * (len(ps) / np.arange(1, len(ps) + 1, dtype=float))
    np.minimum.accumulate(adjusted[::-1], out=adjusted[::-1])
    out = np.empty_like(adjusted)
    out[order] = adjusted
    return np.clip(out, 0.0, 1.0)
