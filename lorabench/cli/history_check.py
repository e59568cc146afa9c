"""``lorabench history check``, the nightly gate, as findings: ``check`` prints them and the
history page's summary lists the same ones, so the two never disagree. Exit status 1 for a
finding: a regression (``REGRESSION``), an adapter whose output changed, a case or a figure
the newest run lacks (``MISSING``, ``NOT MEASURED``), or a store whose newest run is older
than ``--max-age`` (the nightly stopped adding runs). Suspected steps the family's test does
not confirm yet are said (``WATCH``), never failed; so are acceptances and retired cases.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from lorabench.analysis.cases import OCCASIONAL
from lorabench.analysis.history.changes import MIN_SIZE
from lorabench.analysis.history.dashboard import Finding
from lorabench.analysis.history.gate import CONFIRM_NIGHTS, not_comparable, output_changes, regressions, watch
from lorabench.analysis.history.render import regression_line, watch_line
from lorabench.analysis.history.runs import HistoryError, parse_time
from lorabench.analysis.history.series import Series, machine
from lorabench.analysis.history.store import StoredRun, connect, run_digests
from lorabench.cli import history_accept
from lorabench.results.provenance import HOSTNAME_ENV

# A machine whose newest run is this much older than the store's newest is no longer judged.
STALE_AFTER = timedelta(hours=24)
# A case missing from this many of its machine's newest runs is retired: said, not failed.
RETIRE_AFTER = 14
# The kinds of finding that fail the gate.
FAILING = ("STALE STORE", "MISSING", "NOT MEASURED", "REGRESSION", "OUTPUT CHANGED")


def add_check_args(check: argparse.ArgumentParser) -> None:
    check.add_argument(
        "--max-age",
        default="30h",
        metavar="AGE",
        help="fail when the newest run is older than this (30m, 30h, 7d; default 30h; 'off': never)",
    )


def parse_age(text: str) -> timedelta | None:
    """``30m``, ``30h``, ``7d``; None for ``off``."""
    if text == "off":
        return None
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([mhd])", text)
    if not found:
        raise HistoryError(f"--max-age {text!r}: give minutes, hours or days (30m, 30h, 7d), or off")
    return timedelta(**{{"m": "minutes", "h": "hours", "d": "days"}[found[2]]: float(found[1])})


@dataclass
class Verdict:
    """The gate's findings on each machine's newest run, in the order they are said."""

    findings: list[Finding] = field(default_factory=list)
    judged: int = 0  # series judged
    short: int = 0  # of them, too short to fail
    newest: str = ""  # each machine's newest run

    def add(self, kind: str, text: str, severity: float = 0.0, series: Series | None = None) -> None:
        self.findings.append(Finding(kind, text, severity, series))

    def count(self, kind: str) -> int:
        return sum(f.kind == kind for f in self.findings)

    @property
    def failed(self) -> bool:
        return any(f.kind in FAILING for f in self.findings)

    def summary(self, threshold: float) -> str:
        failed = self.count("REGRESSION")
        verdict = f"{failed} regressed" if failed else "no regression"
        changed = self.count("OUTPUT CHANGED")
        outputs = f"{changed} adapter output(s) changed" if changed else "no output changed"
        floor = MIN_SIZE + CONFIRM_NIGHTS  # a level before the newest nights, and two of them
        short = f" ({self.short} of them under {floor} runs: too short to judge)" if self.short else ""
        return (
            f"history check: {verdict} beyond {threshold:.0%} (or the metric's own) in {self.judged} series of "
            f"the newest run ({self.newest}){short}; {self.count('MISSING')} case(s) missing from it, "
            f"{self.count('NOT MEASURED')} figure(s) blank in it; {outputs}"
        )


def judge(db: Path, runs, found, threshold: float, per_metric: dict, max_age: timedelta | None, selector) -> Verdict:  # noqa: ANN001
    """Every finding of the gate on ``found`` (every selected series of the store)."""
    verdict = Verdict()
    _age(verdict, runs, max_age)
    accepted = history_accept.stored(db)
    for a in accepted:
        what = "retired and accepted" if a.retire else "accepted"
        verdict.add("ACCEPTED", f"-k {a.case_expr!r} {a.metric} ({what}): from run {a.run_id} on ({a.reason})")
    # Each machine's newest run is judged: a store several hosts add to holds series of each.
    by_machine = _stale_machines(verdict, by_machine_of(runs))
    found = [s for s in found if machine(s.runs[-1]) in by_machine]
    _new_machines(verdict, by_machine)
    newest = {host: runs_of[-1].run_id for host, runs_of in by_machine.items()}
    judged = [s for s in found if s.runs[-1].run_id == newest[machine(s.runs[-1])]]
    _missing(verdict, found, judged, by_machine, accepted, selector)
    _unmeasured(verdict, found, judged, newest)
    # An accepted level is the baseline; what is missing was judged on the whole series above.
    judged = [s for s in history_accept.baselined(judged, runs, accepted, selector) if s.runs]
    verdict.judged, verdict.newest = len(judged), ", ".join(dict.fromkeys(newest.values()))
    verdict.short = sum(len(s.runs) < MIN_SIZE + CONFIRM_NIGHTS for s in judged)
    failed = regressions(judged, threshold, per_metric)
    for r in failed:
        verdict.add("REGRESSION", regression_line(r, len(judged)).split(" ", 1)[1], r.worse, r.series)
    for w in watch(judged, threshold, per_metric, failed):
        verdict.add("WATCH", watch_line(w, len(judged)).split(" ", 1)[1], w.worse, w.series)
    for b in not_comparable(judged, threshold, per_metric):
        verdict.add(
            "NOT COMPARABLE",
            f"{b.series.case} {b.series.metric}: the newest runs are bounds (every build capped at max_rate "
            f"{b.newest:g}: at least that), under the level {b.level:g} before: raise capacity.max_rate past it",
            0.0,
            b.series,
        )
    _changed_outputs(verdict, db, by_machine)
    return verdict


def _age(verdict: Verdict, runs: list[StoredRun], max_age: timedelta | None) -> None:
    """Say the newest run's age; STALE STORE where it is past ``max_age``."""
    times = [t for t in map(_time, runs) if t is not None]
    if not times:
        return
    hours = (datetime.now(timezone.utc) - max(times)).total_seconds() / 3600
    verdict.add("", f"newest run: {runs[-1].run_id}, {hours:.1f} hours old")
    if max_age is not None and hours * 3600 > max_age.total_seconds():
        verdict.add(
            "STALE STORE",
            f"the newest run is {hours:.1f} hours old, past --max-age {max_age.total_seconds() / 3600:g} hours: "
            "the nightly stopped adding runs (did its run fail before writing results?)",
        )


