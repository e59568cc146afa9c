"""``lorabench trace``: write a synthetic trace, import a public one, and look at either.

Its own module so the command line stays small; each subcommand imports what it needs
when it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HELP = "online workloads: synthetic (S-LoRA style) or imported from public traces"


def _range(text: str) -> tuple[int, int]:
    try:
        low, high = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH such as 8,64, got {text!r}") from None
    return low, high


class _BadInput(ValueError):
    """Input a subcommand cannot use: one line on stderr, exit status 2."""


def _failed(action: str, message: str) -> int:
    """Bad input, as every ``lorabench trace`` subcommand reports it: one line, exit 2."""
    print(f"lorabench trace {action}: {message}", file=sys.stderr)
    return 2


def _unwritable(exc: OSError) -> str:
    return f"{exc.filename}: {exc.strerror}: check the path and its permissions"


def _adapter_names(args: argparse.Namespace) -> list[str]:
    if args.adapters:
        from lorabench.load.adapters import read_adapters_file

        try:
            return [a.name for a in read_adapters_file(Path(args.adapters))]
        except ValueError as exc:
            raise _BadInput(f"--adapters: {exc}") from None
    return [f"adapter-{i}" for i in range(args.num_adapters)]


def _trace_generate(args: argparse.Namespace) -> int:
    """A trace with no request is refused: its file would say a rate it does not hold."""
    from lorabench.load.traces import synthetic as trace

    params = trace.TraceParams(
        num_adapters=args.num_adapters,
        rate=args.rate,
        alpha=args.alpha,
        cv=args.cv,
        input_range=args.input_range,
        output_range=args.output_range,
        lengths=args.lengths,
        duration=args.duration,
        seed=args.seed,
    )
    try:
        names = _adapter_names(args)
        requests = trace.generate(params, names)
        if not requests:
            raise _BadInput(
                f"no request arrives in --duration {args.duration:g} s at --rate {args.rate:g} (seed {args.seed}): "
                "raise either"
            )
        trace.write(Path(args.out), params, names, requests)
    except _BadInput as exc:
        return _failed("generate", str(exc))
    except ValueError as exc:
        return _failed("generate", f"cannot generate the trace: {exc}")
    except OSError as exc:
        return _failed("generate", _unwritable(exc))
    print(f"wrote {len(requests)} requests to {args.out}")
    return 0


def _trace_stats(args: argparse.Namespace) -> int:
    from lorabench.load.traces import data, summary

    try:
        loaded = data.load(Path(args.file))
    except ValueError as exc:
        return _failed("stats", str(exc))
    print(summary.describe(loaded))
    if args.plot:
        from lorabench.analysis.report.trace_figures import draw_trace

        try:
            print(f"plot: {draw_trace(loaded, Path(args.plot), title=Path(args.file).name)}")
        except OSError as exc:
            return _failed("stats", _unwritable(exc))
    return 0


def _import_options(args: argparse.Namespace) -> Any:
    from lorabench.load.traces.importer import ImportOptions
    from lorabench.load.traces.sources import Columns, TraceInputError

    names = None
    if args.adapter_names:
        from lorabench.load.adapters import read_adapters_file

        try:
            names = tuple(a.name for a in read_adapters_file(Path(args.adapter_names)))
        except ValueError as exc:
            raise TraceInputError(f"--adapter-names: {exc}") from None
    given = (args.time_column, args.input_column, args.output_column)
    return ImportOptions(
        fmt=args.format,
        source=Path(args.file),
        num_adapters=args.adapters,
        columns=Columns(*given, time_unit=args.time_unit) if any(given) or args.time_unit != "s" else None,
        label_column=args.label_column,
        popularity=args.popularity,
        seed=args.seed,
        adapter_names=names,
        start=args.start,
        duration=args.duration,
        time_scale=args.time_scale,
        rate=args.rate,
        max_model_len=args.max_model_len,
    )


def _trace_import(args: argparse.Namespace) -> int:
    """Bad input is one line on stderr and exit status 2, never a traceback; what the import
    did that its user may not expect (labels folded together) is a warning line."""
    from lorabench.load.traces import data
    from lorabench.load.traces.importer import import_trace, import_warnings
    from lorabench.load.traces.sources import TraceInputError

    try:
        imported = import_trace(_import_options(args))
        data.write(Path(args.out), imported)
    except TraceInputError as exc:
        return _failed("import", str(exc))
    except OSError as exc:
        return _failed("import", _unwritable(exc))
    for line in import_warnings(imported.header):
        print(f"lorabench trace import: warning: {line}", file=sys.stderr)
    print(f"wrote {len(imported)} requests ({imported.rate:.3f} req/s over {imported.duration_s:g} s) to {args.out}")
    return 0


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    traces = parser.add_subparsers(dest="action", required=True)
    tgen = traces.add_parser("generate", help="write a trace: Gamma arrivals, power-law adapter popularity")
    tgen.add_argument("--out", required=True, help="trace file to write (JSON lines)")
    tgen.add_argument("-n", "--num-adapters", type=int, required=True, help="number of adapters")
    tgen.add_argument("-R", "--rate", type=float, required=True, help="total request rate, requests/s")
    tgen.add_argument("--alpha", type=float, default=1.0, help="popularity exponent: 1 uniform, smaller more skewed")
    tgen.add_argument(
        "--cv", type=float, default=1.0, help="coefficient of variation of inter-arrival times (1: Poisson)"
    )
    tgen.add_argument("--input-range", type=_range, default=(8, 64), metavar="LOW,HIGH")
    tgen.add_argument("--output-range", type=_range, default=(8, 64), metavar="LOW,HIGH")
    tgen.add_argument("--lengths", choices=["uniform", "longtail"], default="uniform")
    tgen.add_argument("--duration", type=float, default=300.0, help="seconds (default 300)")
    tgen.add_argument("--seed", type=int, default=0)
    tgen.add_argument("--adapters", help="adapters.json whose first N adapters the trace uses (default: adapter-0 ...)")
    tgen.set_defaults(func=_trace_generate)
    tstats = traces.add_parser(
        "stats", help="what a trace holds: rate over time, lengths, adapter shares, and an import's steps"
    )
    tstats.add_argument("file")
    tstats.add_argument("--plot", metavar="FILE.png", help="also draw rate over time, lengths and adapter shares")
    tstats.set_defaults(func=_trace_stats)
    _add_trace_import(traces)


def _add_trace_import(traces: Any) -> None:
    imp = traces.add_parser(
        "import",
        help="a public trace (Azure, BurstGPT, Mooncake, any CSV) as a lorabench trace; exit 2 on bad input",
        description="Read a public trace's arrival times and lengths, cut a window, drop requests without "
        "output, clip lengths, rescale time and give each request an adapter. The header records the source "
        "file, its sha256 and every step with the rows it touched. Formats: azure (TIMESTAMP, ContextTokens, "
        "GeneratedTokens), burstgpt (Timestamp, Request tokens, Response tokens), mooncake (JSON lines: "
        "timestamp in ms, input_length, output_length), csv (columns named below).",
    )
    imp.add_argument("format", help="azure, burstgpt, mooncake or csv")
    imp.add_argument("file", help="the trace to read (CSV, or JSON lines for mooncake)")
    imp.add_argument("--out", required=True, help="trace file to write (JSON lines)")
    csv_args = imp.add_argument_group("csv format: which columns hold what")
    csv_args.add_argument("--time-column")
    csv_args.add_argument("--input-column")
    csv_args.add_argument("--output-column")
    csv_args.add_argument("--time-unit", choices=["s", "ms", "us", "datetime"], default="s")
    cut = imp.add_argument_group("window, lengths and time")
    cut.add_argument("--start", type=float, default=0.0, help="seconds from the first request (default 0)")
    cut.add_argument("--duration", type=float, help="seconds of trace to keep (default: to the end)")
    cut.add_argument("--max-model-len", type=int, help="fit input+output into this many tokens (the input shortened)")
    scale = cut.add_mutually_exclusive_group()
    scale.add_argument("--time-scale", type=float, help="multiply every arrival time by this (0.01: 100x faster)")
    scale.add_argument("--rate", type=float, help="scale time so the mean rate is this many requests/s")
    labels = imp.add_argument_group("adapters")
    labels.add_argument("--adapters", type=int, default=1, help="number of adapters N (default 1)")
    labels.add_argument("--popularity", help="powerlaw:ALPHA, zipf:ALPHA, uniform (default) or round-robin")
    labels.add_argument("--seed", type=int, default=0, help="seed of the popularity draw")
    labels.add_argument(
        "--label-column",
        help="give each of this column's values its own adapter instead (folded by request count when there are "
        "more values than N; one session, one adapter)",
    )
    labels.add_argument("--adapter-names", help="adapters.json whose first N names label the adapters")
    imp.set_defaults(func=_trace_import)
