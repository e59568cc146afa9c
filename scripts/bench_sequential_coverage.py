"""Does sequential stopping (--bench-precision) keep its 95 % coverage? Seeded sessions of one
batch case on the stand-in engine, each round's costs scaled by a noise factor whose law the
script sets, so the truth is known: the geometric mean of the per-round values, which the
intervals are for (docs/metrics.md#sequential-stopping), is the noise-free round's value times
exp(E[log factor]).

Per noise law it reports the coverage of the per-case intervals at the round each case stopped
(goal: 93 % or more for a nominal 95 %), the rounds used, how often the target was reached, and
the rounds a fixed design (no looks, one 95 % t interval) needs for the same precision: the
fewest that reach it in 90 % of sessions, with the noise known in advance, which a real run
never knows. For contrast it also reports what the naive rule (a fixed-n t interval checked
after every round) covers under the same noise, from a numpy simulation of the per-round
values. The stand-in runs on a virtual clock: 1,000 sessions take seconds. Across builds
(``matrix.max_builds``, each build a noise factor of its own): scripts/bench_build_coverage.py.

    python scripts/bench_sequential_coverage.py                     # 200 sessions per noise law
    python scripts/bench_sequential_coverage.py --sessions 50 --out coverage.json
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from lorabench.config import engine_specs, read_config_file, resolve_config
from lorabench.host.device import cpu_name
from lorabench.measure.correctness import DigestBook
from lorabench.measure.sequential import HEADLINE
from lorabench.scenarios.base import Context
from lorabench.scenarios.batch import run_batch
from lorabench.targets.standin import Costs, StandIn, StandInEngine, write_config

ALPHA = 0.05
SPIKE = 1.3  # a spiky round of the "spikes" law is this much slower


@dataclass(frozen=True)
class Noise:
    """The law of a round's log factor: normal with ``sigma``, Student's t with 3 degrees of
    freedom scaled to ``sigma`` (``heavy``), or normal plus a ``SPIKE`` in ``spikes`` of rounds."""

    name: str
    sigma: float
    heavy: bool = False
    spikes: float = 0.0

    def draws(self, rng: np.random.Generator, size: int | tuple[int, ...] | None = None) -> Any:
        base = rng.standard_t(3, size) / math.sqrt(3) if self.heavy else rng.standard_normal(size)
        return self.sigma * base + math.log(SPIKE) * (rng.random(size) < self.spikes)

    @property
    def mean_log(self) -> float:
        return self.spikes * math.log(SPIKE)

    @property
    def sd_log(self) -> float:
        return math.sqrt(self.sigma**2 + self.spikes * (1 - self.spikes) * math.log(SPIKE) ** 2)


LAWS = (
    Noise("normal 0.5 %", 0.005),
    Noise("normal 2 %", 0.02),
    Noise("normal 4 %", 0.04),
    Noise("normal 8 %", 0.08),
    Noise("t3 2 %", 0.02, heavy=True),
    Noise("spikes 10 % x1.3", 0.01, spikes=0.1),
)


class NoisyEngine(StandInEngine):
    """The stand-in whose every batch (one round) costs ``exp(noise.draw())`` times its costs:
    prefill, decode and LoRA steps alike, so on a virtual clock each headline value of a round
    is the noise-free one times that factor, exactly. ``build_factor`` multiplies every round's
    on top: the build's own (scripts/bench_build_coverage.py), 1 unless a build noise is set."""

    noise = Noise("none", 0.0)
    rng = np.random.default_rng(0)
    build_factor = 1.0

    def generate(self, prompts: Any, adapters: Any, output_len: int, **how: Any) -> list[Any]:
        factor = math.exp(float(self.noise.draws(self.rng))) * self.build_factor
        c = self.costs
        self.llm.costs = replace(
            c,
            prefill_ms_per_token=c.prefill_ms_per_token * factor,
            decode_ms_per_step=c.decode_ms_per_step * factor,
            lora_ms_per_adapter=c.lora_ms_per_adapter * factor,
        )
        return super().generate(prompts, adapters, output_len, **how)


class NoisyStandIn(StandIn):
    """A backend for the plugin (``plugins=[NoisyStandIn(noise, seed)]``) that builds ``NoisyEngine``s;
    with ``builds`` (a law), each build's rounds all cost one factor of that law more, drawn
    from a stream of the seed and the build's own (none drawn without it)."""

    def __init__(self, noise: Noise, seed: int = 0, costs: Costs | None = None, builds: Noise | None = None) -> None:
        super().__init__(costs, virtual_clock=True)
        self.noise, self.seed, self.builds = noise, seed, builds

    def engine(self, config: Any, spec: Any, device_type: str, log_path: Path | None) -> StandInEngine:
        weights = {a.name: "" for a in config.adapters}
        engine = NoisyEngine(config, spec, device_type, log_path, costs=self.costs, weights=weights, virtual_clock=True)
        # Each build its own stream of noise, as real builds differ (build 0's is the seed's own).
        seed = self.seed if spec.build == 0 else [self.seed, spec.build]
        engine.noise, engine.rng = self.noise, np.random.default_rng(seed)
        if self.builds is not None:  # [seed, build, 1]: apart from every build's rounds' stream
            engine.build_factor = math.exp(float(self.builds.draws(np.random.default_rng([self.seed, spec.build, 1]))))
        self.engines.append(engine)
        return engine


class Pedantic:
    """pytest-benchmark's fixture as a scenario uses it, outside pytest: pedantic's rounds, warm-ups first."""

    disabled = False
    stats = None

    def pedantic(self, target: Any, *, rounds: int, warmup_rounds: int, iterations: int = 1) -> None:
        for _ in range(warmup_rounds + rounds):
            target()


