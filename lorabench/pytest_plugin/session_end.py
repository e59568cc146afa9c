"""What a benchmark session does at its end, after every case: the report page, the run
added to the history, and the comparison with a base (``--bench-report``,
``--bench-history``, ``--bench-compare``), judged by the rules ``lorabench report``,
``lorabench history`` and ``lorabench compare`` use; and a session whose benchmark cases
were all skipped fails, since it measured nothing.

The two are independent: a report that cannot be drawn is said in the summary and the
comparison still runs, since a gate (``--bench-compare-fail``) must not pass or fail on
whether a page of figures could be written.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from lorabench.pytest_plugin import options
from lorabench.pytest_plugin.bench_items import ENGINE_FIXTURE
from lorabench.pytest_plugin.session import STATE, BenchState

# What to check when a device's cases all skipped: the platform vLLM resolved was another.
DEVICE_HINTS = {
    "npu": "on an NPU node: are CANN's and NNAL's set_env.sh sourced, and vllm-ascend installed? ",
    "cuda": "on a GPU node: are vLLM's CUDA build installed, and a GPU visible (nvidia-smi)? ",
}


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
    _fail_if_all_skipped(session, state)
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


def _fail_if_all_skipped(session: pytest.Session, state: BenchState) -> None:
    """Benchmark cases were collected and every one was skipped: nothing was measured, which
    pytest calls a pass (exit status 0). It is bad input instead (exit status 2, one line on
    stderr with the skip's reason): a node where CANN's set_env.sh was not sourced runs vLLM
    on the CPU, and a nightly that skips every NPU case must not pass. A session that
    measured anything, or collected no benchmark case, keeps pytest's status. The outcomes
    are the terminal reporter's (without it, ``-p no:terminal``, nothing is judged)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if session.exitstatus != pytest.ExitCode.OK or session.config.option.collectonly or reporter is None:
        return
    ours = {item.nodeid for item in session.items if ENGINE_FIXTURE in getattr(item, "fixturenames", ())}
    skipped = [r for r in reporter.stats.get("skipped", []) if r.nodeid in ours]
    outcomes = ("passed", "failed", "error", "xfailed", "xpassed")
    ran = {r.nodeid for key in outcomes for r in reporter.stats.get(key, [])}
    if not ours or ran & ours or {r.nodeid for r in skipped} != ours:
        return
    hint = others = ""
    if state.skip_reason:  # a device mark: the platform vLLM resolved is not the config's device
        device = state.file.device if state.file is not None else None
        hint = f"; {DEVICE_HINTS.get(device, '')}lorabench doctor --config {state.config_path} says what is missing"
    else:
        reasons = Counter(_skip_reason(r) for r in skipped).most_common()
        state.skip_reason = reasons[0][0]  # also the summary's "benchmark cases skipped" line
        if len(reasons) > 1:
            others = f" (and {len(reasons) - 1} other reason{'s' if len(reasons) > 2 else ''}: pytest -rs lists them)"
    sys.stdout.flush()
    print(
        f"lorabench: every benchmark case skipped ({len(ours)} collected): {state.skip_reason}{others}{hint}; "
        f"nothing was measured (exit status {options.BAD_INPUT})",
        file=sys.stderr,
    )
    session.exitstatus = options.BAD_INPUT


def _skip_reason(report: pytest.TestReport) -> str:
    """A skip's reason as ``pytest -rs`` gives it, without its "Skipped: " prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


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
