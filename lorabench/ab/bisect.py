"""lorabench bisect: the first environment of a chain where a pytest selection got slower.

The chain is a file of interpreters or virtual environments, oldest first, one a line, with
an optional label after it (``~/venvs/vllm-0401/bin/python nightly-0401``). Each step is a
``lorabench ab`` session of one environment against the first, the known-good one, so
every verdict is a paired comparison made as ``ab`` makes it. First the first against
itself (the selection must not call its own reference slower: else it is too noisy to
bisect) and the last against the first (it must be slower: else there is nothing to find),
then a binary search between the last good and the first bad. An environment whose session
cannot run (exit status 2: it cannot build an engine, say) is skipped, as ``git bisect
skip`` does, and the search takes the nearest other one. Each step's verdict is kept in
``OUT/bisect.json`` as soon as it is known, so ``--resume`` goes on from there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lorabench.ab.plan import NEW, ABError, check_comparison, check_selection
from lorabench.ab.record import read_record
from lorabench.ab.runner import DEFAULT_PAIRS, FAILED_SIDE, UNTESTED
from lorabench.analysis.compare.options import add_compare_arguments
from lorabench.analysis.history.gate import GATE_THRESHOLD

GOOD, BAD, SKIP = "good", "bad", "skip"
# Not slower as far as the step's pairs could show, with changes past the threshold they could
# not show either way (not significant, too few pairs): taken as a skip, not as good.
UNCLEAR = "unclear"
_VERDICTS = {0: GOOD, 1: BAD, 2: SKIP}


@dataclass(frozen=True)
class Env:
    python: str
    label: str


@dataclass
class Bisection:
    """The search's state: each environment's verdict against the first, as found."""

    envs: list[Env]
    verdicts: dict[int, str] = field(default_factory=dict)

    def bounds(self) -> tuple[int, int]:
        """The last environment known good before the first known bad, and that bad one."""
        bad = min(i for i, v in self.verdicts.items() if v == BAD)
        good = max(i for i, v in self.verdicts.items() if v == GOOD and i < bad)
        return good, bad

    def next_step(self) -> int | None:
        """The untried environment nearest the middle of the bounds; None when none is left."""
        good, bad = self.bounds()
        middle = (good + bad) / 2
        left = [i for i in range(good + 1, bad) if i not in self.verdicts]
        return min(left, key=lambda i: (abs(i - middle), i)) if left else None


def _kept_verdicts(record: Path, state: Bisection, envs: str) -> dict[int, str]:
    """The verdicts of an interrupted bisection, for --resume; one line where it cannot be."""
    try:
        kept = json.loads(record.read_text(encoding="utf-8"))
        same = kept["envs"] == [e.__dict__ for e in state.envs]
        verdicts = {int(i): str(v) for i, v in kept["verdicts"].items()}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ABError(f"--resume: {record} is not a bisection record ({exc}); start again with a new --out") from None
    if not same:
        raise ABError(f"--resume: {envs} is not the chain {record} was started with")
    return verdicts


def read_envs(path: Path) -> list[Env]:
    """The chain; ``ABError`` with one line where the file cannot be one."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ABError(
            f"--envs {path}: cannot be read ({exc.strerror}): give a text file of the chain, one interpreter or "
            "environment a line, oldest first"
        ) from None
    except UnicodeDecodeError:
        raise ABError(f"--envs {path}: not a text file: one interpreter or environment a line") from None
    envs = []
    for line in lines:
        parts = line.split(None, 1)
        if parts and not parts[0].startswith("#"):
            python = Path(parts[0]).expanduser()
            python = python / "bin" / "python" if python.is_dir() else python
            envs.append(Env(str(python), parts[1].strip() if len(parts) > 1 else parts[0]))
    if len(envs) < 2:
        raise ABError(f"--envs {path}: lists {len(envs)} environment(s); a chain needs 2 or more, oldest first")
    return envs


