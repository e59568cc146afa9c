"""Compare two benchmark runs: what got slower or faster, by how much, and is it real.

Cases are matched on their key (model, device, scenario, workload, batch size,
lengths, LoRA settings), never on file order or test id. A case-metric is a
regression or an improvement only when its change passes the threshold *and* a
two-sided Mann-Whitney U test on the per-round samples of both runs finds the
difference significant, as asv does; a change past the threshold that is not
significant, or that has too few rounds to test (fewer than 4 a side at alpha 0.05),
is shown as such and does not fail anything.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from lorabench.results import samples_path_for

CASE_KEY = (
    "model",
    "device_type",
    "scenario",
    "workload",
    "batch_size",
    "input_len",
    "output_len",
    "enable_lora",
    "max_loras",
    "max_lora_rank",
    "max_cpu_loras",
)
# Part of the key of online (trace replay) cases; blank in batch rows and older files.
TRACE_KEY = ("trace_suite", "trace_num_adapters", "trace_rate", "trace_alpha", "trace_cv")
# metric -> True when higher is better
METRICS = {
    "ttft_ms": False,
    "prefill_ms": False,
    "decode_ms": False,
    "e2e_ms": False,
    "output_tokens_per_s": True,
}
PROVENANCE_CHECKED = ("device_type", "device_name", "hostname", "vllm_version", "vllm_ascend_version", "torch_version", "torch_npu_version")
KEY_SEP = "\x1f"  # joins a case's key values into one index label
DEFAULT_THRESHOLD = 0.10
DEFAULT_ALPHA = 0.05

REGRESSED, IMPROVED = "regressed", "improved"
WITHIN, NOT_SIGNIFICANT, TOO_FEW = "within threshold", "not significant", "too few samples"


class CompareError(Exception):
    """Input that cannot be compared; the CLI exits with status 2."""


def _norm(value: Any) -> str:
    """One spelling per key value, whatever dtype pandas chose for the column."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


@dataclass
class Run:
    """One side of a comparison: one result file, or several runs of the same code pooled."""

    paths: list[Path]
    rows: pd.DataFrame  # one row per case, indexed by the normalized case key; metrics averaged over runs
    all_rows: pd.DataFrame  # every run's rows, for provenance
    samples: pd.DataFrame | None  # the samples behind ``rows``, with the run they came from

    @property
    def label(self) -> str:
        return ", ".join(map(str, self.paths))

    def provenance(self, column: str) -> str:
        values = sorted({_norm(v) for v in self.all_rows[column]}) if column in self.all_rows else []
        return ", ".join(values)

    @property
    def commit(self) -> str:
        commit = ", ".join(c[:12] for c in self.provenance("git_commit").split(", ")) or "unknown"
        dirty = self.all_rows["git_dirty"].astype(str).str.lower().eq("true").any()
        runs = f" ({len(self.paths)} runs)" if len(self.paths) > 1 else ""
        return commit + (" (dirty)" if dirty else "") + runs


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    for column in TRACE_KEY:
        if column not in frame:
            frame[column] = ""
    columns = list(CASE_KEY + TRACE_KEY)
    frame["_key"] = [KEY_SEP.join(_norm(v) for v in values) for values in frame[columns].itertuples(index=False)]
    return frame


def _case(key: str) -> dict[str, str]:
    return dict(zip(CASE_KEY + TRACE_KEY, key.split(KEY_SEP)))


def _load_one(path: Path) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """A result file's latest row per case (a fixed file can hold several runs) and those rows' samples."""
    if not path.is_file():
        raise CompareError(f"{path}: no such file")
    try:
        rows = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise CompareError(f"{path}: not a CSV file ({exc})") from None
    missing = [c for c in (*CASE_KEY, *METRICS, "timestamp") if c not in rows.columns]
    if missing:
        raise CompareError(f"{path}: not a lorabench result file: missing columns {', '.join(missing)}")
    if rows.empty:
        raise CompareError(f"{path}: has no result rows")
    rows = _keyed(rows).sort_values("timestamp").drop_duplicates("_key", keep="last")
    samples_path = samples_path_for(path)
    if not samples_path.is_file():
        return rows, None
    samples = _keyed(pd.read_csv(samples_path)).merge(rows[["_key", "timestamp"]], on=["_key", "timestamp"])
    return rows, samples


