"""``lorabench trace``: write a synthetic trace, import a public one, and look at either.

Its own module so the command line stays small; each subcommand imports what it needs
when it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from lorabench.cli.types import seed


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


def _unwritable(out: str, exc: OSError, option: str = "--out") -> str:
    """An OSError as one line: ``option`` (``--out``) where the write of it failed (through a
    temporary file beside it, whose name says nothing to the user), else the file it names."""
    failed = exc.filename and Path(str(exc.filename)).parent == Path(out).parent
    return f"{f'{option} {out}' if failed else exc.filename}: {exc.strerror}: check the path and its permissions"


class Renamed(argparse.Action):
    """An option's old spelling: refused with the new one, so that no option name means
    two things across subcommands (``trace import --adapters`` was a number, in ``trace
    generate`` a file)."""

    def __init__(self, option_strings: list[str], dest: str, now: str, **kwargs: Any) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs=1, help=argparse.SUPPRESS)
        self.now = now

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        parser.error(f"{option} {values[0]}: renamed, write {self.now} {values[0]}")


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
        alpha=args.popularity_alpha,
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
        return _failed("generate", _unwritable(args.out, exc))
    print(f"wrote {len(requests)} requests to {args.out}")
    return 0


def _trace_stats(args: argparse.Namespace) -> int:
    from lorabench.load.traces import data, summary

    try:
        loaded = data.load(Path(args.file))
    except ValueError as exc:
        return _failed("stats", str(exc))
    block = summary.DEFAULT_ENGINE_BLOCK if args.block_size is None else args.block_size
    if block < 1:
        return _failed("stats", f"--block-size {block}: 1 token at least: give the engine's block_size")
    print(summary.describe(loaded, block))
    if args.plot:
        from lorabench.analysis.report.trace_figures import draw_trace

        try:
            print(f"plot: {draw_trace(loaded, Path(args.plot), title=Path(args.file).name)}")
        except OSError as exc:
            return _failed("stats", _unwritable(args.plot, exc, "--plot"))
    return 0


def _import_options(args: argparse.Namespace) -> Any:
    from lorabench.load.traces.importer import ImportOptions
    from lorabench.load.traces.sources import Columns, TraceInputError

    names = None
    if args.adapters:
        from lorabench.load.adapters import read_adapters_file

        if args.adapters.isdigit() and not Path(args.adapters).exists():
            raise TraceInputError(
                f"--adapters {args.adapters}: --adapters names an adapters.json, as in trace generate; "
                f"the number of adapters is --num-adapters {args.adapters}"
            )
        try:
            names = tuple(a.name for a in read_adapters_file(Path(args.adapters)))
        except ValueError as exc:
            raise TraceInputError(f"--adapters: {exc}") from None
    given = (args.time_column, args.input_column, args.output_column)
    return ImportOptions(
        fmt=args.format,
        source=Path(args.file),
        num_adapters=args.num_adapters,
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
        prefix_column=args.prefix_column,
        block_tokens=args.hash_block_tokens,
        hash_ids=not args.no_hash_ids,
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
        return _failed("import", _unwritable(args.out, exc))
    for line in import_warnings(imported.header):
        print(f"lorabench trace import: warning: {line}", file=sys.stderr)
    print(f"wrote {len(imported)} requests ({imported.rate:.3f} req/s over {imported.duration_s:g} s) to {args.out}")
    return 0


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    traces = parser.add_subparsers(dest="action", required=True)
    tgen = traces.add_parser("generate", help="write a trace: Gamma arrivals, power-law adapter popularity")
    tgen.add_argument("--out", required=True, help="trace file to write (JSON lines)")
    _add_adapters(tgen, required=True)
    tgen.add_argument("-R", "--rate", type=float, required=True, help="total request rate, requests/s")
    tgen.add_argument(
        "--popularity-alpha",
        type=float,
        default=1.0,
        help="exponent of the adapters' power-law popularity: 1 uniform, smaller more skewed",
    )
    tgen.add_argument("--alpha", action=Renamed, now="--popularity-alpha")
    tgen.add_argument(
        "--cv", type=float, default=1.0, help="coefficient of variation of inter-arrival times (1: Poisson)"
    )
    for side in ("input", "output"):
        tgen.add_argument(
            f"--{side}-range", type=_range, default=(8, 64), metavar="LOW,HIGH", help=f"{side} tokens a request"
        )
    tgen.add_argument("--lengths", choices=["uniform", "longtail"], default="uniform", help="how lengths spread")
    tgen.add_argument("--duration", type=float, default=300.0, help="seconds of trace")
    tgen.add_argument("--seed", type=seed, default=0, help="seed of the arrivals, lengths and adapters")
    tgen.set_defaults(func=_trace_generate)
    tstats = traces.add_parser(
        "stats", help="what a trace holds: rate over time, lengths, adapter shares, and an import's steps"
    )
    tstats.add_argument("file", help="a trace that trace generate or trace import wrote")
    tstats.add_argument(
        "--block-size",
        type=int,
        help="the engine's KV block size in tokens, for the prefix hit rate hash ids predict (default: 16, vLLM's "
        "on GPUs; its CPU backend's is 128)",
    )
    tstats.add_argument("--plot", metavar="FILE.png", help="also draw rate over time, lengths and adapter shares")
    tstats.set_defaults(func=_trace_stats)
    _add_trace_import(traces)


def _add_adapters(parser: Any, required: bool) -> None:
    """The adapters a trace labels its requests with: how many, and optionally whose names;
    one meaning in both subcommands."""
    parser.add_argument(
        "-n",
        "--num-adapters",
        type=int,
        required=required,
        default=None if required else 1,
        help="number of adapters N",
    )
    parser.add_argument(
        "--adapters",
        metavar="ADAPTERS.JSON",
        help="adapters.json whose first N names label the trace's adapters (without it: adapter-0, adapter-1 ...)",
    )


def _add_trace_import(traces: Any) -> None:
    imp = traces.add_parser(
        "import",
        help="a public trace (Azure, BurstGPT, Mooncake, any CSV) as a lorabench trace",
        description="Read a public trace's arrival times and lengths, cut a window, drop requests without "
        "output, clip lengths, rescale time and give each request an adapter. The header records the source "
        "file, its sha256 and every step with the rows it touched. Formats: azure (TIMESTAMP, ContextTokens, "
        "GeneratedTokens), burstgpt (Timestamp, Request tokens, Response tokens), mooncake (JSON lines: "
        "timestamp in ms, input_length, output_length, hash_ids), csv (columns named below).",
    )
    imp.add_argument("format", help="azure, burstgpt, mooncake or csv")
    imp.add_argument("file", help="the trace to read (CSV, or JSON lines for mooncake)")
    imp.add_argument("--out", required=True, help="trace file to write (JSON lines)")
    csv_args = imp.add_argument_group("csv format: which columns hold what")
    for what in ("time", "input", "output"):
        csv_args.add_argument(
            f"--{what}-column", help=f"the column of the request's {what.replace('put', 'put tokens')}"
        )
    csv_args.add_argument(
        "--time-unit", choices=["s", "ms", "us", "datetime"], default="s", help="the time column's unit"
    )
    cut = imp.add_argument_group("window, lengths and time")
    cut.add_argument("--start", type=float, default=0.0, help="seconds from the first request")
    cut.add_argument("--duration", type=float, help="seconds of trace to keep (default: to the end)")
    cut.add_argument("--max-model-len", type=int, help="fit input+output into this many tokens (the input shortened)")
    scale = cut.add_mutually_exclusive_group()
    scale.add_argument("--time-scale", type=float, help="multiply every arrival time by this (0.01: 100x faster)")
    scale.add_argument("--rate", type=float, help="scale time so the mean rate is this many requests/s")
    labels = imp.add_argument_group("adapters")
    _add_adapters(labels, required=False)
    labels.add_argument("--adapter-names", action=Renamed, now="--adapters")
    labels.add_argument("--popularity", help="powerlaw:ALPHA, zipf:ALPHA, uniform (default) or round-robin")
    labels.add_argument("--seed", type=seed, default=0, help="seed of the popularity draw")
    labels.add_argument(
        "--label-column",
        help="give each of this column's values its own adapter instead (folded by request count when there are "
        "more values than N; one session, one adapter)",
    )
    _add_prefix_args(imp)
    imp.set_defaults(func=_trace_import)


def _add_prefix_args(imp: Any) -> None:
    """The import's hash id options (docs/online.md#shared-prefixes)."""
    from lorabench.load.traces.sources import MOONCAKE_BLOCK_TOKENS

    prefixes = imp.add_argument_group("shared prefixes (docs/online.md#shared-prefixes)")
    prefixes.add_argument(
        "--prefix-column",
        help="the column of each request's block hash ids (such as 1 2 3): requests whose ids start alike share "
        "those blocks of prompt (mooncake: hash_ids)",
    )
    prefixes.add_argument(
        "--hash-block-tokens",
        type=int,
        default=MOONCAKE_BLOCK_TOKENS,
        help=f"prompt tokens one hash id stands for (default {MOONCAKE_BLOCK_TOKENS}, Mooncake's)",
    )
    prefixes.add_argument("--no-hash-ids", action="store_true", help="import without shared prefixes")
