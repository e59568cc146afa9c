"""What a benchmark session does at its end, after every case: the report page and the
comparison with a base (``--bench-report``, ``--bench-compare``), judged by the rules
``lorabench report`` and ``lorabench compare`` use."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorabench import compare, options
from lorabench.compare.select import run_comparison
from lorabench.session import STATE


def finish_session(session: pytest.Session) -> None:
    config = session.config
    state = config.stash[STATE]
    if state.writer is None or state.writer.path is None:
        return
    report = options.value(config, "bench_report")
    if report:
        from lorabench.report import write_report

        state.report = write_report([state.writer.path], Path(report), title=f"lorabench run {state.writer.path.stem}")
    base = options.value(config, "bench_compare")
    if not base:
        return
    fail = options.value(config, "bench_compare_fail")
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
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    state.comparison = compare.render_text(result).splitlines()
    if fail and result.failed:
        state.comparison.append(
            f"{len(result.regressions)} regressions, {len(result.digest_changes)} changed adapter outputs: "
            "the session fails (--bench-compare-fail)"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
