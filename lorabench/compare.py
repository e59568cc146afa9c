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

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

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
PROVENANCE_CHECKED = (
    "device_type", "device_name", "hostname", "vllm_version", "vllm_ascend_version", "torch_version", "torch_npu_version",
    "toolkit_version", "driver_version", "firmware_version",
)
KEY_SEP = "\x1f"  # joins a case's key values into one index label
DEFAULT_THRESHOLD = 0.10
DEFAULT_ALPHA = 0.05

REGRESSED, IMPROVED = "regressed", "improved"
WITHIN, NOT_SIGNIFICANT, TOO_FEW = "within threshold", "not significant", "too few builds"
# The engine configuration a case ran on (plus whether it was the async one): builds,
# the independent draws of the noise, are counted per configuration.
ENGINE_KEY = ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras")


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
    rows: pd.DataFrame  # one row per case, indexed by the normalized case key; metrics averaged over builds
    all_rows: pd.DataFrame  # every build's row, with the run (``_run``) and engine (``_engine``) it came from

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
    frame["_key"] = [KEY_SEP.join(_norm(v) for v in values) for values in frame[list(CASE_KEY + TRACE_KEY)].itertuples(index=False)]
    online = frame["scenario"].astype(str).eq("online")
    frame["_engine"] = [
        KEY_SEP.join(_norm(v) for v in values) + ("-online" if o else "")
        for values, o in zip(frame[list(ENGINE_KEY)].itertuples(index=False), online)
    ]
    return frame


def _case(key: str) -> dict[str, str]:
    return dict(zip(CASE_KEY + TRACE_KEY, key.split(KEY_SEP)))


def _load_one(path: Path) -> pd.DataFrame:
    """The rows of a result file's latest run, one per case and build (a fixed file can hold several runs)."""
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
    rows = _keyed(rows).sort_values("timestamp")
    if "run_id" in rows and rows["run_id"].notna().all():
        rows = rows[rows["run_id"] == rows["run_id"].iloc[-1]]
    else:  # written before runs had an id: one build per case
        rows = rows.drop_duplicates("_key", keep="last")
    rows = rows.drop_duplicates(["_key", "build"] if "build" in rows else "_key", keep="last")
    return rows.assign(build=rows["build"] if "build" in rows else 0)


def split_paths(text: str) -> list[Path]:
    """``A.csv,B.csv``: several runs of the same code, pooled as one side."""
    return [Path(part) for part in text.split(",") if part]


