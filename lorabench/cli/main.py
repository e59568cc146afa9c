"""The lorabench command line: tools that work without pytest.

Every subcommand follows one convention (docs/cli.md#exit-status): exit 0 when
it is done and found nothing, 1 for a finding (a regression, a changed output, a failed
gate), 2 for bad input, said in one line on stderr that names the file, field or value and
the fix, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from lorabench.analysis.compare.options import add_compare_arguments

# Each subcommand imports what it needs when it runs: `lorabench ab` and `lorabench trace`
# start without the adapter generator, and only a comparison loads pandas and scipy.

DESCRIPTION = "lorabench: tools that work without pytest. Exit status: 0 done, 1 a finding, 2 bad input."
BAD_INPUT = 2


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the default is nothing to say
    (None, False, an empty list) or the help already says what happens without it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if default is None or default is False or default == [] or default == argparse.SUPPRESS or "default" in text:
            return text
        if not action.option_strings and action.nargs not in ("?", "*"):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line on stderr and exit status 2, as
    every other bad input of the command line (argparse's own print the usage first)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"{self.prog}: {message} ({self.prog} --help lists the options)\n")


def version() -> str:
    """lorabench's version and the stack's, from the packages' metadata: nothing is imported."""
    from lorabench.host.stack import describe, installed

    try:
        own = metadata.version("pytest-lorabench")
    except metadata.PackageNotFoundError:
        own = "(not installed)"
    return f"lorabench {own}; {describe(installed())}"


class _Version(argparse._VersionAction):
    """--version, read when asked: every other command is spared reading the installed packages."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        self.version = version()
        super().__call__(parser, namespace, values, option)


def plain(docstring: str | None) -> str:
    """A module docstring's first line as help text: without its reStructuredText markup."""
    return (docstring or "").splitlines()[0].replace("``", "")


def _refuse(command: str, why: str) -> int:
    print(f"lorabench {command}: {why}", file=sys.stderr)
    return BAD_INPUT


def _unwritable(option: str, name: str | None, folder: bool) -> str | None:
    """Why ``name`` cannot be written as ``option`` asks (a folder, or a file in an existing
    folder), checked before the work so that a bad path is not found after it."""
    if name is None:
        return None
    path = Path(name)
    if folder and path.exists() and not path.is_dir():
        return f"{option} {name}: a file is there; give a folder"
    if not folder and not path.parent.is_dir():
        return f"{option} {name}: no folder {path.parent}; create it or give another path"
    return None


def _compare(args: argparse.Namespace) -> int:
    from lorabench.analysis.compare import CompareError
    from lorabench.analysis.compare.select import run_comparison
    from lorabench.analysis.show import show_comparison

    unwritable = _unwritable("--plot", args.plot, folder=False) or _unwritable("--report", args.report, folder=True)
    if unwritable:
        return _refuse("compare", unwritable)
    try:
        result = run_comparison(
            args.base,
            args.new,
            thresholds=args.threshold,
            alpha=args.alpha,
            noise_from=args.noise_from,
            results_dir=args.results_dir,
            all_runs=args.all_runs,
        )
    except CompareError as exc:
        return _refuse("compare", str(exc))
    return show_comparison(
        result,
        args.format,
        plot_to=Path(args.plot) if args.plot else None,
        by_rank=args.by_rank,
        report=Path(args.report) if args.report else None,
    )


def _report(args: argparse.Namespace) -> int:
    from lorabench.analysis.compare import CompareError
    from lorabench.analysis.report import write_report

    unwritable = _unwritable("--out", args.out, folder=True)
    if unwritable:
        return _refuse("report", unwritable)
    try:
        page = write_report([Path(p) for p in args.results], Path(args.out))
    except CompareError as exc:
        return _refuse("report", str(exc))
    except OSError as exc:
        return _refuse("report", f"--out {args.out}: {exc.strerror}: check the path and its permissions")
    print(f"report: {page}")
    return 0


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; ``only``: the subcommand about to run, the one whose arguments (and
    module, and what that imports) are loaded; the others are listed by name and help only.
    A subcommand starts in a fraction of a second that way (``history show`` of one case
    answers in under one). Without ``only``, every subcommand whole (the tests walk them)."""
    parser = Parser(prog="lorabench", description=DESCRIPTION)
    parser.add_argument("--version", action=_Version, help="lorabench's version and vLLM's")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text, fill in _COMMANDS:
        sub = commands.add_parser(name, help=text)
        if only is None or only == name:
            fill(sub)
    return parser


def _tool(module_name: str) -> Callable[[argparse.ArgumentParser], None]:
    """A subcommand whose module owns its arguments and its main, as vLLM's benchmarks do."""

    def fill(sub: argparse.ArgumentParser) -> None:
        module = importlib.import_module(module_name)
        sub.description = plain(module.__doc__)
        module.add_cli_args(sub)
        sub.set_defaults(func=module.main)

    return fill


