"""The front end's cost: the same cases in process and through ``vllm serve``.

Runs ``--pairs`` pairs of pytest sessions on the same selection and configuration, one
with ``--bench-target inprocess`` and one with ``--bench-target serve``, one engine build
each (``--bench-builds 1``); the pairs alternate which target goes first (in process
first in the first pair) so drift over the run falls on both sides alike. Each pair's
two result files are matched on the case key without ``target`` and without the
provenance columns; for each case and metric the pair gives one observation of
serve/inprocess and of serve - inprocess.

Metrics: ``ttft_ms_p50`` and the request e2e p50 (``request_e2e_ms_p50``, or the batch
``e2e_ms`` in files without it). Per case and metric: the ratio serve/inprocess (exp of
the mean log ratio over pairs, with its 95 % t-interval, as
scripts/crosscheck_vllm_latency.py's paired_ratio) and the difference in ms (mean over
pairs, 95 % t-interval). Overall: per pair the cases' mean log ratio and mean difference,
then the same over pairs. An interval needs 2 pairs.

Each session builds the engines its selection needs (a minute or two each on a 2-core
CPU, the serve side starting ``vllm serve``), so ``--pairs 2`` takes 5-10 minutes.

    python scripts/frontend_cost.py --pairs 2 --out frontend_cost.json
    python scripts/frontend_cost.py --pairs 4 -k "multilora and bs4" --out frontend_cost.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from scipy import stats

from lorabench.analysis.compare.load import _norm
from lorabench.host.device import cpu_name, stack_versions
from lorabench.results.schema import CASE_KEY, OLDER_FILES, PROVENANCE_COLUMNS

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
TARGETS = ("inprocess", "serve")
# Each metric and the columns that hold it, the first present and filled taken.
METRICS = {"ttft_ms_p50": ("ttft_ms_p50",), "e2e_ms_p50": ("request_e2e_ms_p50", "e2e_ms")}
# What pairs a case across targets: its key less the target and the provenance.
MATCH_KEY = tuple(c for c in CASE_KEY if c != "target" and c not in PROVENANCE_COLUMNS)


def _crosscheck():
    spec = importlib.util.spec_from_file_location("crosscheck_vllm_latency", HERE / "crosscheck_vllm_latency.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


paired_ratio = _crosscheck().paired_ratio


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pairs", type=int, default=2, help="pairs of sessions (one per target); an interval needs 2")
    parser.add_argument("-k", dest="select", default="multilora and distinct and bs4", help="pytest -k selection")
    parser.add_argument("--config", help="--bench-config for both sides (default: the ini's bench_config)")
    parser.add_argument("--out", type=Path, help="JSON file: every session and the summary (rewritten after each)")


class MatchError(Exception):
    pass


def case_values(path: Path, target: str) -> dict[tuple[str, ...], dict[str, float]]:
    """Each case of a result file (key: MATCH_KEY) -> its metrics, averaged over the file's
    rows of the case (one per build). Refuses a file with rows of another target."""
    frame = pd.read_csv(path)
    targets = {_norm(v) or OLDER_FILES["target"] for v in frame.get("target", pd.Series([""] * len(frame)))}
    if targets - {target}:
        raise MatchError(f"{path}: rows of target {', '.join(sorted(targets - {target}))}, expected {target}")
    cases: dict[tuple[str, ...], list[dict[str, float]]] = {}
    for _, row in frame.iterrows():
        key = tuple(_norm(row[c]) if c in frame else "" for c in MATCH_KEY)
        figures = {}
        for metric, columns in METRICS.items():
            value = next((row[c] for c in columns if c in frame and not pd.isna(row[c])), None)
            if value is not None:
                figures[metric] = float(value)
        cases.setdefault(key, []).append(figures)
    return {
        key: {m: statistics.fmean(r[m] for r in rows) for m in METRICS if all(m in r for r in rows)}
        for key, rows in cases.items()
    }


def case_name(key: tuple[str, ...]) -> str:
    """The case's filled key columns, as ``column=value`` (blank ones left out)."""
    return " ".join(f"{c}={v}" for c, v in zip(MATCH_KEY, key) if v != "")


