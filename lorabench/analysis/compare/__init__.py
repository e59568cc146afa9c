"""Compare two benchmark runs: ``load`` reads them, ``analysis`` decides what changed,
``render`` shows it."""

from lorabench.analysis.compare.analysis import (
    DEFAULT_ALPHA,
    DEFAULT_THRESHOLD,
    IMPROVED,
    NOT_SIGNIFICANT,
    REGRESSED,
    TOO_FEW,
    WITHIN,
    Comparison,
    Finding,
    Noise,
    compare,
    parse_thresholds,
)
from lorabench.analysis.compare.load import (
    METRICS,
    CompareError,
    Run,
    find_runs,
    load_noise_runs,
    load_run,
    split_paths,
)
from lorabench.analysis.compare.paired import compare_pairs, is_ab_side
from lorabench.analysis.compare.render import RENDERERS, case_label, plot, render_by_rank, render_text

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_THRESHOLD",
    "IMPROVED",
    "METRICS",
    "NOT_SIGNIFICANT",
    "REGRESSED",
    "RENDERERS",
    "TOO_FEW",
    "WITHIN",
    "CompareError",
    "Comparison",
    "Finding",
    "Noise",
    "Run",
    "case_label",
    "compare",
    "compare_pairs",
    "find_runs",
    "is_ab_side",
    "load_noise_runs",
    "load_run",
    "parse_thresholds",
    "plot",
    "render_by_rank",
    "render_text",
    "split_paths",
]
