"""lorabench history: runs across commits of vLLM, vllm-ascend and lorabench, in one store.

add: put result files' runs in the store (again: nothing changes). show: each case's metric
over the runs, in order, with its change points. report: the same as one static page.
check: the nightly gate, exit status 1 when the newest run lies after a change point that
made a metric worse beyond its threshold, an adapter's output changed in it, or it lacks a
case or a figure earlier runs had (MISSING, NOT MEASURED).
Exit status 0: done, nothing found; 1: a finding (check); 2: bad input.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from pathlib import Path

from lorabench.analysis.history.changes import MIN_SIZE
from lorabench.analysis.history.gate import GATE_THRESHOLD, output_changes, regressions, unconfirmed
from lorabench.analysis.history.render import regression_line, render_series
from lorabench.analysis.history.runs import HistoryError, parse_time
from lorabench.analysis.history.series import Series, machine, ordered_runs, series
from lorabench.analysis.history.store import StoredRun, add_runs, connect, run_digests
from lorabench.results.provenance import HOSTNAME_ENV
from lorabench.results.records import is_companion, result_files

DEFAULT_METRICS = ("ttft_ms", "decode_ms", "e2e_ms")
# A machine whose newest run is this much older than the store's newest is no longer judged.
STALE_AFTER = timedelta(hours=24)


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
    check.set_defaults(run=_check)
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
    found = _series(args, list(DEFAULT_METRICS))[1]
    try:
        page = write_dashboard(found, out, f"lorabench history: {args.db.name}")
    except OSError as exc:
        raise HistoryError(f"--out {out}: cannot be written ({exc.strerror})") from None
    print(f"report: {page}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from lorabench.analysis.cases import METRICS, OCCASIONAL
    from lorabench.analysis.compare import CompareError, parse_thresholds

    given = [*_config_thresholds(args.config), *args.threshold]  # the command line's last: they win
    try:
        threshold, per_metric = parse_thresholds(given, default=GATE_THRESHOLD)
    except CompareError as exc:
        raise HistoryError(str(exc)) from None
    runs, found = _series(args, list(METRICS))
    # Each machine's newest run is judged: a store several hosts add to holds series of each.
    by_machine = _by_machine(runs)
    stale = _stale(by_machine)
    by_machine = {host: runs_of for host, runs_of in by_machine.items() if host not in stale}
    found = [s for s in found if machine(s.runs[-1]) in by_machine]
    _new_machines(by_machine)
    newest = {host: runs_of[-1] for host, runs_of in by_machine.items()}
    judged = [s for s in found if s.runs[-1].run_id == newest[machine(s.runs[-1])].run_id]
    newest_of = {s.case: newest[machine(s.runs[-1])].run_id for s in found}
    missing = sorted({s.case for s in found} - {s.case for s in judged})
    for case in missing:
        print(f"MISSING {case}: measured before, not in the newest run {newest_of[case]} (did it fail?)")
    cases, judged_ids = {s.case for s in judged}, {id(s) for s in judged}
    unmeasured = [s for s in found if s.case in cases and id(s) not in judged_ids and s.metric not in OCCASIONAL]
    for s in unmeasured:
        print(
            f"NOT MEASURED {s.case} {s.metric}: measured before (last in run {s.runs[-1].run_id}), blank in the "
            f"newest run {newest_of[s.case]} (a capacity search that found only a bound, a failed measurement)"
        )
    failed = regressions(judged, threshold, per_metric)
    for r in failed:
        print(regression_line(r, len(judged)))
    watch = unconfirmed(judged, threshold, per_metric, failed)
    for u in watch:
        print(
            f"UNCONFIRMED {u.series.case} {u.series.metric}: the newest run {u.series.runs[-1].run_id} is "
            f"{100 * u.worse:.1f} % worse than its level ({u.level:.3f} -> {u.newest:.3f}) and than every run of "
            f"it; a change point needs {MIN_SIZE} runs after it, so no night fails for it yet: watch the next ones"
        )
    changed = [line for runs_of in by_machine.values() for line in _output_changes(args.db, runs_of)]
    verdict = f"{len(failed)} regressed" if failed else "no regression"
    verdict += f" ({len(watch)} unconfirmed)" if watch else ""
    outputs = f"{len(changed)} adapter output(s) changed" if changed else "no output changed"
    newest_runs = ", ".join(r.run_id for r in newest.values())
    # A change point needs MIN_SIZE runs each side: a shorter series passes because it cannot fail.
    short = sum(len(s.runs) < 2 * MIN_SIZE for s in judged)
    unjudged = f" ({short} of them under {2 * MIN_SIZE} runs: too short to judge)" if short else ""
    print(
        f"history check: {verdict} beyond {threshold:.0%} (or the metric's own) in {len(judged)} series of the "
        f"newest run ({newest_runs}){unjudged}; {len(missing)} case(s) missing from it, {len(unmeasured)} "
        f"figure(s) blank in it; {outputs}"
    )
    return 1 if failed or changed or missing or unmeasured else 0


def _stale(by_machine: dict[str, list[StoredRun]]) -> list[str]:
    """The machines whose newest run is over ``STALE_AFTER`` older than the store's newest,
    each said and left unjudged: a retired host's last night would fail (or pass) the gate
    every night after it."""
    when = {host: _time(runs_of[-1]) for host, runs_of in by_machine.items()}
    known = [t for t in when.values() if t is not None]
    latest = max(known, default=None)
    stale = [host for host, t in when.items() if t is not None and latest - t > STALE_AFTER]
    for host in stale:
        days = (latest - when[host]).total_seconds() / 86400
        print(
            f"STALE {host}: its newest run {by_machine[host][-1].run_id} is {days:.1f} days older than the store's "
            "newest, so it is not judged (a retired host, or one whose runs stopped reaching the store)"
        )
    return stale


def _time(run: StoredRun) -> datetime | None:
    try:
        return parse_time(run.timestamp)
    except ValueError:
        return None  # a run stored before timestamps were checked: judged as before


def _new_machines(by_machine: dict[str, list[StoredRun]]) -> None:
    """Say which machines have too few runs to judge while others have enough: a host name
    that changes every run (a container's) starts a new series each night, and its gate
    would pass every night in silence."""
    enough = [host for host, runs_of in by_machine.items() if len(runs_of) >= 2 * MIN_SIZE]
    for host, runs_of in by_machine.items():
        if enough and len(runs_of) < 2 * MIN_SIZE:
            print(
                f"NEW MACHINE {host}: {len(runs_of)} run(s), under the {2 * MIN_SIZE} a change point needs, so "
                f"nothing of it is judged; the store's longer series are of {', '.join(enough)}. A host name that "
                f"changes every run starts a new series each time: set {HOSTNAME_ENV} to one name (docs/history.md)"
            )


def _by_machine(runs: list[StoredRun]) -> dict[str, list[StoredRun]]:
    """The runs of each machine, in the series' order."""
    grouped: dict[str, list[StoredRun]] = {}
    for run in runs:
        grouped.setdefault(machine(run), []).append(run)
    return grouped


def _config_thresholds(path: str | None) -> list[str]:
    """The config's history thresholds, spelt as --threshold values."""
    if path is None:
        return []
    from lorabench.config import ConfigError, read_config_file

    if not Path(path).is_file():
        raise HistoryError(f"--config {path}: no such file: name a benchmark config with a history section")
    try:
        history = read_config_file(Path(path)).history
    except ConfigError as exc:
        raise HistoryError("\n".join(exc.problems)) from None
    overall = [] if history.threshold_pct is None else [f"{history.threshold_pct}%"]
    return overall + [f"{metric}={pct}%" for metric, pct in history.metrics_pct.items()]


def _output_changes(db: Path, runs: list[StoredRun]) -> list[str]:
    """OUTPUT CHANGED lines: the newest run against the one before it (of one machine: hosts
    may answer differently), adapter by adapter."""
    if len(runs) < 2:
        return []
    before, newest = runs[-2], runs[-1]
    with connect(db, create=False) as conn:
        changed = output_changes(run_digests(conn, newest.run_id), run_digests(conn, before.run_id))
    lines = [
        f"OUTPUT CHANGED {model} ({device}) adapter {adapter}: greedy output {old} -> {new} between run "
        f"{before.run_id} and {newest.run_id} (stack {before.stack_id} -> {newest.stack_id})"
        for (model, device, adapter), old, new in changed
    ]
    for line in lines:
        print(line)
    return lines