def bisect(state: Bisection, verdict_of: Callable[[int], str], say: Callable[[str], None]) -> str:
    """Run the search on ``state``; ``verdict_of(i)`` runs environment i against the first.
    Returns why it stopped: ``found``, ``range`` (skips left more than one), ``no slowdown``,
    ``noisy``, ``first skip``, ``last skip``, ``first unclear`` or ``last unclear``."""
    last = len(state.envs) - 1
    for i, needed, stop in ((0, GOOD, "noisy"), (last, BAD, "no slowdown")):
        if i not in state.verdicts:
            state.verdicts[i] = verdict_of(i)
            say(_step_line(state, i))
        if state.verdicts[i] in (SKIP, UNCLEAR):
            return f"{'last' if i else 'first'} {state.verdicts[i]}"
        if state.verdicts[i] != needed:
            return stop
    while (step := state.next_step()) is not None:
        state.verdicts[step] = verdict_of(step)
        say(_step_line(state, step))
    good, bad = state.bounds()
    return "found" if bad - good == 1 else "range"


def _step_line(state: Bisection, i: int) -> str:
    return f"lorabench bisect: {state.envs[i].label} against {state.envs[0].label}: {state.verdicts[i]}"


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--envs", required=True, help="file of interpreters or virtual environments, oldest first, one a line"
    )
    parser.add_argument("--out", required=True, help="folder for each step's A/B session and bisect.json")
    # ab's default, not fewer: with 3 pairs the drift fit leaves 1 degree of freedom, and a
    # step 20 % slower was caught in 30 % of simulated sessions, with 6 pairs in all
    # (scripts/bench_ab_power.py, docs/lab/2026-11-measurements.md).
    parser.add_argument(
        "--pairs",
        type=int,
        default=DEFAULT_PAIRS,
        help=f"pairs of turns in each step's A/B session (default {DEFAULT_PAIRS})",
    )
    parser.add_argument("--config", default="config/common.json", help="the benchmark configuration every step runs")
    parser.add_argument("--resume", action="store_true", help="go on from the steps bisect.json in --out records")
    add_compare_arguments(_gate_default(parser), runs=False)
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then the pytest selection and options")


def _gate_default(parser: argparse.ArgumentParser) -> Callable[..., object]:
    """``add_argument`` with the threshold's help saying bisect's default, the gate's 5 %:
    what ``history check`` flags, bisect can find."""

    def add(*names: str, **options: object) -> object:
        if names == ("--threshold",):
            options["help"] = str(options["help"]).replace("default 10%%", f"default {100 * GATE_THRESHOLD:g}%% here")
        return parser.add_argument(*names, **options)

    return add


def _record(out: Path, state: Bisection) -> None:
    path = out / "bisect.json"
    text = json.dumps({"envs": [e.__dict__ for e in state.envs], "verdicts": state.verdicts}, indent=1)
    path.with_suffix(".tmp").write_text(text, encoding="utf-8")
    path.with_suffix(".tmp").replace(path)


