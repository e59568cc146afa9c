"""Does sequential stopping across builds (``matrix.max_builds`` with a precision target,
docs/metrics.md#sequential-stopping) keep its 95 % coverage? Seeded sessions of one batch case
(multilora, one workload, batch size 2) through the plugin itself, on the noisy stand-in of
scripts/bench_sequential_coverage.py: ``builds`` 2, ``max_builds`` 6 (looks at 2, 3, 5, 6
builds), rounds 3 to 12; each build's rounds all cost one factor of the build law more (real
builds differ more than rounds do), each round a small factor of its own on top (normal, 1 %).

The truth. On the virtual clock every headline value of a round is the noise-free one, ``v``,
times the round's factor ``B * R``: its build's ``B`` and its own ``R``; a row's figure is the
mean over its rounds, ``v * B * mean(R)``. The builds' interval is a t interval on the mean log
of those figures, so it is for ``v * exp(E[log B]) * exp(E[log mean(R)])``. The truth taken is
``v * exp(E[log B]) * exp(E[log R])``, the rounds mode's truth times the builds' own factor:
``log mean(R)`` exceeds the mean of ``log R`` by less than the rounds' variance over 2
(Jensen; 0.005 % at 1 %), and the rounds' own stop, decided on their spread, leaves the mean
of normal logs unbiased. ``v`` is a session with no noise at all.

Per build law and target it reports the coverage of each metric's interval at the look the
case stopped at, recomputed from the rows of the builds that ran with the plugin's own design
(``build_stops.design``), and of all three at once (goal: 93 % or more for a nominal 95 %); the
builds used; how often the target was reached; and the builds a fixed design (one 95 % t
interval) needs for it in 90 % of sessions, the noise known in advance. Seeds: session ``s``
(0 to sessions - 1) draws build ``b``'s factor from ``[s, b, 1]``, its rounds' from ``s`` (build
0) or ``[s, b]``. A pytest session each, about 0.4 s: the defaults take 15 min on 2 shared cores.

    python scripts/bench_build_coverage.py                       # 200 sessions per law and target
    python scripts/bench_build_coverage.py --sessions 20 --targets 5 --laws "normal 5 %" --out b.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench_sequential_coverage import Noise, NoisyStandIn, fixed_rounds

from lorabench.config import read_config_file
from lorabench.host.device import cpu_name
from lorabench.measure.sequential import HEADLINE
from lorabench.pytest_plugin.build_stops import design
from lorabench.pytest_plugin.session import STATE
from lorabench.targets.standin import write_config

ROOT = Path(__file__).resolve().parents[1]
MATRIX = {"builds": 2, "max_builds": 6, "rounds": 3, "max_rounds": 12, "warmup_rounds": 0}
NONE = Noise("none", 0.0)
LAWS = (
    NONE,
    Noise("normal 2 %", 0.02),
    Noise("normal 5 %", 0.05),
    Noise("normal 10 %", 0.10),
    Noise("t3 5 %", 0.05, heavy=True),
    Noise("spikes 10 % x1.3", 0.01, spikes=0.1),
)
TARGETS = (5.0, 2.0)
COLUMNS = (
    *("target", "build noise", "sd_log", *HEADLINE, "all", "builds mean", "builds min/med/max", "reached"),
    *("±% median", "rounds a build", "fixed design builds"),
)


class KeepRows:
    """A plugin that keeps the session's result rows."""

    def __init__(self) -> None:
        self.rows: list[Any] = []

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        writer = session.config.stash[STATE].writer
        self.rows = [] if writer is None else list(writer.rows)


def bench_config(folder: Path, target: float) -> Path:
    """A config with ``target`` in a folder of ``folder``; in ``folder`` (once) the batch case's
    module and an empty ini: none of the repository's pytest options."""
    if not (folder / "pytest.ini").exists():
        shutil.copy(ROOT / "bench" / "test_multilora.py", folder)
        (folder / "pytest.ini").write_text("[pytest]\n")
    return write_config(folder / f"target{target:g}", adapters=2, matrix={**MATRIX, "precision_pct": target})


def one_session(config: Path, builds: Noise, rounds: Noise, seed: int) -> list[Any]:
    """The case's rows, one a build that ran, in build order: a pytest session on the noisy stand-in."""
    folder, kept, backend = config.parent.parent, KeepRows(), NoisyStandIn(rounds, seed, builds=builds)
    args = [str(folder / "test_multilora.py"), "-c", str(folder / "pytest.ini"), "-p", "no:cacheprovider"]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = pytest.main([*args, "--bench-config", str(config)], plugins=[backend, kept])
    sys.modules.pop("test_multilora", None)  # a later session, from another folder too, imports its own
    if code != 0 or not kept.rows:
        raise RuntimeError(f"session {seed} ({builds.name}) exited {code}:\n{out.getvalue()[-3000:]}")
    return sorted(kept.rows, key=lambda row: row.build)