def _fill_trace(sub: argparse.ArgumentParser) -> None:
    from lorabench.cli import trace as command

    sub.description = plain(command.__doc__)
    command.add_cli_args(sub)


def _fill_adapters(sub: argparse.ArgumentParser) -> None:
    from lorabench.cli import adapters as adapters_command

    adapters_command.add_cli_args(sub)


def _fill_compare(comp: argparse.ArgumentParser) -> None:
    comp.description = (
        "Compare two benchmark runs case by case. A change is a regression or an improvement only "
        "when it passes the threshold and is significant against the noise between engine builds "
        "(a t-test on the builds' log values, Benjamini-Hochberg-adjusted over every case and metric)."
    )
    comp.add_argument(
        "base",
        help="base result CSV, or several runs to pool as A.csv,B.csv (with --results-dir: a commit prefix; "
        "lorabench ab's OUT/base folder: compared pair by pair)",
    )
    comp.add_argument(
        "new", help="new result CSV, or several runs to pool (with --results-dir: a commit prefix; OUT/new of ab)"
    )
    comp.add_argument("--results-dir", help="pick the latest run of each commit prefix in this folder")
    comp.add_argument("--all-runs", action="store_true", help="with --results-dir: pool every run of each commit")
    add_compare_arguments(comp.add_argument)
    comp.add_argument("--plot", metavar="FILE.png", help="also draw the new/base ratio of every case")
    comp.add_argument("--report", metavar="DIR", help="also write the comparison as a page: DIR/index.html")
    comp.add_argument(
        "--by-rank", action="store_true", help="also compare median TTFT and decode per adapter rank (from the samples)"
    )
    comp.set_defaults(func=_compare)


def _fill_ab(ab: argparse.ArgumentParser) -> None:
    from lorabench.ab import runner

    ab.description = (
        "Run the same pytest selection and config in two environments (interpreter, folder, "
        "variables), one engine build of each configuration a turn, in the order ABBA..., then compare the "
        "pairs: drift of the machine over the session cancels. "
        "Example: lorabench ab --base-python ~/vllm-a/bin/python --new-python ~/vllm-b/bin/python --out ab/ "
        '-- bench -k "multilora and identical"'
    )
    runner.add_cli_args(ab)
    ab.set_defaults(func=runner.main)


def _fill_report(report: argparse.ArgumentParser) -> None:
    report.add_argument("results", nargs="+", help="result CSV files, one run each, drawn side by side")
    report.add_argument("--out", required=True, help="folder for index.html and its PNG figures")
    report.set_defaults(func=_report)


# Every subcommand: its name, its line in `lorabench --help`, and what adds its arguments.
_COMMANDS: tuple[tuple[str, str, Callable[[argparse.ArgumentParser], None]], ...] = (
    ("ab", "measure two environments in alternation on one node and compare them pair by pair", _fill_ab),
    ("adapters", "LoRA adapter tools", _fill_adapters),
    ("compare", "compare two runs; exit status 1: a regression", _fill_compare),
    ("report", "draw result files as a page of figures: DIR/index.html", _fill_report),
    ("trace", "online workloads: synthetic (S-LoRA style) or imported from public traces", _fill_trace),
    (
        "doctor",
        "preflight: would a run start here? one line a finding; exit status 1: one would stop it",
        _tool("lorabench.cli.doctor"),
    ),
    ("bundle", "a run's results, logs, config, doctor output and settings in one file", _tool("lorabench.cli.bundle")),
    (
        "serve-command",
        "the vllm serve command one engine configuration is, to start it yourself",
        _tool("lorabench.cli.serve_command"),
    ),
    (
        "bisect",
        "the first environment of a chain with a change of one kind (slower by default), by A/B sessions",
        _tool("lorabench.ab.bisect"),
    ),
    (
        "history",
        "runs across commits in one store: add runs, show each case's series and change points",
        _tool("lorabench.cli.history"),
    ),
)


def _command_in(argv: Sequence[str]) -> str:
    """The subcommand ``argv`` names (its first word that is no option; lorabench's own
    options take no value), or "" where it names none it knows."""
    first = next((word for word in argv if not word.startswith("-")), "")
    return first if first in {name for name, _, _ in _COMMANDS} else ""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; its exit status as the convention says (0 done, 1 a finding, 2 bad
    input), also for argparse's own errors, --help and --version, which exit by raising."""
    try:
        args = build_parser(_command_in(sys.argv[1:] if argv is None else argv)).parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else BAD_INPUT
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