def _missing(verdict: Verdict, found: list[Series], judged: list[Series], by_machine: dict, accepted, selector) -> None:  # noqa: ANN001
    """MISSING (a failure) for a case measured before but not in its machine's newest run;
    RETIRED where ``history accept --retire`` said so since, or it has been missing from its
    machine's newest ``RETIRE_AFTER`` runs."""
    for case in sorted({s.case for s in found} - {s.case for s in judged}):
        of_case = [s for s in found if s.case == case]
        runs_of = [r.run_id for r in by_machine[machine(of_case[0].runs[-1])]]
        last_at = max(runs_of.index(s.runs[-1].run_id) for s in of_case)
        since = len(runs_of) - 1 - last_at
        retired = history_accept.retired(case, runs_of[last_at + 1 :], accepted, selector)
        if retired is not None:
            verdict.add("RETIRED", f"{case}: retired at run {retired.run_id} ({retired.reason})")
        elif since >= RETIRE_AFTER:
            verdict.add(
                "RETIRED",
                f"{case}: missing from its machine's newest {since} runs (retired after {RETIRE_AFTER}; "
                "lorabench history accept --retire says why)",
            )
        else:
            verdict.add("MISSING", f"{case}: measured before, not in the newest run {runs_of[-1]} (did it fail?)", 1.0)


def _unmeasured(verdict: Verdict, found: list[Series], judged: list[Series], newest: dict[str, str]) -> None:
    cases, judged_ids = {s.case for s in judged}, {id(s) for s in judged}
    for s in found:
        if s.case in cases and id(s) not in judged_ids and s.metric not in OCCASIONAL:
            verdict.add(
                "NOT MEASURED",
                f"{s.case} {s.metric}: measured before (last in run {s.runs[-1].run_id}), blank in the newest run "
                f"{newest[machine(s.runs[-1])]} (a capacity search that collapsed or found only a bound, a failed "
                "measurement)",
                1.0,
                s,
            )


def _stale_machines(verdict: Verdict, by_machine: dict[str, list[StoredRun]]) -> dict[str, list[StoredRun]]:
    """The machines judged: not those whose newest run is over ``STALE_AFTER`` older than the
    store's newest (said: a retired host's last night would fail, or pass, every night after)."""
    when = {host: _time(runs_of[-1]) for host, runs_of in by_machine.items()}
    known = [t for t in when.values() if t is not None]
    latest = max(known, default=None)
    stale = [host for host, t in when.items() if t is not None and latest - t > STALE_AFTER]
    for host in stale:
        days = (latest - when[host]).total_seconds() / 86400
        verdict.add(
            "STALE",
            f"{host}: its newest run {by_machine[host][-1].run_id} is {days:.1f} days older than the store's "
            "newest, so it is not judged (a retired host, or one whose runs stopped reaching the store)",
        )
    return {host: runs_of for host, runs_of in by_machine.items() if host not in stale}


def _time(run: StoredRun) -> datetime | None:
    try:
        found = parse_time(run.timestamp)
    except ValueError:
        return None  # a run stored before timestamps were checked: judged as before
    return found if found.tzinfo else found.replace(tzinfo=timezone.utc)


def _new_machines(verdict: Verdict, by_machine: dict[str, list[StoredRun]]) -> None:
    """Machines with too few runs to judge while others have enough: a host name that changes
    every run (a container's) starts a new series each night, and its gate would pass in silence."""
    enough = [host for host, runs_of in by_machine.items() if len(runs_of) >= 2 * MIN_SIZE]
    for host, runs_of in by_machine.items():
        if enough and len(runs_of) < 2 * MIN_SIZE:
            verdict.add(
                "NEW MACHINE",
                f"{host}: {len(runs_of)} run(s), under the {2 * MIN_SIZE} a change point needs, so nothing of it "
                f"is judged; the store's longer series are of {', '.join(enough)}. A host name that changes every "
                f"run starts a new series each time: set {HOSTNAME_ENV} to one name (docs/history.md)",
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


def _changed_outputs(verdict: Verdict, db: Path, by_machine: dict[str, list[StoredRun]]) -> None:
    """OUTPUT CHANGED: each machine's newest run against the one before it (hosts may answer
    differently), adapter by adapter; a pair of runs once, though its rows span machines."""
    pairs = dict.fromkeys((runs[-2].run_id, runs[-1].run_id) for runs in by_machine.values() if len(runs) >= 2)
    with connect(db, create=False) as conn:
        for before, newest in pairs:
            changed = output_changes(run_digests(conn, newest), run_digests(conn, before))
            for (model, device, adapter), old, new in changed:
                verdict.add(
                    "OUTPUT CHANGED",
                    f"{model} ({device}) adapter {adapter}: greedy output {old} -> {new} between run {before} "
                    f"and {newest}",
                    0.9,
                )
