"""How soon the nightly gate fails on a real step, and how often on noise alone.

Families of ``--series`` series (one case-metric each) of 27 nights at a noise CV, of which
one in ten takes a step on night 1; the gate (``lorabench.analysis.history.gate``) judges the
family each night after the step. Reported per noise and step:
- nights from the step to the gate's exit 1 (any regression), per trial: the share of trials
  failed by night 1, 2, 3, ...;
- per stepped series: the share named (REGRESSION or WATCH) each night, and failed each night;
- regressions of series that did not step (false ones), per family-night.
And on noise alone (no step anywhere), families judged as nights: exits 1 per 100 nights.

    python scripts/bench_gate_power.py --trials 40 --nights 7 --null-nights 300
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from lorabench.analysis.history.changes import change_points
from lorabench.analysis.history.gate import regressions, watch
from lorabench.analysis.history.series import Series
from lorabench.analysis.history.store import StoredRun
from lorabench.host.device import cpu_name

HISTORY = 27


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--nights", type=int, default=7, help="nights after the step judged")
    parser.add_argument("--null-nights", type=int, default=300, help="families of noise alone judged")
    parser.add_argument("--noise", type=float, nargs="+", default=[0.03, 0.08])
    parser.add_argument("--steps", type=float, nargs="+", default=[0.05, 0.10, 0.20])
    parser.add_argument("--seed", type=int, default=0)


def _series(points: np.ndarray, name: str) -> Series:
    runs = [StoredRun(f"r{i}", f"t{i:04d}", "s", {}) for i in range(len(points))]
    return Series(name, "decode_ms", runs, [np.array([p]) for p in points], change_points(points))


def family(rng: np.random.Generator, series: int, noise: float, step: float, nights: int) -> list[np.ndarray]:
    """Each series' points through ``nights`` nights after night 0 of the step (one in ten step)."""
    out = []
    for k in range(series):
        points = 10 * rng.lognormal(0, noise, HISTORY + nights)
        if step and k % 10 == 0:
            points[HISTORY:] *= 1 + step
        out.append(points)
    return out


def judge(points: list[np.ndarray], upto: int) -> tuple[set[str], set[str]]:
    """The series failed and watched when the family is judged after its first ``upto`` points."""
    found = [_series(p[:upto], f"s{k}") for k, p in enumerate(points)]
    failed = regressions(found, 0.05, {})
    watched = watch(found, 0.05, {}, failed)
    return {r.series.case for r in failed}, {w.series.case for w in watched}


def stepped_trials(args: argparse.Namespace, rng: np.random.Generator, noise: float, step: float) -> dict:
    stepped = {f"s{k}" for k in range(0, args.series, 10)}
    exit_by = np.zeros(args.nights)
    named, failed_share, false = np.zeros(args.nights), np.zeros(args.nights), 0
    for _ in range(args.trials):
        points = family(rng, args.series, noise, step, args.nights)
        first_exit = None
        for night in range(1, args.nights + 1):
            failed, watched = judge(points, HISTORY + night)
            named[night - 1] += len(stepped & (failed | watched)) / len(stepped)
            failed_share[night - 1] += len(stepped & failed) / len(stepped)
            false += len(failed - stepped)
            if failed and first_exit is None:
                first_exit = night
        if first_exit is not None:
            exit_by[first_exit - 1 :] += 1
    n = args.trials
    return {
        "noise": noise,
        "step": step,
        "trials": n,
        "exit_1_by_night": [round(v / n, 3) for v in exit_by],
        "stepped_named_by_night": [round(v / n, 3) for v in named],
        "stepped_failed_by_night": [round(v / n, 3) for v in failed_share],
        "false_regressions_per_family_night": round(false / (n * args.nights), 4),
    }


def null_nights(args: argparse.Namespace, rng: np.random.Generator, noise: float) -> dict:
    exits, watch_lines = 0, 0
    for _ in range(args.null_nights):
        points = family(rng, args.series, noise, 0.0, 0)
        failed, watched = judge(points, HISTORY)
        exits += bool(failed)
        watch_lines += len(watched)
    return {
        "noise": noise,
        "nights": args.null_nights,
        "exit_1_per_100_nights": round(100 * exits / args.null_nights, 2),
        "watch_lines_per_night": round(watch_lines / args.null_nights, 2),
    }


def main(args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    started = time.time()
    print(json.dumps({"cpu": cpu_name(), "series": args.series, "history_nights": HISTORY}))
    for noise in args.noise:
        for step in args.steps:
            print(json.dumps(stepped_trials(args, rng, noise, step)), flush=True)
        print(json.dumps(null_nights(args, rng, noise)), flush=True)
    print(json.dumps({"seconds": round(time.time() - started)}))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
