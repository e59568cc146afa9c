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

from lorabench.analysis.history.changes import MIN_SIZE
from lorabench.analysis.history.gate import GATE_THRESHOLD
from lorabench.analysis.history.render import render_series
from lorabench.analysis.history.runs import HistoryError
from lorabench.analysis.history.series import Series, machine, ordered_runs, series
from lorabench.analysis.history.store import StoredRun, add_runs, connect
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
    check.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="[METRIC=]PCT",
        help=f"smallest worsening that fails the gate, default {100 * GATE_THRESHOLD:.0f}%%; "
        "repeat per metric, e.g. decode_ms=3%%; overrides the config's",
    )
    check.add_argument("--config", help="a benchmark config whose history section sets the thresholds (default: none)")
    check_.add_check_args(check)
    check.set_defaults(run=_check)
    check_.add_accept_parser(actions)
    report = actions.add_parser("report", help="the history as one static page: DIR/index.html, opened offline")
    _add_selection(report, f"a result column to draw; repeat for more (default: {', '.join(DEFAULT_METRICS)})")
    report.add_argument("--out", required=True, help="folder for index.html (made if missing)")
    report.set_defaults(run=_report)


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
    from lorabench.analysis.history.dashboard import write_dashboard

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise HistoryError(f"--out {out}: is a file: name a folder for index.html")
    runs, found = _series(args, list(DEFAULT_METRICS))
    findings = check_.page_findings(args.db, runs, found, GATE_THRESHOLD, _selector)
    try:
        page = write_dashboard(found, out, f"lorabench history: {args.db.name}", findings)
    except OSError as exc:
        raise HistoryError(f"--out {out}: cannot be written ({exc.strerror})") from None
    print(f"report: {page}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from lorabench.analysis.cases import METRICS, OCCASIONAL
    from lorabench.analysis.compare import CompareError, parse_thresholds

    max_age = check_.parse_age(args.max_age)
    given = [*check_.config_thresholds(args.config), *args.threshold]  # the command line's last: they win
    try:
        threshold, per_metric = parse_thresholds(given, default=GATE_THRESHOLD)
    except CompareError as exc:
        raise HistoryError(str(exc)) from None
    runs, found = _series(args, list(METRICS))
    stale_store = check_.check_age(runs, max_age)
    accepted = check_.stored_acceptances(args.db)
    for a in accepted:
        print(f"ACCEPTED -k {a.case_expr!r} {a.metric}: from run {a.run_id} on ({a.reason}; {a.accepted_at})")
    # Each machine's newest run is judged: a store several hosts add to holds series of each.
    by_machine = check_.by_machine_of(runs)
    stale = check_.stale_machines(by_machine)
    by_machine = {host: runs_of for host, runs_of in by_machine.items() if host not in stale}
    found = [s for s in found if machine(s.runs[-1]) in by_machine]
    check_.new_machines(by_machine)
    newest = {host: runs_of[-1] for host, runs_of in by_machine.items()}
    judged = [s for s in found if s.runs[-1].run_id == newest[machine(s.runs[-1])].run_id]
    missing = check_.missing_cases(found, judged, by_machine, accepted, _selector)
    found = check_.baselined(found, runs, accepted, _selector)  # an accepted level is the baseline
    judged = [s for s in found if s.runs[-1].run_id == newest[machine(s.runs[-1])].run_id]
    cases, judged_ids = {s.case for s in judged}, {id(s) for s in judged}
    unmeasured = [s for s in found if s.case in cases and id(s) not in judged_ids and s.metric not in OCCASIONAL]
    for s in unmeasured:
        print(
            f"NOT MEASURED {s.case} {s.metric}: measured before (last in run {s.runs[-1].run_id}), blank in the "
            f"newest run {newest[machine(s.runs[-1])].run_id} (a capacity search that found only a bound, a failed "
            "measurement)"
        )
    failed = check_.say_findings(judged, threshold, per_metric)
    changed = [line for runs_of in by_machine.values() for line in check_.changed_outputs(args.db, runs_of)]
    verdict = f"{failed} regressed" if failed else "no regression"
    outputs = f"{len(changed)} adapter output(s) changed" if changed else "no output changed"
    newest_runs = ", ".join(r.run_id for r in newest.values())
    # The newest level needs MIN_SIZE runs before it: a shorter series cannot fail.
    short = sum(len(s.runs) < MIN_SIZE + check_.CONFIRM for s in judged)
    unjudged = f" ({short} of them under {MIN_SIZE + check_.CONFIRM} runs: too short to judge)" if short else ""
    print(
        f"history check: {verdict} beyond {threshold:.0%} (or the metric's own) in {len(judged)} series of the "
        f"newest run ({newest_runs}){unjudged}; {missing} case(s) missing from it, {len(unmeasured)} "
        f"figure(s) blank in it; {outputs}"
    )
    return 1 if failed or changed or missing or unmeasured or stale_store else 0
