"""lorabench bisect: the first environment of a chain where a pytest selection got slower, or changed as --kind asks.

The chain is a file of interpreters or virtual environments, oldest first, one a line, with
an optional label after it (``~/venvs/vllm-0401/bin/python nightly-0401``). Each step is a
``lorabench ab`` session of one environment against the first, the known-good one, so
every verdict is a paired comparison made as ``ab`` makes it. First the first against
itself (the selection must not call its own reference slower: else it is too noisy to
bisect) and the last against the first (it must be slower: else there is nothing to find),
then a binary search between the last good and the first bad. An environment whose session
cannot run (exit status 2: it cannot build an engine, say) is skipped, as ``git bisect
skip`` does, and the search takes the nearest other one. A step is judged by the findings
of one kind (``--kind``, ``lorabench.ab.kinds``) its session's comparison recorded. Each
verdict is kept in ``OUT/bisect.json`` as soon as it is known, so ``--resume`` goes on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lorabench.ab.kinds import KINDS, SLOWDOWN, against_itself, evidence, said
from lorabench.ab.plan import BASE, NEW, ABError, check_comparison, check_selection
from lorabench.ab.record import read_record
from lorabench.ab.runner import DEFAULT_PAIRS, FAILED_SIDE, FOUND, UNTESTED
from lorabench.analysis.compare.options import add_compare_arguments
from lorabench.analysis.history.gate import GATE_THRESHOLD

GOOD, BAD, SKIP = "good", "bad", "skip"
# Not slower as far as the step's pairs could show, with changes past the threshold they could
# not show either way (not significant, too few pairs): taken as a skip, not as good.
UNCLEAR = "unclear"
# Why a search stopped without an answer: the last environment has nothing of the kind asked.
NONE_FOUND = "none found"


@dataclass(frozen=True)
class Env:
    python: str
    label: str


@dataclass
class Bisection:
    """The search's state: each environment's verdict on one kind of change against the first."""

    envs: list[Env]
    verdicts: dict[int, str] = field(default_factory=dict)
    kind: str = SLOWDOWN
    found: dict[int, dict[str, int]] = field(default_factory=dict)  # each step's findings, by kind

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


def _resume(record: Path, state: Bisection, envs: str) -> None:
    """An interrupted bisection's verdicts into ``state``, for --resume; one line where they
    cannot be: another chain, or another kind (a step good for a slowdown may be bad for another)."""
    try:
        kept = json.loads(record.read_text(encoding="utf-8"))
        same = kept["envs"] == [e.__dict__ for e in state.envs]
        verdicts = {int(i): str(v) for i, v in kept["verdicts"].items()}
        found = {int(i): {str(k): int(n) for k, n in f.items()} for i, f in kept.get("found", {}).items()}
        kind = kept.get("kind")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ABError(f"--resume: {record} is not a bisection record ({exc}); start again with a new --out") from None
    if not same:
        raise ABError(f"--resume: {envs} is not the chain {record} was started with")
    if kind is None:  # any finding of a step's session was "slower" then
        raise ABError(f"--resume: {record} was started before --kind; start again with a new --out")
    if kind != state.kind:
        fix = f"add --kind {kind} to continue it, or give a new --out"
        raise ABError(f"--resume: --kind {state.kind}, but {record} bisects --kind {kind}: {fix}")
    state.verdicts, state.found = verdicts, found


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
    Returns why it stopped: ``found``, ``range`` (skips left more than one), ``none found``,
    ``noisy``, ``first skip``, ``last skip``, ``first unclear`` or ``last unclear``."""
    last = len(state.envs) - 1
    for i, needed, stop in ((0, GOOD, "noisy"), (last, BAD, NONE_FOUND)):
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
    verdict = said(state.verdicts[i], state.found.get(i, {}), state.kind)
    return f"lorabench bisect: {state.envs[i].label} against {state.envs[0].label}: {verdict}"


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
    parser.add_argument(
        "--kind",
        choices=list(KINDS),
        default=SLOWDOWN,
        metavar="KIND",
        help=f"the kind of change that makes a step bad ({', '.join(KINDS)}); the others are said, not judged",
    )
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
    kept = {"envs": [e.__dict__ for e in state.envs], "kind": state.kind, "verdicts": state.verdicts}
    text = json.dumps({**kept, "found": state.found}, indent=1)
    path.with_suffix(".tmp").write_text(text, encoding="utf-8")
    path.with_suffix(".tmp").replace(path)


