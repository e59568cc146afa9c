"""``lorabench history check``, the nightly gate, and ``history accept``, which acknowledges
what it found. Exit status 1 for a finding: a regression (``REGRESSION``), an adapter whose
output changed, a case or a figure the newest run lacks (``MISSING``, ``NOT MEASURED``), or
a store whose newest run is older than ``--max-age`` (the nightly stopped adding runs).
Suspected steps the family's test does not confirm yet are said (``WATCH``), never failed.
"""

from __future__ import annotations

import argparse
import io
import re
from contextlib import redirect_stdout
from datetime import datetime, timedelta, timezone
from pathlib import Path

from lorabench.analysis.history.changes import MIN_SIZE, change_points
from lorabench.analysis.history.gate import (
    CONFIRM_NIGHTS,
    GATE_THRESHOLD,
    not_comparable,
    output_changes,
    regressions,
    watch,
)
from lorabench.analysis.history.render import regression_line, watch_line
from lorabench.analysis.history.runs import HistoryError, parse_time
from lorabench.analysis.history.series import Series, machine
from lorabench.analysis.history.store import Acceptance, StoredRun, accept, acceptances, connect, run_digests
from lorabench.results.provenance import HOSTNAME_ENV

# A machine whose newest run is this much older than the store's newest is no longer judged.
STALE_AFTER = timedelta(hours=24)
# The newest run may be this old when the gate runs: a nightly's is hours old, so the first
# night its run is missing fails (docs/history.md#the-nightly-gate).
MAX_AGE = timedelta(hours=30)
CONFIRM = CONFIRM_NIGHTS
# A case missing from this many of its machine's newest runs is retired: said, not failed.
RETIRE_AFTER = 14


def add_check_args(check: argparse.ArgumentParser) -> None:
    check.add_argument(
        "--max-age",
        default="30h",
        metavar="AGE",
        help="fail when the newest run is older than this (30m, 30h, 7d; default 30h; 'off': never)",
    )


def add_accept_parser(actions) -> None:  # noqa: ANN001 - argparse's subparsers action
    accept_ = actions.add_parser(
        "accept", help="a known change or a retired case: the runs from the newest on are the baseline"
    )
    accept_.add_argument("--db", type=Path, required=True, help="the history database file")
    accept_.add_argument("-k", dest="select", required=True, metavar="EXPR", help="the cases, as pytest -k")
    accept_.add_argument("--metric", action="append", help="a metric accepted; repeat for more (default: every one)")
    accept_.add_argument("--reason", required=True, help="why, in a few words: shown by check and on the page")
    accept_.set_defaults(run=_accept)


def parse_age(text: str) -> timedelta | None:
    """``30m``, ``30h``, ``7d``; None for ``off``."""
    if text == "off":
        return None
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([mhd])", text)
    if not found:
        raise HistoryError(f"--max-age {text!r}: give minutes, hours or days (30m, 30h, 7d), or off")
    return timedelta(**{{"m": "minutes", "h": "hours", "d": "days"}[found[2]]: float(found[1])})


def _accept(args: argparse.Namespace) -> int:
    with connect(args.db, create=False) as conn:
        newest = conn.execute("SELECT run_id FROM runs ORDER BY timestamp DESC, run_id DESC LIMIT 1").fetchone()
    if newest is None:
        raise HistoryError(f"{args.db}: no runs to accept from")
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for metric in args.metric or ["*"]:
        accept(args.db, Acceptance(newest[0], args.select, metric, args.reason, now))
        print(f"accepted: -k {args.select!r} {metric}: from run {newest[0]} on ({args.reason})")
    return 0


def baselined(found: list[Series], runs: list[StoredRun], accepted: list[Acceptance], selector) -> list[Series]:  # noqa: ANN001
    """Each series from its last acceptance's run on: the runs before it are no baseline."""
    place = {r.run_id: i for i, r in enumerate(runs)}
    out = []
    for s in found:
        starts = [
            place[a.run_id]
            for a in accepted
            if a.run_id in place and a.metric in ("*", s.metric) and selector(a.case_expr)(s.case)
        ]
        at = max(starts, default=None)
        kept = [i for i, r in enumerate(s.runs) if at is None or place[r.run_id] >= at]
        if len(kept) == len(s.runs):
            out.append(s)
        elif kept:
            builds = [s.builds[i] for i in kept]
            medians = s.medians[kept[0] :]
            out.append(Series(s.case, s.metric, s.runs[kept[0] :], builds, change_points(medians), s.scenario))
    return out


def check_age(runs: list[StoredRun], max_age: timedelta | None, now: datetime | None = None) -> bool:
    """Say the newest run's age; True where it is past ``max_age`` (the store went stale)."""
    times = [t for t in map(_time, runs) if t is not None]
    if not times:
        return False
    newest = max(times)
    age = (now or datetime.now(timezone.utc)) - newest
    hours = age.total_seconds() / 3600
    print(f"newest run: {runs[-1].run_id}, {hours:.1f} hours old")
    if max_age is not None and age > max_age:
        print(
            f"STALE STORE: the newest run is {hours:.1f} hours old, past --max-age {max_age.total_seconds() / 3600:g} "
            "hours: the nightly stopped adding runs (did its run fail before writing results?)"
        )
        return True
    return False


