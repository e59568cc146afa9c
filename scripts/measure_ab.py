"""Measure lorabench ab on this machine: false alarms, detection and the smallest change it flags.

Runs A/B sessions of a matrix (``--config``; by default the small one in
scripts/ab/small.json), alternating two kinds: "same" (the project's .venv on both sides)
and "busy" (the new side's interpreter runs a busy loop beside it, scripts/ab/busy-python),
then separate plain runs of the same code compared one run a side, as `lorabench compare`
does. Writes each outcome to OUT/outcomes.jsonl as it finishes and the figures to
OUT/summary.md. A benchmark, not a test: a session of the small matrix takes about
6 minutes on a 2-core Xeon, of the default (config/common.json, two configurations and
four cases a turn) about 9.5 minutes.

    python scripts/measure_ab.py --sessions 5 --runs 6 --out /tmp/ab-measure
    python scripts/measure_ab.py --sessions 2 --config config/common.json --out /tmp/ab-default
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
CONFIG = ROOT / "scripts" / "ab" / "small.json"
SELECTION = ["bench", "-k", "multilora and identical"]
NEW_PYTHON = {"same": PYTHON, "busy": ROOT / "scripts" / "ab" / "busy-python"}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, default=5, help="A/B sessions of each kind (same, busy)")
    parser.add_argument("--pairs", type=int, default=6, help="pairs a session (lorabench ab's default: 6)")
    parser.add_argument("--runs", type=int, default=0, help="separate plain runs, compared one run a side")
    parser.add_argument("--config", type=Path, default=CONFIG, help="the matrix both sides run (default: small.json)")
    parser.add_argument("--out", required=True, type=Path)


def ab_session(kind: str, index: int, pairs: int, config: Path, out: Path) -> dict:
    folder = out / f"{kind}-{index}"
    command = [str(PYTHON), "-m", "lorabench", "ab", "--base-python", str(PYTHON)]
    command += ["--new-python", str(NEW_PYTHON[kind]), "--pairs", str(pairs), "--config", str(config)]
    command += ["--out", str(folder), "--format", "json", "--", *SELECTION]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    (out / f"{kind}-{index}.log").write_text(done.stderr, encoding="utf-8")
    outcome = {"kind": kind, "index": index, "exit": done.returncode, "seconds": round(time.monotonic() - started)}
    if done.returncode in (0, 1):
        result = json.loads(done.stdout)
        outcome["flagged"] = {
            f["metric"]: round(f["change_pct"], 1)
            for f in result["findings"]
            if f["verdict"] in ("regressed", "improved")
        }
        outcome["change_pct"] = {f["metric"]: round(f["change_pct"], 1) for f in result["findings"]}
        outcome["detectable_pct"] = result["detectable_pct"]
    return outcome


def plain_runs(count: int, config: Path, out: Path) -> list[Path]:
    paths = []
    for i in range(count):
        csv = out / "runs" / f"run-{i}.csv"
        command = [str(PYTHON), "-m", "pytest", *SELECTION, "--bench-config", str(config), "--bench-builds", "2"]
        subprocess.run(
            [*command, "--bench-output", str(csv), "-p", "no:cacheprovider", "-q"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        paths.append(csv)
    return paths


def compare_runs(paths: list[Path]) -> list[dict]:
    """Consecutive runs compared one a side: as they are (assuming no drift), and with the
    other runs as the noise floor (--noise-from)."""
    outcomes = []
    for i in range(len(paths) - 1):
        others = ",".join(str(p) for j, p in enumerate(paths) if j not in (i, i + 1))
        for mode, extra in (("separate", []), ("separate+floor", ["--noise-from", others])):
            command = [str(PYTHON), "-m", "lorabench", "compare", str(paths[i]), str(paths[i + 1]), "--format", "json"]
            done = subprocess.run([*command, *extra], cwd=ROOT, capture_output=True, text=True)
            result = json.loads(done.stdout) if done.returncode in (0, 1) else {"findings": []}
            flagged = {
                f["metric"]: round(f["change_pct"], 1)
                for f in result["findings"]
                if f["verdict"] in ("regressed", "improved")
            }
            outcomes.append(
                {
                    "kind": mode,
                    "index": i,
                    "exit": done.returncode,
                    "flagged": flagged,
                    "detectable_pct": result.get("detectable_pct", {}),
                }
            )
    return outcomes


def summary(outcomes: list[dict], config: Path) -> str:
    lines = [f"# lorabench ab on {cpu_model()}, matrix {config.name}", ""]
    for kind in ("same", "busy", "separate", "separate+floor"):
        done = [o for o in outcomes if o["kind"] == kind]
        if not done:
            continue
        flagged = sum(bool(o.get("flagged")) for o in done)
        lines.append(
            f"- {kind}: {len(done)} comparisons, {flagged} flagged something, exit codes "
            f"{sorted(o['exit'] for o in done)}"
        )
        every = [
            o["detectable_pct"][m][1]
            for o in done
            for m in o.get("detectable_pct", {})
            if m == "e2e_ms" and o["detectable_pct"][m][1] is not None  # null: not testable on so few pairs
        ]
        if every:
            lines.append(f"  - smallest e2e change flagged (every case), median: {statistics.median(every):.1f}%")
        if kind == "busy":
            for metric in ("ttft_ms", "e2e_ms", "decode_ms", "output_tokens_per_s"):
                changes = [o["change_pct"][metric] for o in done if metric in o.get("change_pct", {})]
                if changes:
                    lines.append(f"  - {metric}: reported change {', '.join(f'{c:+.0f}%' for c in changes)}")
    return "\n".join(lines) + "\n"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "outcomes.jsonl"
    config = args.config.resolve()
    outcomes = []
    for index in range(args.sessions):
        for kind in ("same", "busy"):
            outcomes.append(ab_session(kind, index, args.pairs, config, args.out))
            with log.open("a") as sink:
                sink.write(json.dumps(outcomes[-1]) + "\n")
            (args.out / "summary.md").write_text(summary(outcomes, config), encoding="utf-8")
    if args.runs >= 2:
        for outcome in compare_runs(plain_runs(args.runs, config, args.out)):
            outcomes.append(outcome)
            with log.open("a") as sink:
                sink.write(json.dumps(outcome) + "\n")
    (args.out / "summary.md").write_text(summary(outcomes, config), encoding="utf-8")
    print(summary(outcomes, config))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
