"""Does the online replay keep up with real traces? A long trace at a high rate replayed
against the stand-in engine (lorabench.targets.standin), reporting the send lag and peak memory.

Real traces (Azure, BurstGPT, Mooncake) run for hours at hundreds of requests a second,
so each send must do the same small work however long the trace (lorabench/measure/replay.py);
the stand-in keeps the engine's own work small and known. The engine timeline records
as in a benchmark run (LORABENCH_TIMELINE=off leaves it out). Target: send lag p99 under
2 ms at 20,000 requests and 500 requests/s. A timing: run it on a quiet machine. On a
shared one, the garbage collector's passes (counted, and timed in CPU time) still say
whether the replay's own process blocked its loop: a full pass over a large heap was what
made sends late by over 100 ms.

    python scripts/bench_replay.py                            # 20,000 requests at 500/s: about 40 s
    python scripts/bench_replay.py --requests 2000 --rate 100 --out replay.json
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import tempfile
import time
from pathlib import Path

import psutil

from lorabench.config import engine_specs, read_config_file, resolve_config
from lorabench.host.device import cpu_name
from lorabench.load.traces import synthetic as trace
from lorabench.measure import replay
from lorabench.results.stats import percentile
from lorabench.targets.standin import Costs, StandInEngine, write_config

MIB = 1024 * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=500.0, help="requests/s (Poisson arrivals)")
    parser.add_argument("--adapters", type=int, default=8, help="adapters, all fitting max_loras")
    parser.add_argument("--input-range", type=int, nargs=2, default=(8, 64), metavar=("LOW", "HIGH"))
    parser.add_argument("--output-range", type=int, nargs=2, default=(8, 64), metavar=("LOW", "HIGH"))
    parser.add_argument("--decode-ms", type=float, default=2.0, help="the stand-in's step (ms)")
    parser.add_argument("--out", help="also write the figures as JSON")
    return parser.parse_args(argv)


def stand_in(folder: Path, args: argparse.Namespace) -> StandInEngine:
    """A stand-in engine with every adapter in a slot and room for every request at once."""
    engine = {"max_loras": args.adapters, "max_cpu_loras": args.adapters, "max_num_seqs": 4096}
    path = write_config(folder, adapters=args.adapters, engine=engine)
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    (spec,) = engine_specs(config.file, with_lora_off=False)
    costs = Costs(prefill_ms_per_token=0.0, decode_ms_per_step=args.decode_ms)
    return StandInEngine(config, spec, "cpu", None, costs=costs, weights={a.name: "" for a in config.adapters})


class CollectorPauses:
    """The garbage collector's passes while the replay runs, by generation, and how long they
    held the loop: CPU time, which other processes on a shared host leave alone, so the
    count of long pauses says what a quiet-machine timing would, run after run."""

    def __init__(self) -> None:
        self.counts, self.pauses_ms, self._start = [0, 0, 0], [], 0.0

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.thread_time()
            return
        self.counts[info["generation"]] += 1
        self.pauses_ms.append((time.thread_time() - self._start) * 1000.0)

    def figures(self) -> dict:
        return {
            "gc_collections_by_generation": self.counts,
            "gc_pauses_over_1ms": sum(p > 1.0 for p in self.pauses_ms),
            "gc_pause_ms_max": round(max(self.pauses_ms, default=0.0), 2),
        }


def peak_rss_mib(*samples: float) -> float:
    """The process's peak RSS. The kernel's high-water mark (ru_maxrss, KiB on Linux) is
    synced from per-thread counters lazily and can read a few pages below a fresh
    /proc sample, so the samples taken here bound it from below."""
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, *samples)


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as folder, stand_in(Path(folder), args) as engine:
        adapters = {a.name: a for a in engine.config.adapters}
        params = trace.TraceParams(
            num_adapters=args.adapters,
            rate=args.rate,
            input_range=tuple(args.input_range),
            output_range=tuple(args.output_range),
            duration=1.1 * args.requests / args.rate,
        )
        requests = trace.generate(params, list(adapters))[: args.requests]
        engine.load_adapters(list(adapters.values()))
        rss_before = psutil.Process().memory_info().rss / MIB
        start = time.perf_counter()
        with CollectorPauses() as pauses:
            records = engine.run(replay.replay(engine, requests, adapters, timeline=engine.timeline))
        wall = time.perf_counter() - start
        rss_after = psutil.Process().memory_info().rss / MIB
        lags = [r.send_lag_ms for r in records]
        return {
            "requests": len(records),
            "rate": args.rate,
            "trace_s": round(requests[-1].arrival_s, 1),
            "replay_s": round(wall, 1),
            "finished": sum(r.finished for r in records),
            "send_lag_ms_p50": round(percentile(lags, 50), 3),
            "send_lag_ms_p99": round(percentile(lags, 99), 3),
            "send_lag_ms_max": round(max(lags), 3),
            "timeline_records": len(engine.timeline.rows),
            **pauses.figures(),
            "rss_before_replay_mib": round(rss_before),
            "rss_after_replay_mib": round(rss_after),
            "peak_rss_mib": round(peak_rss_mib(rss_before, rss_after)),
            "cpu": cpu_name(),
            "cores": psutil.cpu_count(),
        }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = measure(args)
    for key, value in figures.items():
        print(f"{key}: {value}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
