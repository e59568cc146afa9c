"""``lorabench`` command line: tools that work without pytest."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lorabench.analysis.compare.options import add_compare_arguments

# Each subcommand imports what it needs when it runs: `lorabench ab` and `lorabench trace`
# start without the adapter generator, and only a comparison loads pandas and scipy.


def _csv(kind: type) -> object:
    def parse(text: str) -> list:
        try:
            return [kind(part) for part in text.split(",") if part]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}, got {text!r}"
            ) from None

    return parse


def _base_config(base: str) -> Path:
    from lorabench.load import builtin

    if base.startswith(builtin.PREFIX):
        return builtin.ensure_model(base[len(builtin.PREFIX) :]) / "config.json"
    path = Path(base).expanduser()
    return path / "config.json" if path.is_dir() else path


def _generate(args: argparse.Namespace) -> int:
    from lorabench.load import builtin
    from lorabench.load.adapters import generate_dummy_adapters

    try:
        config = _base_config(args.base)
    except KeyError:
        raise SystemExit(f"lorabench: --base {args.base!r}: built-in models are {', '.join(builtin.MODELS)}") from None
    if not config.is_file():
        raise SystemExit(f"lorabench: --base {args.base}: no config.json there; pass a model folder or its config.json")
    prompts: list[str] = []
    if args.prompts:
        prompts = json.loads(Path(args.prompts).read_text(encoding="utf-8"))
    try:
        adapters = generate_dummy_adapters(
            config,
            Path(args.out),
            count=args.count,
            ranks=args.ranks,
            target_modules=args.target_modules,
            prompts=prompts,
            seed=args.seed,
            dtype=args.dtype,
        )
    except (KeyError, ValueError) as exc:
        raise SystemExit(f"lorabench: cannot generate adapters for {config}: {exc}") from None
    print(f"wrote {len(adapters)} adapters and {Path(args.out) / 'adapters.json'}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from lorabench.analysis.compare.load import CompareError
    from lorabench.analysis.compare.select import run_comparison
    from lorabench.analysis.show import show_comparison

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
        print(f"lorabench compare: {exc}", file=sys.stderr)
        return 2
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

    try:
        page = write_report([Path(p) for p in args.results], Path(args.out))
    except CompareError as exc:
        print(f"lorabench report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {page}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lorabench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (_add_ab, _add_adapters, _add_compare, _add_report, _add_trace, _add_tools):
        add(commands)
    return parser


def _add_tools(commands: Any) -> None:
    """Subcommands whose module owns its arguments and its main, as vLLM's benchmarks do."""
    from lorabench.cli import bundle, doctor, serve_command

    for name, module, text in (
        ("doctor", doctor, "preflight: would a run start here? one line a finding; exit 1 if one would stop it"),
        ("bundle", bundle, "a run's results, logs, config, doctor output and settings in one file; exit 2: bad input"),
        ("serve-command", serve_command, "the vllm serve command one engine configuration is, to start it yourself"),
    ):
        sub = commands.add_parser(name, help=text, description=module.__doc__.splitlines()[0])
        module.add_cli_args(sub)
        sub.set_defaults(func=module.main)


def _add_trace(commands: Any) -> None:
    from lorabench.cli import trace as command

    command.add_cli_args(commands.add_parser("trace", help=command.HELP, description=command.__doc__.splitlines()[0]))


def _add_adapters(commands: Any) -> None:
    adapters = commands.add_parser("adapters", help="LoRA adapter tools").add_subparsers(dest="action", required=True)
    gen = adapters.add_parser(
        "generate",
        help="write dummy PEFT adapters (random weights) for a Llama-like base, and their adapters.json",
    )
    gen.add_argument("--base", required=True, help="base model folder or its config.json, or builtin:tiny-llama")
    gen.add_argument("--out", required=True, help="folder for the adapters and adapters.json")
    gen.add_argument("--count", type=int, default=8, help="number of adapters (default 8)")
    gen.add_argument("--ranks", type=_csv(int), default=[8, 16], help="ranks to cycle through, e.g. 8,16,32,64")
    gen.add_argument(
        "--target-modules", type=_csv(str), default=["q_proj", "k_proj", "v_proj", "o_proj"], help="e.g. q_proj,v_proj"
    )
    gen.add_argument("--prompts", help="prompts.json whose prompts are given to the adapters in turn")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    gen.set_defaults(func=_generate)


def _add_compare(commands: Any) -> None:
    comp = commands.add_parser(
        "compare",
        help="compare two runs; exit 0: no regression, 1: a regression, 2: bad input",
        description="Compare two benchmark runs case by case. A change is a regression or an improvement only "
        "when it passes the threshold and is significant against the noise between engine builds "
        "(a t-test on the builds' log values, Benjamini-Hochberg-adjusted over every case and metric).",
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
    comp.add_argument("--format", choices=["text", "markdown", "csv", "json"], default="text")
    comp.add_argument("--plot", metavar="FILE.png", help="also draw the new/base ratio of every case")
    comp.add_argument("--report", metavar="DIR", help="also write the comparison as a page: DIR/index.html")
    comp.add_argument(
        "--by-rank", action="store_true", help="also compare median TTFT and decode per adapter rank (from the samples)"
    )
    comp.set_defaults(func=_compare)


def _add_ab(commands: Any) -> None:
    from lorabench.ab import runner

    ab = commands.add_parser(
        "ab",
        help="measure two environments in alternation on one node and compare them pair by pair; "
        "exit 0: no regression, 1: a regression, 2: bad input",
        description="Run the same pytest selection and config in two environments (interpreter, folder, "
        "variables), one engine build of each configuration a turn, in the order ABBA..., then compare the "
        "pairs: drift of the machine over the session cancels. "
        "Example: lorabench ab --base-python ~/vllm-a/bin/python --new-python ~/vllm-b/bin/python --out ab/ "
        '-- bench -k "multilora and identical"',
    )
    runner.add_cli_args(ab)
    ab.set_defaults(func=runner.main)


def _add_report(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="draw result files as a page of figures: DIR/index.html; exit 2 on bad input"
    )
    report.add_argument("results", nargs="+", help="result CSV files, one run each, drawn side by side")
    report.add_argument("--out", required=True, help="folder for index.html and its PNG figures")
    report.set_defaults(func=_report)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "adapters" and args.count < 1:
        raise SystemExit("lorabench: --count must be at least 1")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
