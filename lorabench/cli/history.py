"""lorabench history: runs across commits of vLLM, vllm-ascend and lorabench, in one store.

add: put result files' runs in the store (again: nothing changes). show: each case's metric
over the runs, in order, with its change points. report: the same as one static page.
check: the nightly gate (``history_check``), exit status 1 when the newest run's level, or
its newest nights, made a metric worse beyond its threshold, an adapter's output changed, it
lacks a case or a figure earlier runs had, or the store's newest run is too old. accept: a
known change or a retired case becomes the baseline, with its reason.
Exit status 0: done, nothing found; 1: a finding (check); 2: bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lorabench.analysis.history.gate import GATE_THRESHOLD
from lorabench.analysis.history.render import render_series
from lorabench.analysis.history.runs import HistoryError
from lorabench.analysis.history.series import Series, ordered_runs, series
from lorabench.analysis.history.store import StoredRun, add_runs, connect
from lorabench.cli import history_accept
from lorabench.cli import history_check as check_
from lorabench.results.records import is_companion, result_files

DEFAULT_METRICS = ("ttft_ms", "decode_ms", "e2e_ms")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="add result files' runs to the store (made if missing)")
    add.add_argument("--db", type=Path, required=True, help="the history database file")
    add.add_argument(
        "results",
        nargs="+",
        type=Path,
        help="result CSV files written by a benchmark session, or folders of them (the samples and digests "
        "files beside them are skipped)",
    )
    add.set_defaults(run=_add)
    show = actions.add_parser("show", help="each case's metric over the runs, with its change points")
    _add_selection(show, f"a result column to follow; repeat for more (default: {', '.join(DEFAULT_METRICS)})")
    show.set_defaults(run=_show)
    check = actions.add_parser(
        "check",
        help="the nightly gate: exit status 1 when the newest run lies after a regression beyond its threshold, "
        "changed an adapter's output, or lacks a case or a figure earlier runs had",
    )
    _add_selection(check, "a result column to judge; repeat for more (default: every compared column)")
    _add_thresholds(check)
    check_.add_check_args(check)
    check.set_defaults(run=_check)
    history_accept.add_accept_parser(actions, _accept)
    report = actions.add_parser("report", help="the history as one static page: DIR/index.html, opened offline")
    _add_selection(report, f"a result column to draw; repeat for more (default: {', '.join(DEFAULT_METRICS)})")
    report.add_argument("--out", required=True, help="folder for index.html (made if missing)")
    _add_thresholds(report)
    report.set_defaults(run=_report)


def _add_thresholds(parser: argparse.ArgumentParser) -> None:
    """The gate's thresholds: check's, and the page's summary, which is the gate's."""
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="[METRIC=]PCT",
        help=f"smallest worsening that fails the gate, default {100 * GATE_THRESHOLD:.0f}%%; "
        "repeat per metric, e.g. decode_ms=3%%; overrides the config's",
    )
    parser.add_argument("--config", help="a benchmark config whose history section sets the thresholds (default: none)")


def _add_selection(parser: argparse.ArgumentParser, metric_help: str) -> None:
    parser.add_argument("--db", type=Path, required=True, help="the history database file")
    parser.add_argument(
        "-k", dest="select", metavar="EXPR", help="cases whose name matches, as pytest -k (default: all)"
    )
    parser.add_argument("--metric", action="append", help=metric_help)
    parser.add_argument("--order", type=Path, help="a file of stack ids, oldest first (default: the runs' time)")


def main(args: argparse.Namespace) -> int:
    try:
        return args.run(args)
    except HistoryError as exc:
        for line in str(exc).splitlines():  # a config's problems: one line each
            print(f"lorabench history {args.action}: {line}", file=sys.stderr)
        return 2


def _add(args: argparse.Namespace) -> int:
    """A folder is its result files; a file written beside one (``results/*.csv`` matches
    them too) is skipped, and said."""
    paths = [p for given in args.results for p in (result_files(given) if given.is_dir() else [given])]
    if all(is_companion(p) for p in paths):
        raise HistoryError(
            f"{', '.join(map(str, args.results))}: no result files there: give a results folder or CSV files"
        )
    beside = [p for p in paths if is_companion(p)]
    if beside:
        print(f"skipped {len(beside)} samples and digests file(s) written beside result files")
    for run, status in add_runs(args.db, [p for p in paths if not is_companion(p)]):
        print(f"{status}: run {run.run_id} (stack {run.stack_id}, {run.timestamp})")
    return 0


def _selector(expr: str | None):  # noqa: ANN202 - a predicate on a case's label
    if not expr:
        return lambda label: True
    from _pytest.mark.expression import Expression  # pytest -k's own grammar

    try:
        compiled = Expression.compile(expr)
    except SyntaxError as exc:
        raise HistoryError(f"-k {expr!r}: {exc.msg}") from None
    return lambda label: compiled.evaluate(lambda name, **_: name.lower() in label.lower())


def _series(args: argparse.Namespace, default_metrics: list[str]) -> tuple[list[StoredRun], list[Series]]:
    from lorabench.analysis.cases import METRICS

    metrics = args.metric or default_metrics
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise HistoryError(f"--metric {unknown[0]}: not a compared column; columns are {', '.join(METRICS)}")
    with connect(args.db, create=False) as conn:
        runs = ordered_runs(conn, args.order)
        found = series(conn, runs, metrics, _selector(args.select))
    if not found:
        raise HistoryError(f"{args.db}: no stored case matches -k {args.select!r}" if args.select else "no runs")
    return runs, found


def _show(args: argparse.Namespace) -> int:
    for s in _series(args, list(DEFAULT_METRICS))[1]:
        print(render_series(s))
    return 0


def _report(args: argparse.Namespace) -> int:
    from lorabench.analysis.cases import METRICS
    from lorabench.analysis.history.dashboard import write_dashboard

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise HistoryError(f"--out {out}: is a file: name a folder for index.html")
    runs, found = _series(args, list(DEFAULT_METRICS))
    threshold, per_metric = _thresholds(args)
    # The summary is the gate's, judged as check judges (every metric, the same family).
    judged_runs, every = _series(argparse.Namespace(**{**vars(args), "metric": None}), list(METRICS))
    verdict = check_.judge(args.db, judged_runs, every, threshold, per_metric, None, _selector)
    try:
        page = write_dashboard(found, out, f"lorabench history: {args.db.name}", verdict.findings)
    except OSError as exc:
        raise HistoryError(f"--out {out}: cannot be written ({exc.strerror})") from None
    print(f"report: {page}")
    return 0


def _accept(args: argparse.Namespace) -> int:
    """The series ``-k`` and ``--metric`` select, checked as ``show`` checks them (a bad
    expression, an unknown metric, no match: one line, exit 2), then the acceptance kept."""
    from lorabench.analysis.cases import METRICS

    return history_accept.record(args, _series(args, list(METRICS))[1])


def _thresholds(args: argparse.Namespace) -> tuple[float, dict[str, float]]:
    from lorabench.analysis.compare import CompareError, parse_thresholds

    given = [*check_.config_thresholds(args.config), *args.threshold]  # the command line's last: they win
    try:
        return parse_thresholds(given, default=GATE_THRESHOLD)
    except CompareError as exc:
        raise HistoryError(str(exc)) from None


def _check(args: argparse.Namespace) -> int:
    from lorabench.analysis.cases import METRICS

    max_age = check_.parse_age(args.max_age)
    threshold, per_metric = _thresholds(args)
    runs, found = _series(args, list(METRICS))
    verdict = check_.judge(args.db, runs, found, threshold, per_metric, max_age, _selector)
    for f in verdict.findings:
        print(f"{f.kind} {f.text}" if f.kind else f.text)
    print(verdict.summary(threshold))
    return 1 if verdict.failed else 0
