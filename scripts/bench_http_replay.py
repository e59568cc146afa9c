"""Does the online replay keep to its schedule over HTTP? A trace at 50 requests/s replayed
against the stand-in OpenAI-compatible server (lorabench.targets.standin.server, in a process of
its own, as a real server is), reporting the send lag. Issue 21's target: p99 under 5 ms.

Over HTTP each request is a streaming POST on aiohttp's connection pool; every stream's
chunks are parsed on the same event loop that sends, and the /metrics scrapes of the
timeline (lorabench.targets.http.telemetry) run there too, as in a benchmark run. A timing: run it
on a quiet machine.

    python scripts/bench_http_replay.py                           # 50/s for 60 s: about 65 s
    python scripts/bench_http_replay.py --rate 100 --seconds 20 --out http-replay.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from lorabench.config import engine_specs, read_config_file, resolve_config
from lorabench.config.target import URL, Target
from lorabench.host.device import cpu_name
from lorabench.load.traces import synthetic as trace
from lorabench.measure import replay
from lorabench.results.stats import percentile
from lorabench.targets.http.engine import HttpEngine
from lorabench.targets.http.serve import free_port
from lorabench.targets.standin import write_config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s (Poisson arrivals)")
    parser.add_argument("--seconds", type=float, default=60.0, help="the trace's length")
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--output-range", type=int, nargs=2, default=(8, 64), metavar=("LOW", "HIGH"))
    parser.add_argument("--out", help="also write the figures as JSON")
    return parser.parse_args(argv)


def start_server(adapters: list[str]) -> tuple[subprocess.Popen, str]:
    """The stand-in server as a process of its own, once its /health answers."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "lorabench.targets.standin.server",
        "--port",
        str(port),
        "--adapters",
        ",".join(adapters),
    ]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as answer:
                if answer.status == 200:
                    return server, url
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit(f"the stand-in server on {url} did not answer /health in 30 s")


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        path = write_config(Path(folder), adapters=args.adapters)
        config = resolve_config(path, read_config_file(path), needs_lora=True)
        (spec,) = engine_specs(config.file, with_lora_off=False)
        adapters = {a.name: a for a in config.adapters}
        server, url = start_server(list(adapters))
        try:
            with HttpEngine(config, spec, "cpu", None, Target(URL, url)) as engine:
                params = trace.TraceParams(
                    num_adapters=args.adapters,
                    rate=args.rate,
                    input_range=(8, 64),
                    output_range=tuple(args.output_range),
                    duration=args.seconds,
                )
                requests = trace.generate(params, list(adapters))
                records = engine.run(replay.replay(engine, requests, adapters, timeline=engine.timeline))
                scrapes, failed = len(engine.timeline.rows), engine.failed_requests
        finally:
            server.terminate()
            server.wait(timeout=30)
    lags = [r.send_lag_ms for r in records]
    return {
        "cpu": cpu_name(),
        "requests": len(records),
        "rate": args.rate,
        "unfinished": sum(not r.finished for r in records),
        "failed": failed,
        "timeline_records": scrapes,
        "send_lag_ms_p50": percentile(lags, 50),
        "send_lag_ms_p99": percentile(lags, 99),
        "send_lag_ms_max": max(lags),
        "ttft_ms_p50": percentile([r.ttft_ms for r in records], 50),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    figures = measure(args)
    print(json.dumps(figures, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
