"""How long the history store takes to add many runs and to show one case.

Writes --runs result files (default 10,000) of --rows rows each (default 100 cases), adds
them with `lorabench history add` in one process, then times `lorabench history show` of
one case over all of them, in-process and as a command. Prints wall and CPU seconds with
the CPU model. Exit status 1 when adding misses 60 s or the show misses 1 s (issue 29's
budgets; the show's budget is the in-process call: the command adds Python's and pandas'
start-up, printed apart).

    .venv/bin/python scripts/bench_history_store.py [--runs N] [--rows N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from lorabench.analysis.history.series import ordered_runs, series
from lorabench.analysis.history.store import add_runs, connect
from lorabench.host.device import cpu_name

ADD_BUDGET_S, SHOW_BUDGET_S = 60.0, 1.0


def write_runs(folder: Path, runs: int, rows: int) -> list[Path]:
    """One template run of ``rows`` cases (batch sizes 1..rows), written ``runs`` times with
    its own run id and time."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.helpers import make_row

    template = [asdict(make_row(batch_size=b + 1)) for b in range(rows)]
    columns = list(template[0])
    paths = []
    for r in range(runs):
        path = folder / f"run{r:05d}.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            stamp = f"2026-{1 + r // 28 // 24 % 12:02d}-{1 + r // 24 % 28:02d}T{r % 24:02d}:00:00Z"
            writer.writerows({**row, "run_id": f"run-{r:05d}", "timestamp": stamp} for row in template)
        paths.append(path)
    return paths


def timed(action):  # noqa: ANN001, ANN201 - a benchmark's stopwatch
    wall, cpu = time.perf_counter(), time.process_time()
    result = action()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="runs to add (default: 10000)")
    parser.add_argument("--rows", type=int, default=100, help="rows a run (default: 100)")
    parser.add_argument(
        "--keep", type=Path, help="write the files and the store here, and keep them (default: a temporary folder)"
    )
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="lorabench-history-"))
    folder.mkdir(parents=True, exist_ok=True)
    paths = write_runs(folder, args.runs, args.rows)
    db = folder / "history.db"
    db.unlink(missing_ok=True)
    _, add_wall, add_cpu = timed(lambda: add_runs(db, paths))
    with connect(db, create=False) as conn:
        runs = ordered_runs(conn)
        found, show_wall, show_cpu = timed(
            lambda: series(conn, runs, ["ttft_ms"], lambda label: " bs7 " in f" {label} ")
        )
    command = [
        sys.executable,
        "-m",
        "lorabench",
        "history",
        "show",
        "--db",
        str(db),
        "-k",
        "bs7 and not bs70 and not bs71 and not bs72 and not bs73 and not bs74 and not bs75 and not bs76 "
        "and not bs77 and not bs78 and not bs79",  # -k matches substrings, as pytest's: one case
        "--metric",
        "ttft_ms",
    ]
    _, command_wall, _ = timed(lambda: subprocess.run(command, stdout=subprocess.DEVNULL, check=True))
    print(f"{cpu_name()} ({os.cpu_count()} cores); load average {os.getloadavg()[0]:.2f}")
    print(f"add {args.runs} runs of {args.rows} rows: {add_wall:.1f} s wall, {add_cpu:.1f} s CPU (budget 60 s)")
    print(f"show one case over {len(runs)} runs: {show_wall:.2f} s wall, {show_cpu:.2f} s CPU in process")
    size = db.stat().st_size / 2**20
    print(f"  as a command, Python and its imports included: {command_wall:.2f} s; store {size:.0f} MiB")
    return 0 if add_wall <= ADD_BUDGET_S and show_wall <= SHOW_BUDGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