def load_run(paths: Path | Sequence[Path]) -> Run:
    """Read one result file, or several runs of the same code to pool as one side.

    Pooled, each case's value is the mean over the runs, and the significance test sees
    every run's rounds, so differences between engine builds count as noise.
    """
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    parts = [_load_one(p) for p in paths]
    all_rows = pd.concat([rows.assign(_run=i) for i, (rows, _) in enumerate(parts)], ignore_index=True)
    aggregated = all_rows.groupby("_key").agg({c: "mean" if c in METRICS else "last" for c in all_rows.columns if c != "_key"})
    samples = None
    if all(s is not None for _, s in parts):
        samples = pd.concat([s.assign(_run=i) for i, (_, s) in enumerate(parts)], ignore_index=True)
    return Run(paths, aggregated, all_rows, samples)


def find_runs(results_dir: Path, commit_prefix: str, *, all_runs: bool = False) -> list[Path]:
    """The newest run (or every run) in ``results_dir`` whose commit starts with ``commit_prefix``."""
    found: list[tuple[str, Path]] = []
    for csv in sorted(Path(results_dir).glob("*.csv")):
        if csv.name.endswith(".samples.csv"):
            continue
        try:
            head = pd.read_csv(csv, usecols=["git_commit", "timestamp"], dtype=str)
        except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
            continue
        if not head.empty and head["git_commit"].fillna("").str.startswith(commit_prefix).any():
            found.append((head["timestamp"].max(), csv))
    if not found:
        raise CompareError(f"{results_dir}: no result file of a commit starting with {commit_prefix!r}")
    found.sort()
    return [p for _, p in found] if all_runs else [found[-1][1]]


def samples_of(run: Run, key: str, metric: str) -> np.ndarray | None:
    """One value per measured round of the case, over all pooled runs.

    Rounds are the independent repetitions: the requests of one batch share their
    prefill and decode steps, so per-request values within a round are not independent
    samples. A per-request metric is averaged over the round's requests.
    """
    if run.samples is None:
        return None
    case = run.samples[run.samples["_key"] == key]
    if case.empty:
        return None
    rounds = case.groupby(["_run", "round"])
    if metric == "e2e_ms":
        return rounds["batch_e2e_ms"].first().to_numpy(dtype=float)
    if metric == "output_tokens_per_s":
        return (rounds["output_tokens"].sum() / (rounds["batch_e2e_ms"].first() / 1000.0)).to_numpy(dtype=float)
    return rounds[metric].mean().to_numpy(dtype=float)


def _min_p_value(n1: int, n2: int) -> float:
    """The smallest two-sided p-value an exact Mann-Whitney U test can reach."""
    return 2.0 / math.comb(n1 + n2, n1)


@dataclass
class Finding:
    case: dict[str, str]
    metric: str
    base: float
    new: float
    ratio: float
    change_pct: float
    threshold_pct: float
    p_value: float | None
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
    only_base: list[dict[str, str]] = field(default_factory=list)
    only_new: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == REGRESSED]