def judged(config: Path, rows: list[Any], truth: dict[str, float]) -> dict[str, Any]:
    """The builds' intervals at the look the case stopped at (the builds that ran), against the truth."""
    matrix = read_config_file(config).matrix
    verdict = design(matrix, matrix.builds).judge([{m: getattr(r, m) for m in HEADLINE} for r in rows])
    assert verdict is not None, f"{len(rows)} builds ran: not a look"
    slack = 1e-9  # the virtual clock's float rounding: noise-free builds agree to the last bits only
    covered = {m: i.low * (1 - slack) <= truth[m] <= i.high * (1 + slack) for m, i in verdict.intervals.items()}
    return {
        "builds": len(rows),
        "reached": verdict.reached,
        "half_width": verdict.half_width,
        "covered": covered,
        "rounds": float(np.mean([r.rounds for r in rows])),
    }


def fixed_builds(law: Noise, rounds: Noise, rounds_mean: float, target: float) -> int | None:
    """The fixed design's builds: a build's log value spreads by its law's and its mean round's."""
    sd = math.sqrt(law.sd_log**2 + rounds.sd_log**2 / rounds_mean)
    return 2 if sd == 0 else fixed_rounds(Noise("build", sd), target)


def summarize(law: Noise, rounds: Noise, target: float, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """One build law's and target's figures from its sessions'."""
    builds = np.array([s["builds"] for s in sessions])
    coverage = {m: float(np.mean([s["covered"][m] for s in sessions])) for m in HEADLINE}
    coverage["all"] = float(np.mean([all(s["covered"].values()) for s in sessions]))
    rounds_mean = float(np.mean([s["rounds"] for s in sessions]))
    return {
        "target_pct": target,
        "build_noise": law.name,
        "sd_log": round(law.sd_log, 4),
        "sessions": len(sessions),
        "coverage": {m: round(c, 3) for m, c in coverage.items()},
        "builds_mean": round(float(builds.mean()), 2),
        "builds_min_median_max": [int(builds.min()), int(np.median(builds)), int(builds.max())],
        "reached": round(float(np.mean([s["reached"] for s in sessions])), 3),
        "half_width_pct_median": round(100 * float(np.median([s["half_width"] for s in sessions])), 2),
        "rounds_mean": round(rounds_mean, 2),
        "fixed_design_builds": fixed_builds(law, rounds, rounds_mean, target),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    start, rounds = time.perf_counter(), Noise(f"normal {100 * args.round_sigma:g} %", args.round_sigma)
    laws = [law for law in LAWS if law.name in args.laws]
    settings = []
    gc.freeze()  # the objects so far out of each engine's gc.collect: sessions a third shorter
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as undo:
        undo.callback(gc.unfreeze)
        for target in args.targets:
            config = bench_config(Path(folder), target)
            free = one_session(config, NONE, NONE, 0)[0]  # the noise-free value: every build's the same
            for law in laws:
                truth = {m: getattr(free, m) * math.exp(law.mean_log + rounds.mean_log) for m in HEADLINE}
                found = [judged(config, one_session(config, law, rounds, s), truth) for s in range(args.sessions)]
                settings.append(summarize(law, rounds, target, found))
    return {
        **{k: v for k, v in MATRIX.items() if k != "warmup_rounds"},
        "round_noise": rounds.name,
        "truth_ms": {m: round(getattr(free, m), 4) for m in HEADLINE},
        "settings": settings,
        "wall_s": round(time.perf_counter() - start, 1),
        "cpu": cpu_name(),
    }


def table(figures: dict[str, Any]) -> list[str]:
    """The settings as a Markdown table, one line each, the header first."""
    rows = [COLUMNS, tuple("---" for _ in COLUMNS)]
    for s in figures["settings"]:
        cover, fixed, spread = s["coverage"], s["fixed_design_builds"], s["builds_min_median_max"]
        rows.append(
            (f"{s['target_pct']:g} %", s["build_noise"], f"{s['sd_log']:.3f}")
            + tuple(f"{cover[m]:.3f}" for m in (*HEADLINE, "all"))
            + (f"{s['builds_mean']:.2f}", "/".join(map(str, spread)), f"{s['reached']:.3f}")
            + (f"{s['half_width_pct_median']:.2f}", f"{s['rounds_mean']:.1f}", "-" if fixed is None else str(fixed))
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return ["| " + " | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + " |" for row in rows]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200, help="seeded sessions per build law and target")
    parser.add_argument("--targets", type=float, nargs="+", default=TARGETS, help="relative half-widths, percent")
    names = [law.name for law in LAWS]
    parser.add_argument("--laws", nargs="+", default=names, choices=names, help="the build laws (all by default)")
    parser.add_argument("--round-sigma", type=float, default=0.01, help="each round's own normal log noise")
    parser.add_argument("--out", help="also write the figures as JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = measure(args)
    m = MATRIX
    print(f"builds {m['builds']} to {m['max_builds']}, rounds {m['rounds']} to {m['max_rounds']}, ", end="")
    print(f"round noise {figures['round_noise']}, {args.sessions} sessions each, truth {figures['truth_ms']}")
    print("\n".join(table(figures)))
    print(f"wall {figures['wall_s']} s on {figures['cpu']}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
