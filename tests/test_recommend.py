"""The recommendation's verdict on a lead: it needs 2 builds a side, a runner-up build with
no failing rate is never beaten whatever order its builds come in, and a URL target's
memory is not the configuration's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lorabench.analysis import recommend
from lorabench.analysis.report.runs import load_runs
from tests.test_capacity import capacity_rows, write_rows

TWO, EIGHT = {"max_loras": 2}, {"max_loras": 8}


def with_overs(rows: list, overs: list) -> list:
    """``rows`` with each build's lowest failing rate set (None: the build failed no rate)."""
    return [replace(row, capacity_over_rps=over) for row, over in zip(rows, overs)]


@pytest.mark.parametrize("overs", [[9.0, None], [None, 9.0]], ids=["failing-first", "open-first"])
def test_a_runner_up_build_that_failed_no_rate_is_never_beaten_whatever_the_order(overs):
    # loras8 passed 10 on both builds; loras2's one build failed 9, the other failed nothing.
    runner_up = with_overs(capacity_rows(TWO, [5.0, 8.0]), overs)
    line = recommend.for_session(capacity_rows(EIGHT, [10.0, 10.2]) + runner_up)[0]
    assert "choose loras8-rank16-cpu4" in line and "a real lead" not in line
    assert "no lead shown: a build of loras2-rank16-cpu4 failed no rate probed" in line and "% over" not in line


def test_a_lead_needs_two_builds_a_side():
    # Brackets [10, 10.5) and [20, 21) are far apart, but one build a side says nothing of the spread.
    single = recommend.for_session(capacity_rows(TWO, [10.0], over=1.05) + capacity_rows(EIGHT, [20.0]))[0]
    assert "1 build: lead not tested" in single and "a real lead" not in single
    lopsided = recommend.for_session(capacity_rows(TWO, [10.0], over=1.05) + capacity_rows(EIGHT, [20.0, 20.5]))[0]
    assert "1 build: lead not tested" in lopsided
    both = recommend.for_session(capacity_rows(TWO, [10.0, 10.1], over=1.05) + capacity_rows(EIGHT, [20.0, 20.5]))[0]
    assert "a real lead" in both


def test_against_a_url_the_memory_is_said_not_measured():
    url = {"target": "url", "memory_source": "client", "peak_memory_mb": 612.0}
    line = recommend.for_session(capacity_rows(TWO, [10.0], **url) + capacity_rows(EIGHT, [20.0], **url))[0]
    assert "memory not measured (URL target" in line and "612" not in line and "peak" not in line
    assert "1024 KV cache tokens" in line, "the server's own /metrics give its KV cache"
    unreported = recommend.for_session(
        capacity_rows(TWO, [10.0], **url) + capacity_rows(EIGHT, [20.0], **url, kv_cache_tokens=0)
    )
    assert "KV cache not reported" in unreported[0] and "0 KV cache tokens" not in unreported[0]
    blank = recommend.for_session(  # as rows now leave it: blank where the server does not say
        capacity_rows(TWO, [10.0], **url) + capacity_rows(EIGHT, [20.0], **url, kv_cache_tokens=None)
    )
    assert "KV cache not reported" in blank[0] and "nan" not in blank[0]
    # A server lorabench started (serve) is in its process tree: its memory is measured.
    serve = {"target": "serve", "memory_source": "rss", "peak_memory_mb": 3730.0}
    line = recommend.for_session(capacity_rows(TWO, [10.0], **serve) + capacity_rows(EIGHT, [20.0], **serve))[0]
    assert "peak 3730 MiB" in line


@pytest.mark.parametrize("builds", [1, 2])
def test_no_lead_in_percent_is_claimed_over_a_runner_up_whose_capacity_is_only_a_lower_bound(builds):
    # loras8 bracketed at [9, 9.45); loras2 passed every rate up to its max_rate 8: at least 8, maybe far more.
    open_runner_up = capacity_rows(TWO, [8.0] * builds, over=None, search_stop="above max_rate")
    line = recommend.for_session(capacity_rows(EIGHT, [9.0] * builds, over=1.05) + open_runner_up)[0]
    assert "choose loras8-rank16-cpu4" in line
    assert "% over" not in line, line
    assert "a build of loras2-rank16-cpu4 failed no rate probed, so its capacity has no upper bound" in line


@pytest.mark.parametrize(
    "stop", ["requests failed: HTTP 500: internal error", "client fell behind: 9 of 40 requests sent over 125 ms late"]
)
def test_a_search_stopped_with_no_verdict_is_neither_chosen_nor_read_as_a_measurement(stop):
    # loras8 passed 10 req/s, then its server failed requests (or its client fell behind) at
    # 20: its 10 is a lower bound from a search that never found the SLO edge, not a capacity.
    stopped = [replace(r, search_stop=stop) for r in capacity_rows(EIGHT, [10.0, 10.0])]
    line = recommend.for_session(stopped + capacity_rows(TWO, [5.0, 5.1]))[0]
    assert "choose loras2-rank16-cpu4" in line
    assert f"loras8-rank16-cpu4's searches stopped with no verdict ({stop})" in line
    alone = recommend.for_session(stopped)[0]
    assert "choose" not in alone and stop in alone


def test_a_configuration_with_a_build_that_found_no_capacity_is_not_ranked_and_can_block_the_choice():
    """One build of loras8 stopped at max_probes before any probe passed, the other passed 30:
    its mean was NaN, so it was ranked last and said to have 'stopped before a probe passed'
    while loras2 (10 req/s) was chosen."""
    partial = capacity_rows(EIGHT, [30.0]) + [
        replace(capacity_rows(EIGHT, [None], over=None)[0], search_stop="max_probes")
    ]
    partial[1] = replace(partial[1], engine_id="loras8-rank16-cpu4-build1", build=1)
    line = recommend.for_session(capacity_rows(TWO, [10.0, 10.1]) + partial)[0]
    assert "choose" not in line and "not decided: loras8-rank16-cpu4's other builds passed up to 30 req/s" in line
    assert "1 of 2 searches stopped before a probe passed (max_probes)" in line
    lower = [replace(r, capacity_rps=5.0, capacity_over_rps=6.0) if r.capacity_rps else r for r in partial]
    line = recommend.for_session(capacity_rows(TWO, [10.0, 10.1]) + lower)[0]
    assert "choose loras2-rank16-cpu4" in line and "loras8-rank16-cpu4 not ranked: 1 of 2 searches" in line


def test_the_report_page_read_from_the_file_recommends_what_the_session_did(tmp_path):
    # loras8 passed every rate up to max_rate 40 (at least 40); loras2 bracketed near 10.
    # compare blanks a bound's capacity_rps for its t-test; the page must not read it as missing.
    rows = capacity_rows(EIGHT, [40.0, 40.0], over=None, search_stop="above max_rate", capacity_max_rate=40.0)
    rows += capacity_rows(TWO, [10.0, 10.2], over=1.05, capacity_max_rate=40.0)
    (run,) = load_runs([write_rows(tmp_path / "run.csv", rows)])
    session, page = recommend.for_session(rows)[0], recommend.recommendations(run.rows)[0]
    assert "choose loras8-rank16-cpu4: at least 40 req/s" in session
    assert page == session