def pair_observations(inprocess: Path, serve: Path) -> dict[str, dict[str, tuple[float, float]]]:
    """One pair of sessions: case name -> metric -> (inprocess, serve), for the cases and
    metrics both files have. Refuses files that share no case."""
    a, b = case_values(inprocess, "inprocess"), case_values(serve, "serve")
    shared = [k for k in a if k in b]
    if not shared:
        raise MatchError(f"{inprocess} and {serve} share no case (key without target and provenance)")
    return {case_name(k): {m: (a[k][m], b[k][m]) for m in METRICS if m in a[k] and m in b[k]} for k in shared}


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> dict:
    """Mean with its t-interval (None from one value)."""
    mean = statistics.fmean(values)
    result = {"pairs": len(values), "mean": mean, "low": None, "high": None}
    if len(values) >= 2:
        half = stats.t.ppf(0.5 + confidence / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        result.update(low=mean - half, high=mean + half)
    return result


def summarize(pairs: Sequence[dict[str, dict[str, tuple[float, float]]]]) -> dict:
    """Per case and metric, and overall per metric: the ratio serve/inprocess and the
    difference serve - inprocess in ms over ``pairs`` (each pair_observations's answer).
    Only cases and metrics every pair has are counted."""
    cases = [c for c in pairs[0] if all(c in p for p in pairs)]
    per_case: dict[str, dict] = {}
    overall: dict[str, dict] = {}
    for metric in METRICS:
        with_metric = [c for c in cases if all(metric in p[c] for p in pairs)]
        for case in with_metric:
            inproc = [p[case][metric][0] for p in pairs]
            serve = [p[case][metric][1] for p in pairs]
            per_case.setdefault(case, {})[metric] = {
                "inprocess_ms": inproc,
                "serve_ms": serve,
                "ratio": paired_ratio(serve, inproc),
                "difference_ms": mean_interval([s - i for s, i in zip(serve, inproc)]),
            }
        if with_metric:
            # Per pair, the cases' geometric means: their ratio is exp(mean log ratio).
            geo = [
                [math.exp(statistics.fmean(math.log(p[c][metric][side]) for c in with_metric)) for p in pairs]
                for side in (0, 1)
            ]
            differences = [statistics.fmean(p[c][metric][1] - p[c][metric][0] for c in with_metric) for p in pairs]
            overall[metric] = {
                "cases": len(with_metric),
                "ratio": paired_ratio(geo[1], geo[0]),
                "difference_ms": mean_interval(differences),
            }
    return {"cases": per_case, "overall": overall}


def figure_line(figures: dict) -> str:
    r, d = figures["ratio"], figures["difference_ms"]
    line = f"serve/inprocess {r['ratio']:.3f}"
    if r["low"] is not None:
        line += f" [{r['low']:.3f}, {r['high']:.3f}]"
    line += f", difference {d['mean']:+.1f} ms"
    if d["low"] is not None:
        line += f" [{d['low']:+.1f}, {d['high']:+.1f}]"
    return line


def report(summary: dict, header: dict) -> None:
    pairs = header["pairs"]
    interval = "95 % intervals over pairs" if pairs >= 2 else "no interval from one pair"
    print(f"frontend cost: CPU {header['cpu']}; vLLM {header['vllm']}; {pairs} pair(s), {interval}")
    for case, metrics in summary["cases"].items():
        print(f"  {case}")
        for metric, figures in metrics.items():
            print(f"    {metric}: {figure_line(figures)}")
    for metric, figures in summary["overall"].items():
        print(f"  overall ({figures['cases']} cases) {metric}: {figure_line(figures)}")


def session(args: argparse.Namespace, target: str, out: Path) -> float:
    command = [sys.executable, "-m", "pytest", str(ROOT / "bench"), "-q", "-p", "no:cacheprovider", "-k", args.select]
    command += ["--bench-builds", "1", "--bench-target", target, "--bench-output", str(out)]
    if args.config:
        command += ["--bench-config", str(Path(args.config).resolve())]
    start = time.monotonic()
    subprocess.run(command, check=True, cwd=ROOT)
    return time.monotonic() - start


def main(args: argparse.Namespace) -> int:
    if args.pairs < 1:
        sys.exit("--pairs: at least 1")
    header = {
        "measures": "serve/inprocess",
        "cpu": cpu_name(),
        "vllm": stack_versions()["vllm_version"],
        "select": args.select,
        "config": args.config,
        "pairs": args.pairs,
    }
    sessions: list[dict] = []
    observations: list[dict] = []
    with tempfile.TemporaryDirectory() as folder:
        for i in range(args.pairs):
            files = {}
            for target in TARGETS[:: 1 if i % 2 == 0 else -1]:
                files[target] = Path(folder) / f"{target}{i}.csv"
                seconds = session(args, target, files[target])
                sessions.append({"pair": i, "target": target, "order": len(sessions), "seconds": seconds})
            observations.append(pair_observations(files["inprocess"], files["serve"]))
            summary = summarize(observations)
            if args.out is not None:
                record = {**header, "sessions": sessions, "observations": observations, "summary": summary}
                args.out.write_text(json.dumps(record, indent=1))
            if i + 1 < args.pairs:
                for metric, figures in summary["overall"].items():
                    print(f"frontend cost: so far {metric} {figure_line(figures)}", flush=True)
    report(summarize(observations), header)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    try:
        sys.exit(main(parser.parse_args()))
    except MatchError as exc:
        sys.exit(f"frontend cost: {exc}")