def load_run(paths: Path | Sequence[Path]) -> Run:
    """Read one result file, or several runs of the same code to pool as one side.

    Each case's value is the mean over its builds (of every pooled run); the test sees
    every build, so pooling runs adds builds and with them power.
    """
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    all_rows = pd.concat([_load_one(p).assign(_run=i) for i, p in enumerate(paths)], ignore_index=True)
    aggregated = all_rows.groupby("_key").agg({c: "mean" if c in METRICS else "last" for c in all_rows.columns if c != "_key"})
    return Run(paths, aggregated, all_rows)


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
        df += sum(max(n - 1, 0) for n in shared.groupby("_engine")[["_run", "build"]].apply(lambda g: len(g.drop_duplicates())))
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

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == REGRESSED]


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
    from scipy.stats import false_discovery_control, t

    if not 0 < alpha < 1:
        raise CompareError(f"--alpha {alpha}: a significance level lies between 0 and 1, such as 0.05")
    per_metric = per_metric or {}
    common = [k for k in new.rows.index if k in base.rows.index]
    if not common:
        raise CompareError(
            f"{base.label} and {new.label} have no case in common: compare runs of the same model, device and matrix"
        )
    logs = {m: {k: (_log_builds(base, k, m), _log_builds(new, k, m)) for k in common} for m in METRICS}
    noise = {metric: _noise(base, new, logs[metric], metric) for metric in METRICS}
    findings = []
    for key in common:
        for metric in METRICS:
            b, n = float(base.rows.at[key, metric]), float(new.rows.at[key, metric])
            if math.isnan(b) or math.isnan(n) or b == 0:
                continue
            xs, ys = logs[metric][key]
            p = _t_test(xs, ys, noise[metric])
            limit = per_metric.get(metric, threshold) * 100.0
            findings.append(Finding(_case(key), metric, b, n, n / b, (n - b) / b * 100.0, limit, (len(xs), len(ys)), p, None, ""))
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
    result = Comparison(
        base,
        new,
        findings,
        noise=noise,
        only_base=[_case(k) for k in base.rows.index if k not in new.rows.index],
        only_new=[_case(k) for k in new.rows.index if k not in base.rows.index],
    )
    for metric, nz in noise.items():
        if nz.df >= 1 and tested:
            lone, every = (t.ppf(1 - a / 2, nz.df) * nz.sd * math.sqrt(2 / nz.builds) for a in (alpha / len(tested), alpha))
            result.detectable_pct[metric] = ((math.exp(lone) - 1.0) * 100.0, (math.exp(every) - 1.0) * 100.0)
    if any(f.p_value is None for f in findings):
        result.warnings.append(
            "one engine build per case on each side: the noise between builds cannot be measured, so no change "
            "is tested; run with matrix.builds >= 2 (or --bench-builds 2), or pool runs as A.csv,B.csv"
        )
    for column in PROVENANCE_CHECKED:
        if column in base.rows and column in new.rows and base.provenance(column) != new.provenance(column):
            result.warnings.append(f"{column} differs: {base.provenance(column) or '-'} -> {new.provenance(column) or '-'}")
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


MARKS = {REGRESSED: "REGRESSED", IMPROVED: "improved", WITHIN: "", NOT_SIGNIFICANT: "? not significant", TOO_FEW: "? too few builds"}


def _cells(f: Finding) -> list[str]:
    p = "" if f.p_adjusted is None else f"{f.p_adjusted:.3g}"
    return [case_label(f.case), f.metric, f"{f.base:.2f}", f"{f.new:.2f}", f"{f.ratio:.3f}", f"{f.change_pct:+.1f}%", p, MARKS[f.verdict]]


HEADER = ["case", "metric", "base", "new", "ratio", "change", "p (BH)", "verdict"]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    fmt = lambda r: "  ".join(c.ljust(w) if i < 2 or i == 7 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [fmt(HEADER), "  ".join("-" * w for w in widths), *(fmt(r).rstrip() for r in rows)]


def _preamble(c: Comparison) -> list[str]:
    lines = [
        f"base: {c.base.label}  commit {c.base.commit}",
        f"new:  {c.new.label}  commit {c.new.commit}",
    ]
    if c.detectable_pct:
        noise = ", ".join(f"{m} {nz.pct:.1f}% (df {nz.df})" for m, nz in c.noise.items())
        lines.append(f"noise between engine builds (sd of one build): {noise}")
        smallest = ", ".join(f"{m} {lone:.0f}% / {every:.0f}%" for m, (lone, every) in c.detectable_pct.items())
        lines.append(f"smallest change flagged at this noise, in one case alone / in every case: {smallest}")
    lines += [f"WARNING: {w}" for w in c.warnings]
    return lines


def _summary_line(c: Comparison) -> str:
    counts = {v: sum(f.verdict == v for f in c.findings) for v in (REGRESSED, IMPROVED, NOT_SIGNIFICANT, TOO_FEW)}
    return (
        f"{len({tuple(f.case.values()) for f in c.findings})} cases compared: {counts[REGRESSED]} regressed, "
        f"{counts[IMPROVED]} improved, {counts[NOT_SIGNIFICANT]} past the threshold but not significant, "
        f"{counts[TOO_FEW]} past the threshold with too few builds to test"
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
            "noise": {m: {"sd_pct": nz.pct, "df": nz.df, "builds": nz.builds} for m, nz in c.noise.items()},
            "detectable_pct": c.detectable_pct,
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
