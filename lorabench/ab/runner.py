"""``lorabench ab``: run the turns of an A/B session in alternation, then compare pair by pair.

Layout of ``--out``: ``base/pair-NNN.csv`` and ``new/pair-NNN.csv`` (ordinary result
files, with their samples and digests beside them), ``logs/pair-NNN-SIDE.log`` (each
turn's pytest output), ``ab.json`` (the plan and each finished turn) and
``comparison.txt``. A turn writes under ``SIDE/running/`` and moves up only when its
pytest session has passed, so an interrupted or failed turn never counts; every
finished pair does. ``--resume`` continues such a session with the same sides: complete
pairs stay, a pair left half done runs again whole, so its two turns stay back to back
(the half's files move to ``superseded/``, kept but no longer compared).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from lorabench.ab.kinds import found_in
from lorabench.ab.plan import (
    BASE,
    NEW,
    ABError,
    Side,
    alternation,
    check_comparison,
    check_selection,
    make_side,
    pytest_command,
)
from lorabench.ab.process import findings_only, last_line, wait
from lorabench.ab.record import finished_turns, note, write_record
from lorabench.ab.sequential import Looks
from lorabench.analysis.compare.options import add_compare_arguments
from lorabench.analysis.compare.sequential import look_alpha
from lorabench.results.progress import duration
from lorabench.results.provenance import PAIR_ENV

DEFAULT_PAIRS = 6
PYTEST_USAGE = (2, 4, 5)  # lorabench's bad input, pytest's usage error, no tests collected
RESUME_HINT = " (the same command with --resume continues the session)"


class TurnFailed(Exception):
    """A turn's pytest session did not pass; its message says why and where the log is."""

    def __init__(self, message: str, side: str) -> None:
        super().__init__(message)
        self.side = side


# The side whose turn failed and stopped the session, in its record (``ab.json``).
FAILED_SIDE = "failed_side"
# How many case-metrics passed the threshold without being shown (not significant, too few pairs).
UNTESTED = "past_threshold_untested"
# How many findings of each kind the comparison had (lorabench.ab.kinds): ab's exit 1 is any
# of them, and bisect is steered by the one kind it was asked for.
FOUND = "found"


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    for side in (BASE, NEW):
        parser.add_argument(f"--{side}-python", required=True, metavar="PY", help=f"the {side} side's interpreter")
        parser.add_argument(f"--{side}-dir", metavar="DIR", help=f"folder the {side} side's pytest runs in (default .)")
        parser.add_argument(
            f"--{side}-env",
            action="append",
            default=[],
            metavar="K=V",
            help=f"environment variable for the {side} side",
        )
    parser.add_argument("--pairs", type=int, default=DEFAULT_PAIRS, help=f"pairs of turns (default {DEFAULT_PAIRS})")
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="look after each pair from the third and stop once the verdict is decided; --pairs is the most",
    )
    parser.add_argument("--config", default="config/common.json", help="the benchmark configuration both sides run")
    parser.add_argument("--out", required=True, help="folder for both sides' result files, logs and the comparison")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the session in --out (same sides, config and selection; --pairs may grow)",
    )
    add_compare_arguments(parser.add_argument, runs=False)
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then the pytest selection and options")


def main(args: argparse.Namespace) -> int:
    try:
        sides, config, out = _prepare(args)
        versions = _versions(sides)
    except ABError as exc:
        print(f"lorabench ab: {exc}", file=sys.stderr)
        return 2
    pytest_args = _selection(args.pytest_args)
    record = {"pytest_args": pytest_args, "config": str(config), "pairs": args.pairs, "turns": []}
    record["design"] = Looks.design(args)
    record["config_sha256"] = hashlib.sha256(config.read_bytes()).hexdigest()
    record["sides"] = {
        s.name: {"python": str(s.python), "dir": str(s.folder), "env": s.env, "versions": versions[s.name]}
        for s in sides.values()
    }
    for name, side in sides.items():
        print(f"lorabench ab: {name}: {side.python} in {side.folder}: {versions[name]}", file=sys.stderr)
    try:
        if args.resume:
            record["turns"] = finished_turns(out, record)
        _run_turns(sides, pytest_args, config, out, record, Looks(out, args, record) if args.sequential else None)
    except ABError as exc:
        print(f"lorabench ab: {exc}", file=sys.stderr)
        return 2
    except TurnFailed as exc:
        print(f"lorabench ab: {exc}; comparing the pairs finished before it{RESUME_HINT}", file=sys.stderr)
        # What bisect reads: a side that could not run is no slower side.
        write_record(out / "ab.json", {**record, FAILED_SIDE: exc.side})
        return _after_failed_turn(exc.side, _compare(out, args))
    except KeyboardInterrupt:
        print(f"lorabench ab: interrupted; comparing the pairs finished before it{RESUME_HINT}", file=sys.stderr)
        return _after_interrupt(_compare(out, args))
    return _compare(out, args)


