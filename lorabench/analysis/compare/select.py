"""Which files a comparison reads and which test judges them, from what the user gave:
two A/B folders (pair by pair), runs of commits in a results folder, or result files.

The CLI, the pytest plugin and ``lorabench ab`` all come through here, so the same input
gets the same verdicts everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lorabench.analysis.compare.analysis import Comparison, compare
from lorabench.analysis.compare.load import Run, find_runs, load_noise_runs, load_run, split_paths
from lorabench.analysis.compare.options import DEFAULT_ALPHA, parse_thresholds
from lorabench.analysis.compare.paired import compare_pairs, is_ab_side


def run_comparison(
    base: str,
    new: str,
    *,
    thresholds: Sequence[str] = (),
    alpha: float | None = None,
    noise_from: str | None = None,
    results_dir: str | None = None,
    all_runs: bool = False,
) -> Comparison:
    """Compare ``base`` with ``new``: A/B folders, commit prefixes (with ``results_dir``),
    or result files (``A.csv,B.csv`` pools runs). Raises CompareError on bad input."""
    threshold, per_metric = parse_thresholds(thresholds)
    alpha = DEFAULT_ALPHA if alpha is None else alpha
    if is_ab_side(Path(base)) and is_ab_side(Path(new)):
        return compare_pairs(Path(base), Path(new), threshold=threshold, per_metric=per_metric, alpha=alpha)
    floor = load_noise_runs(noise_from) if noise_from else None
    if results_dir:
        base_paths = find_runs(Path(results_dir), base, all_runs=all_runs)
        new_paths = find_runs(Path(results_dir), new, all_runs=all_runs)
        if floor is None and not all_runs:
            floor = _earlier_runs(Path(results_dir), base)
    else:
        base_paths, new_paths = split_paths(base), split_paths(new)
    return compare(
        load_run(base_paths),
        load_run(new_paths),
        threshold=threshold,
        per_metric=per_metric,
        alpha=alpha,
        noise_from=floor,
    )


def _earlier_runs(results_dir: Path, commit: str) -> Run | None:
    """Every run of the base commit in the results folder, when there are 2 or more: their
    spread is the run-level noise floor."""
    runs = find_runs(results_dir, commit, all_runs=True)
    return load_run(runs) if len(runs) >= 2 else None