def compare(
    base: Run,
    new: Run,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    per_metric: dict[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> Comparison:
    from scipy.stats import mannwhitneyu

    per_metric = per_metric or {}
    common = [k for k in new.rows.index if k in base.rows.index]
    if not common:
        raise CompareError(
            f"{base.label} and {new.label} have no case in common: compare runs of the same model, device and matrix"
        )
    findings = []
    for key in common:
        case = _case(key)
        for metric, higher_better in METRICS.items():
            b, n = float(base.rows.at[key, metric]), float(new.rows.at[key, metric])
            if math.isnan(b) or math.isnan(n) or b == 0:
                continue
            change = (n - b) / b * 100.0
            limit = per_metric.get(metric, threshold) * 100.0
            xs, ys = samples_of(base, key, metric), samples_of(new, key, metric)
            testable = xs is not None and ys is not None and _min_p_value(len(xs), len(ys)) < alpha
            p = float(mannwhitneyu(xs, ys, alternative="two-sided").pvalue) if testable else None
            worse = -change if higher_better else change
            if abs(worse) < limit:
                verdict = WITHIN
            elif not testable:
                verdict = TOO_FEW
            elif p >= alpha:
                verdict = NOT_SIGNIFICANT
            else:
                verdict = REGRESSED if worse > 0 else IMPROVED
            findings.append(Finding(case, metric, b, n, n / b, change, limit, p, verdict))
    result = Comparison(
        base,
        new,
        findings,
        only_base=[_case(k) for k in base.rows.index if k not in new.rows.index],
        only_new=[_case(k) for k in new.rows.index if k not in base.rows.index],
    )
    for column in PROVENANCE_CHECKED:
        if column in base.rows and column in new.rows and base.provenance(column) != new.provenance(column):
            result.warnings.append(f"{column} differs: {base.provenance(column) or '-'} -> {new.provenance(column) or '-'}")
    if base.samples is None or new.samples is None:
        result.warnings.append("raw samples missing for one run: no change can be tested for significance")
    return result


def case_label(case: dict[str, str]) -> str:
    lora = f"loras{case['max_loras']}-rank{case['max_lora_rank']}-cpu{case['max_cpu_loras']}" if case["enable_lora"] == "True" else "lora-off"
    if case.get("trace_suite"):
        return (
            f"{case['scenario']} {lora} {case['trace_suite']} n{case['trace_num_adapters']} "
            f"a{case['trace_alpha']} cv{case['trace_cv']} r{case['trace_rate']}"
        )
    return f"{case['scenario']} {lora} bs{case['batch_size']} in{case['input_len']} out{case['output_len']}"


def _ordered(comparison: Comparison) -> list[tuple[str, list[Finding]]]:
    """Findings grouped by workload; worst regression first, within and across groups."""
    groups: dict[str, list[Finding]] = {}
    for f in comparison.findings:
        groups.setdefault(f.case["workload"], []).append(f)
    rank = {REGRESSED: 0, NOT_SIGNIFICANT: 1, TOO_FEW: 1, WITHIN: 2, IMPROVED: 3}
    for findings in groups.values():
        findings.sort(key=lambda f: (rank[f.verdict], -f.worse_pct))
    return sorted(groups.items(), key=lambda item: (rank[item[1][0].verdict], -item[1][0].worse_pct))


MARKS = {REGRESSED: "REGRESSED", IMPROVED: "improved", WITHIN: "", NOT_SIGNIFICANT: "? not significant", TOO_FEW: "? too few samples"}


def _cells(f: Finding) -> list[str]:
    p = "" if f.p_value is None else f"{f.p_value:.3g}"
    return [case_label(f.case), f.metric, f"{f.base:.2f}", f"{f.new:.2f}", f"{f.ratio:.3f}", f"{f.change_pct:+.1f}%", p, MARKS[f.verdict]]


HEADER = ["case", "metric", "base", "new", "ratio", "change", "p", "verdict"]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    fmt = lambda r: "  ".join(c.ljust(w) if i < 2 or i == 7 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [fmt(HEADER), "  ".join("-" * w for w in widths), *(fmt(r).rstrip() for r in rows)]


def _preamble(c: Comparison) -> list[str]:
    lines = [
        f"base: {c.base.label}  commit {c.base.commit}",
        f"new:  {c.new.label}  commit {c.new.commit}",
    ]
    lines += [f"WARNING: {w}" for w in c.warnings]
    return lines


def _summary_line(c: Comparison) -> str:
    counts = {v: sum(f.verdict == v for f in c.findings) for v in (REGRESSED, IMPROVED, NOT_SIGNIFICANT, TOO_FEW)}
    return (
        f"{len(c.findings) // len(METRICS) if c.findings else 0} cases compared: {counts[REGRESSED]} regressed, "
        f"{counts[IMPROVED]} improved, {counts[NOT_SIGNIFICANT]} past the threshold but not significant, "
        f"{counts[TOO_FEW]} past the threshold with too few samples to test"
    )


def _unmatched(c: Comparison) -> list[str]:
    lines = []
    for side, cases in (("base", c.only_base), ("new", c.only_new)):
        for case in cases:
            lines.append(f"only in {side}: {case['workload']} {case_label(case)}")
    return lines


def render_text(c: Comparison) -> str:
    lines = _preamble(c)
    for workload, findings in _ordered(c):
        lines += ["", f"workload: {workload}", *_table([_cells(f) for f in findings])]
    lines += ["", *_unmatched(c), _summary_line(c)]
    return "\n".join(lines)


def render_markdown(c: Comparison) -> str:
    lines = [f"- {line}" for line in _preamble(c)]
    for workload, findings in _ordered(c):
        lines += ["", f"### {workload}", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        lines += ["| " + " | ".join(_cells(f)) + " |" for f in findings]
    lines += ["", *(f"- {u}" for u in _unmatched(c)), "", _summary_line(c)]
    return "\n".join(lines)


def _records(c: Comparison) -> list[dict[str, Any]]:
    return [{**f.case, **{k: v for k, v in asdict(f).items() if k != "case"}} for f in c.findings]


def render_csv(c: Comparison) -> str:
    return pd.DataFrame(_records(c)).to_csv(index=False)


def render_json(c: Comparison) -> str:
    return json.dumps(
        {
            "base": {"paths": [str(p) for p in c.base.paths], "commit": c.base.commit},
            "new": {"paths": [str(p) for p in c.new.paths], "commit": c.new.commit},
            "warnings": c.warnings,
            "findings": _records(c),
            "only_base": c.only_base,
            "only_new": c.only_new,
            "regressions": len(c.regressions),
        },
        indent=2,
    )


RENDERERS = {"text": render_text, "markdown": render_markdown, "csv": render_csv, "json": render_json}


def plot(c: Comparison, out: Path) -> None:
    """One panel per metric: the new/base ratio of every case, regressions in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches
    import matplotlib.pyplot as plt

    labels = sorted({f"{f.case['workload']} {case_label(f.case)}" for f in c.findings})
    colors = {REGRESSED: "tab:red", IMPROVED: "tab:green", NOT_SIGNIFICANT: "tab:orange", TOO_FEW: "tab:orange", WITHIN: "tab:gray"}
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 0.35 * len(labels) + 1.5), sharey=True)
    for ax, metric in zip(axes, METRICS):
        by_label = {f"{f.case['workload']} {case_label(f.case)}": f for f in c.findings if f.metric == metric}
        ratios = [by_label[label].ratio if label in by_label else np.nan for label in labels]
        ax.barh(labels, ratios, color=[colors[by_label[label].verdict] if label in by_label else "white" for label in labels])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{metric} ({'higher' if METRICS[metric] else 'lower'} is better)", fontsize=9)
        ax.set_xlabel("new / base")
    axes[0].tick_params(axis="y", labelsize=7)
    legend = [(REGRESSED, "tab:red"), (IMPROVED, "tab:green"), ("past threshold, untested or not significant", "tab:orange"), (WITHIN, "tab:gray")]
    fig.legend(handles=[matplotlib.patches.Patch(color=c, label=t) for t, c in legend], loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(f"{c.base.commit} -> {c.new.commit}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)


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