def _after_interrupt(status: int) -> int:
    """A session stopped by hand is no verdict (2, as pytest's own interrupted session): its
    pairs are fewer than asked, so "nothing found" (0) would pass a script's check on what
    was never measured. What the finished pairs did find still stands (1)."""
    if status != 1:
        print("lorabench ab: interrupted: no verdict (exit 2)", file=sys.stderr)
        return 2
    return status


def _after_failed_turn(side: str, status: int) -> int:
    """The exit status of a session a failed turn stopped. The new side failing is a finding
    (1), whatever its finished pairs say: a version that crashes is not "no regression". The
    base side failing leaves no verdict (2) unless the finished pairs found one: bisect then
    skips the step rather than calling it good."""
    if side == NEW:
        print("lorabench ab: the new side's turn failed: exit 1, whatever the finished pairs say", file=sys.stderr)
        return 1
    if status != 1:
        print("lorabench ab: the base side's turn failed: no verdict (exit 2)", file=sys.stderr)
        return 2
    return status


def _selection(args: list[str]) -> list[str]:
    return args[1:] if args[:1] == ["--"] else args


def _prepare(args: argparse.Namespace) -> tuple[dict[str, Side], Path, Path]:
    sides = {
        name: make_side(
            name, getattr(args, f"{name}_python"), getattr(args, f"{name}_dir"), getattr(args, f"{name}_env")
        )
        for name in (BASE, NEW)
    }
    config = check_selection(_selection(args.pytest_args), args.pairs, args.config)
    check_comparison(args.threshold, args.alpha)
    out = Path(args.out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise ABError(f"--out {args.out}: a file is there; give a folder for the session's results")
    if args.resume and not (out / "ab.json").is_file():
        raise ABError(f"--resume: {args.out} holds no A/B session (no ab.json); leave out --resume to start one")
    if not args.resume and any(any((out / side).glob("pair-*.csv")) for side in (BASE, NEW)):
        raise ABError(
            f"--out {args.out}: holds an earlier A/B session's results; add --resume to continue it, "
            "or give a new folder"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ABError(f"--out {args.out}: cannot be made ({exc.strerror}); give a folder you can write") from None
    return sides, config, out


def _versions(sides: dict[str, Side]) -> dict[str, str]:
    """What each side's interpreter imports: its vLLM and lorabench, checked before any turn
    (a side that cannot import vLLM would fail its first turn, after the other side's). The
    sides are asked at once: each import takes seconds."""
    probe = "import lorabench, vllm; print(f'vllm {vllm.__version__}, lorabench {lorabench.__version__}')"
    asked = {
        name: subprocess.Popen(
            [str(side.python), "-c", probe],
            cwd=side.folder,
            env={**os.environ, **side.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, side in sides.items()
    }
    answers = {name: process.communicate() for name, process in asked.items()}
    for name, process in asked.items():
        if process.returncode:
            reason = (answers[name][1].strip().splitlines() or ["no output"])[-1]
            side = sides[name]
            raise ABError(f"--{side.name}-python {side.python}: cannot import vllm and lorabench there: {reason}")
    return {name: stdout.strip() for name, (stdout, _) in answers.items()}


def _run_turns(
    sides: dict[str, Side], pytest_args: list[str], config: Path, out: Path, record: dict, looks: Looks | None
) -> None:
    """Every turn not run yet, the record written after each; with ``looks``, a look after each
    pair completed, which may stop the session."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    if "stopped_at" in record.get("sequential", {}):
        print(f"lorabench ab: decided after {record['sequential']['stopped_at']} pairs already", file=sys.stderr)
        return
    done = {turn["pair"] for turn in record["turns"]}
    turns = [(pair, name) for pair, name in alternation(record["pairs"]) if pair not in done]
    print(f"lorabench ab: {len(turns)} turns of {record['pairs']} pairs to run, into {out}", file=sys.stderr)
    spent = 0.0
    for number, (pair, name) in enumerate(turns, 1):
        seconds = _run_turn(sides[name], pair, pytest_args, config, out)
        spent += seconds
        record["turns"].append({"pair": pair, "side": name, "seconds": round(seconds, 1)})
        # A pair's two turns run back to back (alternation; a half-done pair runs again whole).
        stop = looks is not None and number % 2 == 0 and looks.after(len(done) + number // 2, spent / number * 2)
        write_record(out / "ab.json", record)
        if stop:
            return
        left = spent / number * (len(turns) - number)
        where = f"turn {number}/{len(turns)}: pair {pair} {name}"
        print(f"lorabench ab: {where}, {seconds:.0f} s; about {duration(left)} to go", file=sys.stderr)


def _run_turn(side: Side, pair: int, pytest_args: list[str], config: Path, out: Path) -> float:
    """One pytest session of one side; its files move into place only when it passed."""
    running = out / side.name / "running"
    shutil.rmtree(running, ignore_errors=True)
    running.mkdir(parents=True)
    name = f"pair-{pair:03d}"
    log = out / "logs" / f"{name}-{side.name}.log"
    command = pytest_command(side, pytest_args, config, running / f"{name}.csv")
    env = {**os.environ, **side.env, PAIR_ENV: str(pair)}
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as sink:
        sink.write(" ".join(command) + "\n")
        sink.flush()
        rc = wait(subprocess.Popen(command, cwd=side.folder, env=env, stdout=sink, stderr=subprocess.STDOUT))
    if rc and not findings_only(rc, running / f"{name}.csv", log):
        reason = last_line(log)
        if rc in PYTEST_USAGE and pair == 0:
            raise ABError(f"the {side.name} side's pytest stopped (exit {rc}): {reason}; see {log}")
        raise TurnFailed(f"pair {pair}, {side.name} side: pytest exit {rc}: {reason}; see {log}", side.name)
    if rc:
        print(f"lorabench ab: pair {pair}, {side.name}: {last_line(log)}: its rows are compared", file=sys.stderr)
    for path in running.iterdir():
        path.rename(out / side.name / path.name)
    running.rmdir()
    return time.monotonic() - started


def _compare(out: Path, args: argparse.Namespace) -> int:
    from lorabench.analysis.compare import (
        NOT_SIGNIFICANT,
        TOO_FEW,
        CompareError,
        compare_pairs,
        parse_thresholds,
        render_text,
    )
    from lorabench.analysis.show import show_comparison

    try:
        threshold, per_metric = parse_thresholds(args.threshold)
        sequential = getattr(args, "sequential", False)
        alpha = look_alpha(args.alpha, args.pairs) if sequential else args.alpha  # the looks' level
        result = compare_pairs(out / BASE, out / NEW, threshold=threshold, per_metric=per_metric, alpha=alpha)
    except CompareError as exc:
        print(f"lorabench ab: nothing to compare: {exc}", file=sys.stderr)
        return 2
    # What bisect reads: what the comparison found, by kind; and a step with changes past the
    # threshold that the pairs could not show is no "not slower".
    untested = sum(f.verdict in (NOT_SIGNIFICANT, TOO_FEW) for f in result.findings)
    note(out, **{UNTESTED: untested, FOUND: found_in(result)})
    (out / "comparison.txt").write_text(render_text(result) + "\n", encoding="utf-8")
    print(f"lorabench ab: comparison of {len(result.base.paths)} pairs in {out / 'comparison.txt'}", file=sys.stderr)
    return show_comparison(result, args.format)
