"""What a benchmark session does at its end, after every case: the report page, the run
added to the history, and the comparison with a base (``--bench-report``,
``--bench-history``, ``--bench-compare``), judged by the rules ``lorabench report``,
``lorabench history`` and ``lorabench compare`` use.

The two are independent: a report that cannot be drawn is said in the summary and the
comparison still runs, since a gate (``--bench-compare-fail``) must not pass or fail on
whether a page of figures could be written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lorabench.pytest_plugin import options
from lorabench.pytest_plugin.session import STATE, BenchState


def compare_problems(config: pytest.Config) -> list[str]:
    """``--bench-compare``'s inputs, refused before any engine starts (not found after the
    whole run): a base or noise-from path that is not there, a threshold that does not parse."""
    problems: list[str] = []
    if not options.checked(config, "bench_compare", problems):
        return problems
    for name in ("bench_compare", "bench_compare_noise_from"):
        given = options.checked(config, name, problems) or ""
        for part in (p for p in given.split(",") if p and not Path(p).exists()):
            problems.append(
                f"{options.OPTIONS[name].flag_name} {given}: {part}: no such file or folder: "
                "give a result CSV of an earlier run, or A.csv,B.csv"
            )
    from lorabench.analysis.compare import CompareError
    from lorabench.analysis.compare.options import parse_thresholds

    try:
        parse_thresholds(options.value(config, "bench_compare_threshold") or [])
    except CompareError as exc:
        problems.append(f"--bench-compare-threshold: {exc}")
    return problems


def finish_session(session: pytest.Session) -> None:
    config = session.config
    state = config.stash[STATE]
    if state.writer is None or state.writer.path is None:
        return
    report = options.value(config, "bench_report")
    if report:
        _write_report(state, Path(report), config)
    history = options.value(config, "bench_history")
    if history:
        _add_to_history(state, Path(history))
    base = options.value(config, "bench_compare")
    if not base:
        return
    fail = options.value(config, "bench_compare_fail")
    # Here, not at the top: pandas and the comparison cost every bench process 0.4 s of its
    # start (a fleet's workers, an A/B turn), and only a session asked to compare uses them.
    from lorabench.analysis import compare
    from lorabench.analysis.compare.select import run_comparison

    try:
        result = run_comparison(
            base,
            str(state.writer.path),
            thresholds=options.value(config, "bench_compare_threshold") or [],
            alpha=options.value(config, "bench_compare_alpha"),
            noise_from=options.value(config, "bench_compare_noise_from"),
        )
    except compare.CompareError as exc:
        state.comparison = [f"cannot compare with {base}: {exc}"]
        if fail:
            session.exitstatus = options.BAD_INPUT
        return
    state.comparison = compare.render_text(result).splitlines()
    if fail and result.failed:
        state.comparison.append(f"{result.reasons()}: the session fails (--bench-compare-fail)")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _add_to_history(state: BenchState, db: Path) -> None:
    """This run in the history store; a store that cannot take it is one line of the summary,
    and the run's result file stays where it is, to be added later."""
    from lorabench.analysis.history.runs import HistoryError
    from lorabench.analysis.history.store import add_runs

    try:
        added = add_runs(db, [state.writer.path], only=state.provenance.get("run_id"))
    except (HistoryError, OSError) as exc:
        later = f"lorabench history add --db HISTORY.db {state.writer.path}"
        state.history = [f"not added to {db}: {exc}; the run stays in its file, to add later: {later}"]
        return
    state.history = [f"{status}: run {run.run_id} to {db}" for run, status in added]


def _write_report(state: BenchState, folder: Path, config: pytest.Config) -> None:
    """The page of this run's figures; whatever stops it (a folder that is a file, a
    figure that fails to draw) becomes one line of the summary, not an internal error."""
    from lorabench.analysis.report import write_report

    try:
        state.report = write_report([state.writer.path], folder, title=f"lorabench run {state.writer.path.stem}")
    except Exception as exc:  # noqa: BLE001 - a failed page must not end the session before the comparison
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        state.report_error = f"report not written to {folder}: {reason}; the results are in {state.writer.path}"
