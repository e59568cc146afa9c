"""lorabench history: runs across commits of vLLM, vllm-ascend and lorabench, in one store.

add: put result files' runs in the store (again: nothing changes). show: each case's metric
over the runs, in order, with its change points. check: the nightly gate, exit status 1 when
the newest run lies after a change point that made a metric worse beyond its threshold.
Exit status 0: done, nothing found; 1: a regression (check); 2: bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lorabench.analysis.history.changes import ALPHA
from lorabench.analysis.history.gate import GATE_THRESHOLD, Regression, regressions
from lorabench.analysis.history.series import Series, ordered_runs, series
from lorabench.analysis.history.store import HistoryError, add_runs, connect

DEFAULT_METRICS = ("ttft_ms", "decode_ms", "e2e_ms")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="add result files' runs to the store (made if missing)")
    add.add_argument("--db", type=Path, required=True, help="the history database file")
    add.add_argument("results", nargs="+", type=Path, help="result CSV files written by a benchmark session")
    add.set_defaults(run=_add)
    show = actions.add_parser("show", help="each case's metric over the runs, with its change points")
    _add_selection(show, f"a result column to follow; repeat for more (default: {', '.join(DEFAULT_METRICS)})")
    show.set_defaults(run=_show)
    check = actions.add_parser(
        "check", help="the nightly gate: exit status 1 when the newest run lies after a regression beyond its threshold"
    )
    _add_selection(check, "a result column to judge; repeat for more (default: every compared column)")
    check.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="[METRIC=]PCT",
        help=f"smallest worsening that fails the gate, default {100 * GATE_THRESHOLD:.0f}%%; "
        "repeat per metric, e.g. decode_ms=3%%",
    )
    check.set_defaults(run=_check)


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
        print(f"lorabench history {args.action}: {exc}", file=sys.stderr)
        return 2


def _add(args: argparse.Namespace) -> int:
    for run, new in add_runs(args.db, args.results):
        print(f"{'added' if new else 'already stored'}: run {run.run_id} (stack {run.stack_id}, {run.timestamp})")
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


def _series(args: argparse.Namespace, default_metrics: list[str]) -> list[Series]:
    from lorabench.analysis.compare.load import METRICS

    metrics = args.metric or default_metrics
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise HistoryError(f"--metric {unknown[0]}: not a compared column; columns are {', '.join(METRICS)}")
    with connect(args.db, create=False) as conn:
        runs = ordered_runs(conn, args.order)
        found = series(conn, runs, metrics, _selector(args.select))
    if not found:
        raise HistoryError(f"{args.db}: no stored case matches -k {args.select!r}" if args.select else "no runs")
    return found


def _show(args: argparse.Namespace) -> int:
    for s in _series(args, list(DEFAULT_METRICS)):
        print(_render(s))
    return 0


def _check(args: argparse.Namespace) -> int:
    from lorabench.analysis.compare import CompareError, parse_thresholds
    from lorabench.analysis.compare.load import METRICS

    try:
        threshold, per_metric = parse_thresholds(args.threshold, default=GATE_THRESHOLD)
    except CompareError as exc:
        raise HistoryError(str(exc)) from None
    found = _series(args, list(METRICS))
    failed = regressions(found, threshold, per_metric)
    for r in failed:
        print(_regression_line(r))
    newest = max((s.runs[-1] for s in found), key=lambda r: r.timestamp)
    verdict = f"{len(failed)} regressed" if failed else "no regression"
    print(f"history check: {verdict} beyond {threshold:.0%} in {len(found)} series; newest run {newest.run_id}")
    return 1 if failed else 0


def _regression_line(r: Regression) -> str:
    s, c = r.series, r.change
    before, after = s.runs[c.position - 1], s.runs[c.position]
    return (
        f"REGRESSION {s.case} {s.metric}: {c.before:.3f} -> {c.after:.3f} "
        f"({100 * r.worse:.1f} % worse, p {c.p_value:.3f}) from run {after.run_id}: "
        f"stack {before.stack_id} -> {after.stack_id} ({r.stack_change()})"
    )


def _render(s: Series) -> str:
    lines = [f"{s.case}  {s.metric}  ({len(s.runs)} runs; change points at p <= {ALPHA})"]
    lines += [
        f"  {i:3d}  {r.timestamp}  stack {r.stack_id}  {m:10.3f}  ({len(b)} builds)"
        for i, (r, m, b) in enumerate(zip(s.runs, s.medians, s.builds))
    ]
    for c in s.changes:
        before, after = s.runs[c.position - 1], s.runs[c.position]
        lines.append(
            f"  change at run {c.position}: {c.before:.3f} -> {c.after:.3f} ({100 * (c.ratio - 1):+.1f} %, "
            f"p {c.p_value:.3f}), stack {before.stack_id} -> {after.stack_id}"
        )
    return "\n".join(lines)