def case_runner(folder: Path, matrix: dict[str, Any]) -> tuple[NoisyEngine, Context]:
    """A stand-in engine on a virtual clock (not yet built) and a scenario's context for ``matrix``."""
    path = write_config(folder, adapters=2, matrix=matrix)
    config = resolve_config(path, read_config_file(path), needs_lora=False)
    (spec,) = engine_specs(config.file, with_lora_off=False)
    costs = Costs(prefill_ms_per_token=0.05, decode_ms_per_step=2.0, lora_ms_per_adapter=0.5)
    engine = NoisyEngine(config, spec, "cpu", None, costs=costs, weights={}, virtual_clock=True)
    return engine, Context(config, Pedantic(), DigestBook(), keep=lambda *a: Path())


def one_session(engine: NoisyEngine, ctx: Context, noise: Noise, seed: int) -> dict[str, Any]:
    engine.noise, engine.rng = noise, np.random.default_rng(seed)
    outcome = run_batch(ctx, engine, batch_size=2, workload=None)
    return {**outcome.fields, "intervals": outcome.extra_info["intervals"]}


def covers(interval: dict[str, float], truth: float) -> bool:
    """Whether a row's interval (its ``extra_info["intervals"][metric]``) holds ``truth``."""
    center, width = interval["center"], interval["half_width"]
    return center / (1 + width) <= truth <= center * (1 + width)


def fixed_rounds(noise: Noise, target_pct: float, assurance: float = 0.9, most: int = 10_000) -> int | None:
    """The fewest rounds whose fixed 95 % t interval on the log values is within the target
    in ``assurance`` of sessions, the noise's spread known (normal law of its log)."""
    limit = math.log1p(target_pct / 100.0)
    for n in range(2, most):
        q = stats.t.ppf(1 - ALPHA / 2, n - 1)
        bound = (n - 1) * (limit * math.sqrt(n) / (q * noise.sd_log)) ** 2
        if stats.chi2.cdf(bound, n - 1) >= assurance:
            return n
    return None


def naive_coverage(noise: Noise, target_pct: float, low: int, high: int, sessions: int = 20_000) -> float:
    """Coverage of a fixed-n 95 % t interval checked after every round from ``low`` to ``high``,
    stopping at the first within the target: the rule sequential stopping replaces."""
    rng = np.random.default_rng(12345)
    x = noise.draws(rng, (sessions, high))
    limit, covered = math.log1p(target_pct / 100.0), np.zeros(sessions, bool)
    open_ = np.ones(sessions, bool)
    for n in range(max(low, 2), high + 1):
        m, s = x[:, :n].mean(1), x[:, :n].std(1, ddof=1)
        h = stats.t.ppf(1 - ALPHA / 2, n - 1) * s / math.sqrt(n)
        stop = open_ & ((h <= limit) | (n == high))
        covered[stop] = np.abs(m[stop] - noise.mean_log) <= h[stop]
        open_ &= ~stop
    return float(covered.mean())


def summarize(noise: Noise, rows: list[dict], truth: dict[str, float], args: argparse.Namespace) -> dict:
    """One noise law's figures from its sessions' rows."""
    rounds = np.array([r["rounds"] for r in rows])
    cover = {
        m: float(np.mean([covers(r["intervals"][m], truth[m] * math.exp(noise.mean_log)) for r in rows]))
        for m in HEADLINE
    }
    return {
        "noise": noise.name,
        "sd_log": round(noise.sd_log, 4),
        "sessions": len(rows),
        "coverage": {m: round(c, 3) for m, c in cover.items()},
        "rounds_mean": round(float(rounds.mean()), 2),
        "rounds_min_median_max": [int(rounds.min()), int(np.median(rounds)), int(rounds.max())],
        "reached": round(float(np.mean([r["precision_reached"] for r in rows])), 3),
        "half_width_pct_median": round(float(np.median([r["precision_pct"] for r in rows])), 2),
        "fixed_design_rounds": fixed_rounds(noise, args.precision),
        "naive_coverage": round(naive_coverage(noise, args.precision, args.rounds, args.max_rounds), 3),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200, help="seeded sessions per noise law")
    parser.add_argument("--precision", type=float, default=5.0, help="target relative half-width, percent")
    parser.add_argument("--rounds", type=int, default=3, help="matrix.rounds: the minimum")
    parser.add_argument("--max-rounds", type=int, default=12, help="matrix.max_rounds")
    parser.add_argument("--out", help="also write the figures as JSON")
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    matrix = {"rounds": args.rounds, "max_rounds": args.max_rounds, "precision_pct": args.precision}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        engine, ctx = case_runner(Path(folder), {**matrix, "warmup_rounds": 0})
        with engine:
            # The truth: a round without noise (its values, every one the same, are their geometric mean).
            truth = {m: one_session(engine, ctx, Noise("none", 0.0), 0)["intervals"][m]["center"] for m in HEADLINE}
            laws = []
            for noise in LAWS:
                rows = [one_session(engine, ctx, noise, seed) for seed in range(args.sessions)]
                laws.append(summarize(noise, rows, truth, args))
    return {
        "target_pct": args.precision,
        "rounds": args.rounds,
        "max_rounds": args.max_rounds,
        "truth_ms": {m: round(v, 4) for m, v in truth.items()},
        "laws": laws,
        "wall_s": round(time.perf_counter() - start, 1),
        "cpu": cpu_name(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = measure(args)
    print(f"target {args.precision:g} %, rounds {args.rounds} to {args.max_rounds}, truth {figures['truth_ms']}")
    for law in figures["laws"]:
        print(json.dumps(law))
    print(f"wall {figures['wall_s']} s on {figures['cpu']}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