def missing_cases(found: list[Series], judged: list[Series], by_machine: dict, accepted: list, selector) -> int:  # noqa: ANN001
    """MISSING lines (failures) for the cases measured before but not in their machine's newest
    run, and RETIRED ones for those accepted as retired since, or missing from the newest
    ``RETIRE_AFTER`` runs of their machine; how many fail."""
    failing = 0
    for case in sorted({s.case for s in found} - {s.case for s in judged}):
        of_case = [s for s in found if s.case == case]
        runs_of = [r.run_id for r in by_machine[machine(of_case[0].runs[-1])]]
        last_at = max(runs_of.index(s.runs[-1].run_id) for s in of_case)
        since = len(runs_of) - 1 - last_at
        retired = [
            a
            for a in accepted
            if a.metric == "*" and a.run_id in runs_of[last_at + 1 :] and selector(a.case_expr)(case)
        ]
        if retired:
            print(f"RETIRED {case}: accepted at run {retired[-1].run_id} ({retired[-1].reason})")
        elif since >= RETIRE_AFTER:
            print(
                f"RETIRED {case}: missing from its machine's newest {since} runs (retired after {RETIRE_AFTER}; "
                "lorabench history accept says why)"
            )
        else:
            failing += 1
            print(f"MISSING {case}: measured before, not in the newest run {runs_of[-1]} (did it fail?)")
    return failing


def say_findings(judged: list[Series], threshold: float, per_metric: dict[str, float]) -> int:
    """REGRESSION and WATCH lines; how many regressions."""
    failed = regressions(judged, threshold, per_metric)
    for r in failed:
        print(regression_line(r, len(judged)))
    for w in watch(judged, threshold, per_metric, failed):
        print(watch_line(w, len(judged)))
    for b in not_comparable(judged, threshold, per_metric):
        print(
            f"NOT COMPARABLE {b.series.case} {b.series.metric}: the newest runs are bounds (capped at max_rate "
            f"{b.newest:g}: at least that), under the level {b.level:g} before: raise capacity.max_rate past it"
        )
    return len(failed)


def stale_machines(by_machine: dict[str, list[StoredRun]]) -> list[str]:
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
        found = parse_time(run.timestamp)
    except ValueError:
        return None  # a run stored before timestamps were checked: judged as before
    return found if found.tzinfo else found.replace(tzinfo=timezone.utc)


def new_machines(by_machine: dict[str, list[StoredRun]]) -> None:
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


def by_machine_of(runs: list[StoredRun]) -> dict[str, list[StoredRun]]:
    """The runs of each machine, in the series' order."""
    grouped: dict[str, list[StoredRun]] = {}
    for run in runs:
        grouped.setdefault(machine(run), []).append(run)
    return grouped


def config_thresholds(path: str | None) -> list[str]:
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


def changed_outputs(db: Path, runs: list[StoredRun]) -> list[str]:
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


def stored_acceptances(db: Path) -> list[Acceptance]:
    with connect(db, create=False) as conn:
        return acceptances(conn)


__all__ = ["GATE_THRESHOLD"]


def page_findings(db: Path, runs: list[StoredRun], found: list[Series], threshold: float, selector) -> list:  # noqa: ANN001
    """What the history page's summary lists: the gate's findings on each machine's newest
    run (regressions, steps watched, bounds, outputs changed) and the acceptances."""
    from lorabench.analysis.history.dashboard import Finding

    accepted = stored_acceptances(db)
    by_machine = by_machine_of(runs)
    newest = {host: runs_of[-1].run_id for host, runs_of in by_machine.items()}
    judged = [s for s in baselined(found, runs, accepted, selector) if s.runs[-1].run_id == newest[machine(s.runs[-1])]]
    failed = regressions(judged, threshold, {})
    out = [Finding("REGRESSION", regression_line(r, len(judged)).split(" ", 1)[1], r.worse, r.series) for r in failed]
    out += [
        Finding("WATCH", watch_line(w, len(judged)).split(" ", 1)[1], w.worse, w.series)
        for w in watch(judged, threshold, {}, failed)
    ]
    out += [
        Finding("NOT COMPARABLE", f"{b.series.case} {b.series.metric}: capped at {b.newest:g}", 0.0, b.series)
        for b in not_comparable(judged, threshold, {})
    ]
    with redirect_stdout(io.StringIO()):  # the lines are the summary's, not the terminal's
        changed = [line for runs_of in by_machine.values() for line in changed_outputs(db, runs_of)]
    out += [Finding("OUTPUT CHANGED", line.split(" ", 2)[2]) for line in changed]
    out += [Finding("ACCEPTED", f"-k {a.case_expr!r} {a.metric} from run {a.run_id}: {a.reason}") for a in accepted]
    return out