def _start(args: argparse.Namespace) -> tuple[Bisection, Path]:
    out = Path(args.out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise ABError(f"--out {args.out}: a file is there; give a folder for the steps")
    state = Bisection(read_envs(Path(args.envs)), kind=args.kind)
    check_selection(args.pytest_args, args.pairs, args.config)
    check_comparison(args.threshold, args.alpha)
    for env in state.envs:
        if not Path(env.python).is_file():
            raise ABError(f"--envs {args.envs}: {env.python} ({env.label}): no such interpreter; fix its line")
    record = out / "bisect.json"
    if args.resume:
        if not record.is_file():
            raise ABError(f"--resume: {args.out} holds no bisection (no bisect.json); leave out --resume to start one")
        _resume(record, state, args.envs)
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
        if status not in (0, 1, 2):  # killed (out of memory?), crashed: not a verdict to keep
            raise ABError(f"{state.envs[i].label}'s session ended with status {status}: see {log.name}; then --resume")
        state.verdicts[i], state.found[i] = _verdict(folder, status, state.kind)
        _record(out, state)
        return state.verdicts[i]

    return verdict_of


def _verdict(folder: Path, status: int, kind: str) -> tuple[str, dict[str, int]]:
    """The step's verdict on ``kind`` and its findings by kind, from its ``ab`` session's record:
    ``ab`` exits 1 for any finding. Skipped: a session that could not run or compare (exit 2),
    a new side whose turn failed (a crash: ``ab`` exits 1), a base side's whose fewer pairs
    found no ``kind``. No slowdown, but changes the pairs could not show: unclear, not good."""
    try:
        record = read_record(folder / "ab.json")
    except ABError:
        record = {}  # no session record (it stopped before its first turn): no verdict
    found = record.get(FOUND)
    if status == 2 or record.get(FAILED_SIDE) == NEW or not isinstance(found, dict):
        return SKIP, {}
    found = {str(k): n for k, n in found.items() if isinstance(n, int)}
    if found.get(kind):
        return BAD, found
    if record.get(FAILED_SIDE) == BASE:
        return SKIP, found
    return (UNCLEAR if kind == SLOWDOWN and record.get(UNTESTED) else GOOD), found


def main(args: argparse.Namespace) -> int:
    """Exit status 1: the first environment with the kind of change asked (or its range); 0:
    the last has none against the first; 2: bad input, or a chain that cannot be bisected."""
    if args.pytest_args[:1] == ["--"]:
        args.pytest_args = args.pytest_args[1:]
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    try:
        state, out = _start(args)
        stop = bisect(state, _session(args, state, out), say)
    except ABError as exc:
        print(f"lorabench bisect: {exc}", file=sys.stderr)
        return 2
    return _answer(state, stop, out)


def _answer(state: Bisection, stop: str, out: Path) -> int:
    """The answer on stdout, with the kind of evidence it rests on (why there is none on
    stderr), and the exit status."""
    envs, kind = state.envs, KINDS[state.kind]
    if stop == NONE_FOUND:
        print(f"{kind.none}: {envs[-1].label} against {envs[0].label} (steps in {out})")
        return 0
    if stop not in ("found", "range"):
        which, why = envs[-1 if stop.startswith("last") else 0].label, _ENDS.get(stop.split()[-1])
        print(f"lorabench bisect: {which} {why or against_itself(kind.name)} ({out})", file=sys.stderr)
        return 2
    good, bad = state.bounds()
    shown = evidence(kind.name, envs[0].label, state.found.get(bad, {}))
    if stop == "found":
        sessions = len(state.verdicts)
        print(f"{kind.first}: {envs[bad].label} (after {envs[good].label}), {sessions} sessions (evidence: {shown})")
    else:
        between = [f"{envs[i].label} ({state.verdicts[i]})" for i in range(good + 1, bad)]
        told = f"those between not told; {envs[bad].label}'s evidence: {shown}"
        print(f"{kind.first}: one of {', '.join([*between, envs[bad].label])} ({told})")
    for i in sorted(state.verdicts):
        verdict = said(state.verdicts[i], state.found.get(i, {}), kind.name)
        print(f"  {envs[i].label}: {verdict} ({out / f'step-{i:03d}' / 'comparison.txt'})")
    return 1


# Why a search stopped at an end of the chain (the first against itself, the last against the first).
_ENDS = {
    SKIP: "could not run: see its step's log",
    UNCLEAR: "has changes past the threshold that its pairs could not show either way: raise --pairs",
}
