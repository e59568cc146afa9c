"""What a real CPU engine build costs before it runs anything: the floor of `pytest -m engine`.

vLLM's CPU platform runs the engine core and its worker in processes of their own, started
with spawn (``VLLM_WORKER_MULTIPROC_METHOD=spawn`` and the multiprocessing executor, set in
``vllm/platforms/cpu.py``), so each build starts two interpreters that import vLLM again
before the model loads. This times those imports in fresh interpreters, one after another
(``--repeats`` each, the median kept), and with ``--build`` one whole lora-off build of the
built-in tiny model in this process (vLLM already imported), from the call to the engine
being ready, and its shutdown. ``--builds N`` prints what N builds cost in imports alone
(the engine tier's count of builds is in the lab log).

    python scripts/engine_build_floor.py --repeats 3 --build --builds 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from lorabench.host.device import cpu_name

ROOT = Path(__file__).resolve().parent.parent
# What the spawned engine core and its CPU worker import first (vLLM 0.32's module paths).
SPAWNED = ("vllm.v1.engine.core", "vllm.v1.worker.cpu_worker")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="fresh interpreters per module (default 3)")
    parser.add_argument("--build", action="store_true", help="also time one lora-off build of the tiny model")
    parser.add_argument("--builds", type=int, default=0, help="print the import floor of this many builds")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")


def import_seconds(module: str) -> float:
    """Wall seconds of a fresh interpreter that imports ``module`` and exits."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, capture_output=True)
    return time.perf_counter() - started


def build_seconds() -> tuple[float, float]:
    """One lora-off engine of the default config's model: from the call to ready, and its
    shutdown to the processes gone. vLLM is imported first, so what is timed is the build's
    own processes and the model."""
    import vllm.v1.engine.async_llm  # noqa: F401 - imported outside the timed build

    from lorabench.config import EngineSpec, read_config_file, resolve_config
    from lorabench.targets.engine import Engine
    from lorabench.targets.vllm_args import engine_arg_names

    path = ROOT / "config" / "common.json"
    config = resolve_config(path, read_config_file(path), needs_lora=False, engine_args=engine_arg_names)
    started = time.perf_counter()
    with Engine(config, EngineSpec(enable_lora=False), "cpu"):
        ready = time.perf_counter()
    return ready - started, time.perf_counter() - ready


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(parser)
    args = parser.parse_args(argv)
    figures: dict[str, object] = {"cpu_model": cpu_name()}
    for module in SPAWNED:
        times = [import_seconds(module) for _ in range(args.repeats)]
        figures[module] = {"median_s": round(statistics.median(times), 2), "runs_s": [round(t, 2) for t in times]}
        print(f"import {module}: median {statistics.median(times):.1f} s of {args.repeats}", flush=True)
    floor = sum(figures[m]["median_s"] for m in SPAWNED)
    figures["imports_per_build_s"] = round(floor, 2)
    print(f"a build's two spawned interpreters import vLLM for {floor:.1f} s before the model loads")
    if args.builds:
        print(f"{args.builds} builds: {args.builds * floor / 60:.1f} min of imports alone")
    if args.build:
        build, close = build_seconds()
        figures.update(build_s=round(build, 2), close_s=round(close, 2))
        print(f"one lora-off build of the tiny model: {build:.1f} s, its shutdown {close:.1f} s")
    print(f"host: {figures['cpu_model']}")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
