"""The docs' pictures, remade by one command, so that a change to a page is a rerun, not a
hand-made screenshot that drifts from the code.

It writes, in a scratch folder, a history store of 30 nights with 3 planted changes (a
regression from night 23 with a vLLM upgrade, one slow last night, an adapter whose greedy
output changed on the last night: tests/test_history_page.py's planted store) and a result
file of invented rows shaped like a default run plus a capacity search (no engine, no
network), renders `lorabench history report` and `lorabench report` from them, and shoots
each page with headless Chromium. Into --out (default docs/images/):

- history-page.png: the history page, its summary and first charts;
- report-page.png: the report page, its headline and the runs' provenance;
- summary.txt: the terminal summary a default run prints, rendered by the plugin's own
  `summary_lines` from the same rows.

Without Chromium (or with --no-shots) the pages and the summary are written and the shots
skipped. The numbers are invented: the pictures show what the pages say, not a measurement.

    .venv/bin/python scripts/screenshots.py [--out docs/images] [--keep DIR] [--no-shots]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from lorabench.cli.main import main as cli
from lorabench.pytest_plugin.session import BenchState
from lorabench.pytest_plugin.terminal import summary_lines
from lorabench.results.files import ResultWriter
from lorabench.results.schema import COLUMNS, ResultRow
from lorabench.results.search_stops import BRACKETED

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' complete row, to vary: scripts/bench_history_store.py does the same
from tests.helpers import make_row  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
# Each page's window: wide enough for its tables, tall enough for what a reader looks at first.
WINDOWS = {"history-page.png": (1100, 820), "report-page.png": (1200, 680)}
RUN = "results/20261201T020000Z-e905ef9a.csv"  # as a run names its file: the page shows the path
CONFIGS = (2, 8)  # max_loras of the default config's two engine configurations
STEP_AT, NIGHTS = 22, 30


def history_runs(folder: Path) -> list[Path]:
    """30 nights of two cases (bs2, bs8), two builds each, 2 % noise: bs2's ttft_ms 1.5 times
    slower from night ``STEP_AT`` on, when vLLM goes 0.32.0 -> 0.33.0; bs8's 1.3 times slower
    on the last night only; adapter a1's greedy output changed on the last night."""
    rng = np.random.default_rng(7)
    paths = []
    for i in range(NIGHTS):
        stepped = i >= STEP_AT
        rows = []
        for batch_size in (2, 8):
            factor = 1.5 if stepped and batch_size == 2 else 1.3 if i == NIGHTS - 1 and batch_size == 8 else 1.0
            for build in (0, 1):
                row = make_row(
                    run_id=f"run-{i:03d}",
                    timestamp=f"2026-11-{i + 1:02d}T02:00:00Z",
                    vllm_version="0.33.0" if stepped else "0.32.0",
                    build=build,
                    engine_id=f"loras2-rank16-cpu4-build{build}",
                    batch_size=batch_size,
                    ttft_ms=10.0 * factor * rng.normal(1, 0.02),
                    decode_ms=2.0 * rng.normal(1, 0.02),
                )
                rows.append(asdict(row))
        paths.append(folder / f"run{i:03d}.csv")
        pd.DataFrame(rows).to_csv(paths[-1], index=False)
        _digests(paths[-1], rows[0]["run_id"], "d-new" if i == NIGHTS - 1 else "d-old")
    return paths


def _digests(csv_path: Path, run_id: str, digest: str) -> None:
    """Both builds' greedy digests of adapters a0 and a1; a1's is ``digest``."""
    records = [
        {
            "run_id": run_id,
            "model": "builtin:tiny-llama",
            "device_type": "cpu",
            "engine_id": f"loras2-rank16-cpu4-build{build}",
            "build": build,
            "adapter": adapter,
            "adapter_rank": 8,
            "digest": digest if adapter == "a1" else "same",
            "base_digest": "b",
        }
        for build in (0, 1)
        for adapter in ("a0", "a1")
    ]
    pd.DataFrame(records).to_csv(csv_path.with_name(csv_path.stem + ".digests.csv"), index=False)


