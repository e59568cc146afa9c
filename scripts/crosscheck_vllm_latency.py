"""Cross-check lorabench's no-LoRA e2e against vLLM's own latency benchmark.

Measures the ratio of one batch's mean latency in lorabench (the ``no_lora`` case on the
LoRA-off engine: lorabench's async engine, the batch sent at once and gathered) to that
of ``vllm.benchmarks.latency`` (``LLM.generate``), with the same model, batch size,
lengths, warm-up and iteration counts. Near 1 means lorabench's harness adds nothing.

Each engine build settles at its own speed, so each side runs ``--repeats`` builds, in
the order vLLM, lorabench, lorabench, vLLM, ... so neither always goes first. Each
repeat's (vLLM build, lorabench build), adjacent in that order, is one paired
observation of log(ratio); the ratio and its 95 % t-interval are taken over the pairs.

Like for like: after an engine build lorabench binds the engine core and itself off the
cores vLLM's CPU worker uses (lorabench.host.processes.keep_off_worker_cpus). With
``--binding on`` (default) vLLM's benchmark gets the same binding: its child process
wraps ``vllm.LLM.__init__`` to bind right after the build as lorabench/targets/engine.py does.
With ``--binding off`` neither side binds (LORABENCH_CPU_BINDING=off).
``--compare-binding`` measures what the binding itself changes: lorabench builds with
binding on and off, alternated, ratio on/off.

Prints the ratio so far after each pair; ``--out`` keeps every build's figures and the
summary (rewritten after each build). A build takes about a minute on a 2-core EPYC
(45-85 s, mostly the engine's start), so 12 repeats (24 builds) take about 25 minutes.

    python scripts/crosscheck_vllm_latency.py --repeats 12 --out crosscheck.json
    python scripts/crosscheck_vllm_latency.py --compare-binding --repeats 12 --out binding.json
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from scipy import stats

from lorabench.config import EngineSpec, read_config_file, resolve_config
from lorabench.host import processes
from lorabench.host.device import cpu_name, stack_versions
from lorabench.targets.engine_env import engine_environment
from lorabench.targets.vllm_args import engine_arg_names

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
# The process that runs vLLM's benchmark: this module's vllm_latency().
VLLM_CHILD = f"import sys; sys.path.insert(0, {str(HERE)!r}); import crosscheck_vllm_latency as c; c.vllm_latency()"


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(ROOT / "config" / "common.json"))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2, help="builds per side (pairs); an interval needs 2")
    parser.add_argument("--binding", choices=("on", "off"), default="on", help="lorabench's CPU binding, both sides")
    parser.add_argument(
        "--compare-binding", action="store_true", help="lorabench with binding on against off, no vLLM benchmark"
    )
    parser.add_argument("--out", type=Path, help="JSON file: every build's figures and the summary")


def bind_after_build(cls: type) -> list[bool]:
    """Make ``cls.__init__`` (vllm.LLM's) bind as lorabench/targets/engine.py does after its build:
    the processes present before, the build, then keep_off_worker_cpus on those it started.
    Returns a list that gets, per build, whether anything was bound."""
    build = cls.__init__
    bound: list[bool] = []

    @functools.wraps(build)
    def init(self, *args, **kwargs) -> None:
        before = processes.children()
        build(self, *args, **kwargs)
        bound.append(processes.keep_off_worker_cpus(processes.started_since(before)) is not None)

    cls.__init__ = init
    return bound


def vllm_latency(argv: Sequence[str] | None = None) -> None:
    """In the child: vLLM's latency benchmark, its engine bound as lorabench's would be
    (unless LORABENCH_CPU_BINDING=off); whether it was goes into its output JSON."""
    import vllm
    from vllm.benchmarks import latency
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # lorabench binds on the CPU only (lorabench/targets/engine.py).
    bound = bind_after_build(vllm.LLM) if current_platform.device_type == "cpu" else []
    parser = FlexibleArgumentParser()
    latency.add_cli_args(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    latency.main(args)
    out = Path(args.output_json)
    out.write_text(json.dumps({**json.loads(out.read_text()), "lorabench_bound": bound}))


def vllm_command(args: argparse.Namespace, config_path: Path) -> list[str]:
    """vLLM's latency benchmark with the config's model, lengths and engine limits."""
    parsed = read_config_file(config_path)
    m = parsed.matrix
    if m.input_len is None:
        sys.exit(f"{config_path}: set matrix.input_len: vLLM's latency benchmark sends synthetic prompts")
    config = resolve_config(config_path, parsed, needs_lora=False, engine_args=engine_arg_names)
    command = [sys.executable, "-c", VLLM_CHILD, "--model", str(config.model)]
    command += ["--input-len", str(m.input_len), "--output-len", str(m.output_len)]
    command += ["--batch-size", str(args.batch_size), "--num-iters-warmup", str(args.warmup)]
    command += ["--num-iters", str(args.iters), "--seed", str(m.seed)]
    engine = config.llm_kwargs(EngineSpec(enable_lora=False))
    for key in ("max_model_len", "max_num_seqs", "dtype"):
        if key in engine:
            command += [f"--{key.replace('_', '-')}", str(engine[key])]
    return command


def lorabench_config(args: argparse.Namespace, config_path: Path, folder: Path) -> Path:
    """The config narrowed to one batch size, vLLM's warm-up and iteration counts and one
    build, its relative paths made absolute so it can live in ``folder``."""
    raw = json.loads(config_path.read_text())
    raw["matrix"].update(batch_sizes=[args.batch_size], warmup_rounds=args.warmup, rounds=args.iters, builds=1)
    for key in ("model", "prompts", "adapters"):
        if isinstance(raw[key], str) and not raw[key].startswith("builtin:"):
            raw[key] = str((config_path.parent / raw[key]).resolve())
    path = folder / "crosscheck.json"
    path.write_text(json.dumps(raw))
    return path


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float], confidence: float = 0.95) -> dict:
    """Ratio numerator/denominator over paired builds: exp of the mean log ratio of the
    pairs, with its t-interval. ``half_width_pct`` h: the interval is ratio ÷ and × (1 + h)."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError("paired_ratio needs as many numerators as denominators, at least one")
    logs = [math.log(a / b) for a, b in zip(numerator, denominator)]
    mean = statistics.fmean(logs)
    result = {"pairs": len(logs), "ratio": math.exp(mean), "low": None, "high": None, "half_width_pct": None}
    if len(logs) >= 2:
        half = stats.t.ppf(0.5 + confidence / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        result.update(low=math.exp(mean - half), high=math.exp(mean + half), half_width_pct=100 * math.expm1(half))
    return result


def spread(values: Sequence[float]) -> dict:
    """Mean and sd across builds (sd None for one build)."""
    sd = statistics.stdev(values) if len(values) >= 2 else None
    return {"per_build_ms": list(values), "mean_ms": statistics.fmean(values), "sd_ms": sd}


class Sides:
    """Runs one build of either side in ``folder`` and returns its figures."""

    def __init__(self, args: argparse.Namespace, config_path: Path, folder: Path) -> None:
        # vLLM's side gets the environment the plugin gives lorabench's (engine_environment).
        self.env = {**os.environ, **engine_environment(read_config_file(config_path).env, "cpu")}
        self.folder = folder
        self.command = vllm_command(args, config_path)
        self.selection = ["-k", f"no_lora and lora-off and bs{args.batch_size}"]
        self.selection += ["--bench-config", str(lorabench_config(args, config_path, folder))]

    def _run(self, command: list[str], binding: str, cwd: Path) -> float:
        start = time.monotonic()
        subprocess.run(command, env={**self.env, processes.CPU_BINDING: binding}, check=True, cwd=cwd)
        return time.monotonic() - start

    def vllm(self, binding: str, i: int) -> dict:
        out = self.folder / f"vllm{i}.json"
        seconds = self._run([*self.command, "--output-json", str(out)], binding, self.folder)
        result = json.loads(out.read_text())
        latencies = [s * 1000.0 for s in result["latencies"]]
        mean_ms = result["avg_latency"] * 1000.0
        figures = {"mean_ms": mean_ms, "latencies_ms": latencies, "bound": result.get("lorabench_bound")}
        return {"side": "vllm", "binding": binding, "repeat": i, **figures, "seconds": seconds}

    def lorabench(self, binding: str, i: int) -> dict:
        out = self.folder / f"lorabench-{binding}{i}.csv"
        pytest = [sys.executable, "-m", "pytest", str(ROOT / "bench"), "-q", "-p", "no:cacheprovider"]
        seconds = self._run([*pytest, *self.selection, "--bench-output", str(out)], binding, ROOT)
        mean_ms = float(pd.read_csv(out)["e2e_ms"].iloc[0])
        return {"side": "lorabench", "binding": binding, "repeat": i, "mean_ms": mean_ms, "seconds": seconds}


def alternate(runs: dict[str, Callable[[int], dict]], repeats: int, done: Callable) -> dict[str, list[dict]]:
    """``repeats`` builds of each of the two ``runs``, in the order first, second, second,
    first, ...; returns each one's builds by repeat, so index i of both is one adjacent
    pair. ``done`` gets the builds so far, in order and by run, after each build."""
    (first, run_first), (second, run_second) = runs.items()
    ordered: list[dict] = []
    by_name: dict[str, list[dict]] = {first: [], second: []}
    for i in range(repeats):
        for name, run in ((first, run_first), (second, run_second))[:: 1 if i % 2 == 0 else -1]:
            build = {**run(i), "order": len(ordered)}
            ordered.append(build)
            by_name[name].append(build)
            done(ordered, by_name)
    return by_name


def summarize(builds: dict[str, list[dict]], top: str, bottom: str) -> dict:
    """Each side's per-build means and spread, and the paired ratio top/bottom."""
    top_ms, bottom_ms = [b["mean_ms"] for b in builds[top]], [b["mean_ms"] for b in builds[bottom]]
    ratio = {"of": f"{top}/{bottom}", **paired_ratio(top_ms, bottom_ms)}
    return {"sides": {top: spread(top_ms), bottom: spread(bottom_ms)}, "ratio": ratio}


def ratio_line(r: dict) -> str:
    interval = "no interval from one pair (--repeats 2 or more)"
    if r["low"] is not None:
        interval = f"95 % interval [{r['low']:.3f}, {r['high']:.3f}] (half-width {r['half_width_pct']:.1f} %)"
    return f"ratio {r['of']} {r['ratio']:.3f}, {interval}, {r['pairs']} pair{'' if r['pairs'] == 1 else 's'}"


def report(summary: dict, header: dict) -> None:
    print(f"crosscheck: {header['measures']}; CPU {header['cpu']}; vLLM {header['vllm']}; binding {header['binding']}")
    for name, side in summary["sides"].items():
        sd = "" if side["sd_ms"] is None else f", sd {side['sd_ms']:.1f} ms"
        per_build = ", ".join(f"{v:.1f}" for v in side["per_build_ms"])
        print(f"  {name} per build: {per_build} ms; mean {side['mean_ms']:.1f} ms{sd}")
    print(f"  {ratio_line(summary['ratio'])}")


def main(args: argparse.Namespace) -> int:
    config_path = Path(args.config).resolve()
    compare = args.compare_binding
    header = {
        "measures": "lorabench binding on/off" if compare else "lorabench/vLLM",
        "cpu": cpu_name(),
        "vllm": stack_versions()["vllm_version"],
        "binding": "on vs off" if compare else args.binding,
        "config": str(config_path),
        "batch_size": args.batch_size,
        "warmup": args.warmup,
        "iters": args.iters,
    }
    top, bottom = ("on", "off") if compare else ("lorabench", "vllm")

    def record(ordered: list[dict], builds: dict[str, list[dict]]) -> None:
        """Write the figures so far; print the ratio so far after each pair but the last."""
        pairs = len(builds[top]) if len(builds[top]) == len(builds[bottom]) else 0
        summary = summarize(builds, top, bottom) if pairs else None
        if args.out is not None:
            args.out.write_text(json.dumps({**header, "builds": ordered, "summary": summary}, indent=1))
        if summary is not None and pairs < args.repeats:
            print(f"crosscheck: so far {ratio_line(summary['ratio'])}", flush=True)

    with tempfile.TemporaryDirectory() as folder:
        sides = Sides(args, config_path, Path(folder))
        if compare:  # on builds go first in the first pair
            runs = {binding: functools.partial(sides.lorabench, binding) for binding in ("on", "off")}
        else:  # vLLM builds go first in the first pair
            runs = {"vllm": functools.partial(sides.vllm, args.binding)}
            runs["lorabench"] = functools.partial(sides.lorabench, args.binding)
        builds = alternate(runs, args.repeats, record)
    report(summarize(builds, top, bottom), header)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
