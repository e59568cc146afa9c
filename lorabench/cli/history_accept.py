"""``lorabench history accept``: a known change becomes the baseline, or a case is retired,
with its reason; and what an acceptance does to the series the gate judges.

An acceptance is kept in the store, never undone by a later one: for the cases ``-k``
selects (and the metrics named, or every one), the runs from the store's newest at the
time on are the baseline. ``--retire`` also says the cases may be missing from then on.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path

from lorabench.analysis.history.changes import change_points
from lorabench.analysis.history.runs import HistoryError
from lorabench.analysis.history.series import Series
from lorabench.analysis.history.store import Acceptance, StoredRun, accept, acceptances, connect

# How many matched cases ``accept`` names before it counts the rest.
NAMED = 10


def add_accept_parser(actions, run) -> None:  # noqa: ANN001 - argparse's subparsers action; cli.history's runner
    parser = actions.add_parser(
        "accept", help="a known change or a retired case: the runs from the newest on are the baseline"
    )
    parser.add_argument("--db", type=Path, required=True, help="the history database file")
    parser.add_argument("-k", dest="select", required=True, metavar="EXPR", help="the cases, as pytest -k")
    parser.add_argument("--metric", action="append", help="a metric accepted; repeat for more (default: every one)")
    parser.add_argument("--reason", required=True, help="why, in a few words: shown by check and on the page")
    parser.add_argument(
        "--retire", action="store_true", help="the cases are retired too: missing from the newest run on fails nothing"
    )
    parser.set_defaults(run=run, order=None)


def record(args: argparse.Namespace, found: list[Series]) -> int:
    """Keep the acceptance of the series ``found`` (``-k`` and ``--metric`` already applied,
    at least one), after saying which cases it covers: a loose ``-k`` shows here, not later."""
    if not found:
        raise HistoryError(f"-k {args.select!r}: no stored case matches it (and --metric, if given): nothing accepted")
    with connect(args.db, create=False) as conn:
        newest = conn.execute("SELECT run_id FROM runs ORDER BY timestamp DESC, run_id DESC LIMIT 1").fetchone()[0]
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for metric in args.metric or ["*"]:
        accept(args.db, Acceptance(newest, args.select, metric, args.reason, now, args.retire))
    cases = sorted({s.case for s in found})
    more = f" and {len(cases) - NAMED} more" if len(cases) > NAMED else ""
    what = "retired and accepted" if args.retire else "accepted"
    print(f"{what}: {len(cases)} case(s) from run {newest} on ({args.reason}): {'; '.join(cases[:NAMED])}{more}")
    return 0


def stored(db: Path) -> list[Acceptance]:
    with connect(db, create=False) as conn:
        return acceptances(conn)


def baselined(found: list[Series], runs: list[StoredRun], accepted: list[Acceptance], selector) -> list[Series]:  # noqa: ANN001
    """Each series from its last acceptance's run on: the runs before it are no baseline. A
    series with no run since is left out here: whether its case is missing is judged before."""
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
            first = kept[0]
            builds, medians = s.builds[first:], s.medians[first:]
            bounds = s.bounds[first:] if s.bounds else ()
            out.append(Series(s.case, s.metric, s.runs[first:], builds, change_points(medians), s.scenario, bounds))
    return out


def retired(case: str, since: list[str], accepted: list[Acceptance], selector) -> Acceptance | None:  # noqa: ANN001
    """The acceptance that retired ``case`` at one of the runs ``since`` its last measurement, if any."""
    found = [a for a in accepted if a.retire and a.run_id in since and selector(a.case_expr)(case)]
    return found[-1] if found else None
