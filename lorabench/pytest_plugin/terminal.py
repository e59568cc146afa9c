"""What the plugin writes on the terminal: progress lines as a run goes, whatever pytest
captures, and the session's summary at the end."""

from __future__ import annotations

import contextlib

import pytest

from lorabench.config.target import URL
from lorabench.measure.sequential import cost_line
from lorabench.measure.wallclock import BUILDS
from lorabench.pytest_plugin import build_stops
from lorabench.pytest_plugin.session import BenchState
from lorabench.results.files import format_rank_summary, format_summary


def say(config: pytest.Config, line: str) -> None:
    """A line on the terminal now, whatever pytest captures (progress of a long run)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        # After a test's progress dot the line is not empty, whatever ensure_newline knows.
        if reporter._tw.width_of_current_line:
            reporter._tw.line()
        reporter.write_line(line)


def summary_lines(state: BenchState) -> list[str]:
    """The ``lorabench`` section of the terminal summary: builds, memory, logs, rows and files."""
    lines = []
    if state.skip_reason:
        lines.append(f"benchmark cases {'refused' if state.refused else 'skipped'}: {state.skip_reason}")
    # A server at a URL is neither built nor shut down here: its "builds" are connections to it.
    at_url = state.target.kind == URL
    if state.built:
        builds = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in state.built)
        what = f"connections to {state.target.url}" if at_url else "engine builds"
        lines.append(f"{what}: {len(state.built)} ({builds})")
    if state.fleet:  # the workers built and measured; this session waited for them
        lines += state.fleet
    elif state.progress is not None:  # benchmark cases ran
        lines.append(state.clock.line("connections" if at_url else BUILDS))
        if state.writer is not None and state.config is not None:  # what sequential stopping spent
            lines += filter(None, [cost_line(state.writer.rows, state.config.matrix.rounds)])
        if state.build_stops or build_stops.in_effect(state):
            lines.append(build_stops.saved_line(state))
    if state.rss_after_teardown and not at_url:
        rss = ", ".join(f"{mib:.0f}" for _, mib in state.rss_after_teardown)
        lines.append(f"process tree RSS after each engine shut down (MiB): {rss}")
    if state.unreleased:
        lines.append(state.unreleased)
    lines += [f"peak memory of {note}" for note in state.memory_notes]
    if state.writer is not None and state.writer.log_dir.is_dir():
        lines.append(f"{'run logs' if at_url else 'engine logs'}: {state.writer.log_dir}")
    if state.writer is not None and state.writer.rows:
        lines.append(format_summary(state.writer.rows))
        if state.writer.by_rank:
            lines.append(format_rank_summary(state.writer.by_rank))
        if any(row.scenario == "capacity" for row in state.writer.rows):
            # pandas: 0.4-1 s of imports, paid only by a session that searched for capacity.
            from lorabench.analysis.recommend import for_session

            lines += for_session(state.writer.rows)
        lines += [f"results: {state.writer.path}", f"samples: {state.writer.samples_path}"]
    if state.report is not None:
        lines.append(f"report: {state.report}")
    return lines