def _start(args: argparse.Namespace) -> tuple[Bisection, Path]:
    out = Path(args.out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise ABError(f"--out {args.out}: a file is there; give a folder for the steps")
    state = Bisection(read_envs(Path(args.envs)))
    check_selection(args.pytest_args, args.pairs, args.config)
    check_comparison(args.threshold, args.alpha)
    for env in state.envs:
        if not Path(env.python).is_file():
            raise ABError(f"--envs {args.envs}: {env.python} ({env.label}): no such interpreter; fix its line")
    record = out / "bisect.json"
    if args.resume:
        if not record.is_file():
            raise ABError(f"--resume: {args.out} holds no bisection (no bisect.json); leave out --resume to start one")
        state.verdicts = _kept_verdicts(record, state, args.envs)
    elif record.exists():
        raise ABError(
            f"--out {args.out}: holds an earlier bisection; add --resume to continue it, or give a new folder"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ABError(f"--out {args.out}: cannot be made ({exc.strerror})") from None
    return state, out


def _session(args: argparse.Namespace, state: Bisection, out: Path) -> Callable[[int], str]:
    """Environment i against the first, as one ``lorabench ab`` session in ``out/step-i``."""

    def verdict_of(i: int) -> str:
        folder = out / f"step-{i:03d}"
        command = [sys.executable, "-m", "lorabench", "ab", "--out", str(folder), "--pairs", str(args.pairs)]
        command += ["--base-python", state.envs[0].python, "--new-python", state.envs[i].python]
        command += ["--config", args.config, "--alpha", str(args.alpha), "--format", "text"]
        command += [f"--threshold={t}" for t in args.threshold or [f"{100 * GATE_THRESHOLD:g}%"]]
        if (folder / "ab.json").is_file():
            command.append("--resume")
        with (out / f"step-{i:03d}.log").open("w") as log:
            status = subprocess.run([*command, "--", *args.pytest_args], stdout=log, stderr=log).returncode
        if status not in _VERDICTS:  # killed (out of memory?), crashed: not a verdict to keep
            raise ABError(f"{state.envs[i].label}'s session ended with status {status}: see {log.name}; then --resume")
        verdict = _verdict(folder, status)
        state.verdicts[i] = verdict
        _record(out, state)
        return verdict

    return verdict_of


def _verdict(folder: Path, status: int) -> str:
    """The step's verdict from its ``ab`` session's status and record. An environment whose
    own turn failed (it crashed, could not build an engine) is skipped, not called slower:
    ``ab`` exits 1 for that, a finding of its own. A session that found nothing, but changes
    past the threshold that its pairs could not show, is unclear, not good."""
    try:
        record = read_record(folder / "ab.json")
    except ABError:
        record = {}  # no session record (it stopped before its first turn): the status alone
    if record.get(FAILED_SIDE) == NEW:
        return SKIP
    if status == 0 and record.get(UNTESTED):
        return UNCLEAR
    return _VERDICTS[status]


def main(args: argparse.Namespace) -> int:
    """Exit status 1: the first slower environment found (or its range); 0: the last is not
    slower than the first; 2: bad input, or a chain that cannot be bisected as given."""
    if args.pytest_args[:1] == ["--"]:
        args.pytest_args = args.pytest_args[1:]
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    try:
        state, out = _start(args)
        stop = bisect(state, _session(args, state, out), say)
    except ABError as exc:
        print(f"lorabench bisect: {exc}", file=sys.stderr)
        return 2
    envs = state.envs
    if stop == "no slowdown":
        print(f"no slowdown: {envs[-1].label} is not slower than {envs[0].label} (steps in {out})")
        return 0
    if stop not in ("found", "range"):
        which = envs[-1 if stop.startswith("last") else 0].label
        print(f"lorabench bisect: {which} {_ENDS[stop.split()[-1]]} ({out})", file=sys.stderr)
        return 2
    good, bad = state.bounds()
    between = [f"{envs[i].label} ({state.verdicts[i]})" for i in range(good + 1, bad)]
    if stop == "found":
        print(f"first slower environment: {envs[bad].label} (after {envs[good].label}), {len(state.verdicts)} sessions")
    else:
        print(f"first slower environment: one of {', '.join([*between, envs[bad].label])} (those between not told)")
    for i in sorted(state.verdicts):
        print(f"  {envs[i].label}: {state.verdicts[i]} ({out / f'step-{i:03d}' / 'comparison.txt'})")
    return 1


# Why a search stopped at an end of the chain (the first against itself, the last against the first).
_ENDS = {
    "noisy": "called slower than itself: raise --pairs",
    SKIP: "could not run: see its step's log",
    UNCLEAR: "has changes past the threshold that its pairs could not show either way: raise --pairs",
}