def _latencies(ttft: float, decode: float, e2e: float, batch_size: int) -> dict[str, float]:
    """A batch's latency columns from three figures: percentiles spread around the median."""
    values: dict[str, float] = {"e2e_ms": e2e, "output_tokens_per_s": batch_size * 16 / e2e * 1000}
    for name, median in (("ttft_ms", ttft), ("prefill_ms", ttft * 0.9), ("decode_ms", decode), ("queue_ms", 0.2)):
        values |= {name: median, f"{name}_p50": median, f"{name}_p90": median * 1.2, f"{name}_p99": median * 1.3}
    return values | {f"request_e2e_ms{p}": e2e * f for p, f in (("", 0.9), ("_p50", 0.9), ("_p90", 1), ("_p99", 1))}


def batch_rows() -> list[ResultRow]:
    """The multi-LoRA cases of a default run (three workloads, batch sizes 4 and 8, two
    configurations built twice), invented figures; the second build of max_loras 8 answers
    one adapter's greedy probe differently (the summary's ``wrong out``)."""
    overhead = {"distinct": 4.5, "uniform": 2.0, "identical": 1.9}
    rows = []
    for build in (0, 1):
        for loras in CONFIGS:
            # Eight slots hold the distinct batch's adapters: its overhead falls at max_loras 8.
            for workload, base in overhead.items():
                for batch_size in (4, 8):
                    x = base * (0.55 if loras == 8 and workload == "distinct" else 1) * (1 + 0.04 * build)
                    x *= 1.12 if batch_size == 8 else 1.0
                    e2e = 120.0 * (1 + batch_size / 8) * x
                    rows.append(
                        make_row(
                            **_engine(loras, build),
                            workload=workload,
                            batch_size=batch_size,
                            input_len=64,
                            output_len=16,
                            num_adapters=batch_size if workload == "distinct" else 2,
                            lora_overhead=x,
                            baseline_e2e_ms=e2e / x,
                            adapter_load_ms=2.2 if loras == 2 else 3.0,
                            kv_cache_tokens=4096,
                            peak_memory_mb=780.0 + 8 * loras,
                            digest_mismatches=1 if (loras, build) == (8, 1) else 0,
                            **_latencies(e2e * 0.3, 12.0 + batch_size * (x - 1), e2e, batch_size),
                        )
                    )
    return rows


def _engine(max_loras: int, build: int) -> dict:
    return {
        "max_loras": max_loras,
        "max_cpu_loras": 12,
        "engine_id": f"loras{max_loras}-rank16-cpu12-build{build}",
        "build": build,
        "git_commit": "e905ef9a63fce4506413ae040cb6566f0a14759e",
        "run_id": "20261201T020000Z-e905",
        "timestamp": "2026-12-01T02:00:00Z",
    }


def capacity_rows() -> list[ResultRow]:
    """A capacity search of both configurations for 4 and 16 adapters in use, two builds each."""
    found = {(2, 4): (10.0, 10.5), (8, 4): (13.0, 13.4), (2, 16): (2.2, 2.4), (8, 16): (6.1, 6.6)}
    shape = {"scenario": "capacity", "workload": "trace", "batch_size": None, "input_len": None, "output_len": None}
    trace = {"trace_suite": "skew", "trace_alpha": 0.3, "trace_cv": 1.0, "search_stop": BRACKETED}
    slo = {"slo_ttft_ms": 1000.0, "slo_tpot_ms": 200.0, "slo_target": 0.9, "lora_overhead": None}
    return [
        make_row(
            **shape,
            **trace,
            **slo,
            **_engine(loras, build),
            trace_num_adapters=adapters,
            capacity_rps=rate,
            capacity_over_rps=rate * 1.25,
            kv_cache_tokens=4096,
            peak_memory_mb=780.0 + 8 * loras,
        )
        for (loras, adapters), rates in found.items()
        for build, rate in enumerate(rates)
    ]


def summary_text(rows: list[ResultRow]) -> str:
    """The ``lorabench`` section a session prints at its end, by the plugin's own code, for
    ``rows`` as if a session had written them (its builds, memory and files invented)."""
    state = BenchState(config_path=ROOT / "config" / "common.json", output=None, builds=None)
    builds = sorted({r.engine_id for r in rows}, key=lambda e: (e[-1], e))
    state.built = [(e, 18.0 - i) for i, e in enumerate(builds)]
    state.rss_after_teardown = [(e, 785.0 + 2 * i) for i, e in enumerate(builds)]
    state.writer = ResultWriter(Path("results"), Path(RUN), commit="e905ef9a", dirty=False)
    state.writer.rows = list(rows)
    # Each batch's requests, adapters of ranks 8 and 16 in turn, rank 16's a little slower.
    ranks = [(8, 1.0), (16, 1.08)]
    state.writer.by_rank = [
        (rank, r.ttft_ms_p50 * slower, r.decode_ms_p50 * slower)
        for r in rows
        for rank, slower in (ranks[i % 2] for i in range(r.batch_size))
    ]
    return "\n".join(summary_lines(state)) + "\n"


def _lorabench(*args: str) -> None:
    """A lorabench command in this process, its lines kept off the terminal."""
    with contextlib.redirect_stdout(io.StringIO()):
        status = cli(list(args))
    if status != 0:
        raise SystemExit(f"lorabench {' '.join(args[:2])} exited {status}")


def write_pages(work: Path) -> dict[str, Path]:
    """The history page and the report page, written under ``work``: their index.html by
    the name of the picture each becomes."""
    (work / "history").mkdir(parents=True, exist_ok=True)
    db = work / "history.db"
    _lorabench("history", "add", "--db", str(db), *map(str, history_runs(work / "history")))
    history = work / "history-page"
    _lorabench(
        "history", "report", "--db", str(db), "--out", str(history), "--metric", "ttft_ms", "--metric", "decode_ms"
    )
    run = work / RUN
    run.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([asdict(r) for r in batch_rows() + capacity_rows()], columns=COLUMNS).to_csv(run, index=False)
    with contextlib.chdir(work):  # the page names the file as given: a run's own path, not the scratch folder's
        _lorabench("report", RUN, "--out", "report-page")
    return {"history-page.png": history / "index.html", "report-page.png": work / "report-page" / "index.html"}


def shoot(page: Path, png: Path, window: tuple[int, int], chromium: str = CHROMIUM) -> None:
    """``page`` as headless Chromium draws it in ``window``, into ``png``, its colours
    reduced to a palette (a page of text and plots needs no more; it keeps the file small)."""
    args = [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars"]
    args += [f"--screenshot={png}", f"--window-size={window[0]},{window[1]}", page.resolve().as_uri()]
    subprocess.run(args, check=True, capture_output=True, timeout=120)
    from PIL import Image

    with Image.open(png) as image:
        reduced = image.convert("RGB").quantize(colors=256)
    reduced.save(png, optimize=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--keep", type=Path, help="write the store and pages here (default: a scratch folder)")
    parser.add_argument("--no-shots", action="store_true", help="write the pages and the summary, shoot nothing")
    parser.add_argument("--chromium", default=CHROMIUM)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        pages = write_pages(work)
        (args.out / "summary.txt").write_text(summary_text(batch_rows()), encoding="utf-8")
        if args.no_shots or not shutil.which(args.chromium):
            print(f"pages in {work}; no screenshots ({args.chromium} {'skipped' if args.no_shots else 'not found'})")
            return 0
        for name, page in pages.items():
            shoot(page, args.out / name, WINDOWS[name], args.chromium)
            print(f"{args.out / name}: {(args.out / name).stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
