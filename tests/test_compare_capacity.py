"""Capacities that are bounds in a comparison: a search that stopped at max_rate, below
min_rate or at a limit knows an interval, and compare, ab and the session's compare gate
judge the intervals: a regression only where the new one lies wholly below the base one by
more than the threshold, "cannot tell" where they overlap."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from lorabench.analysis.compare import compare_pairs, load_run
from lorabench.analysis.compare.analysis import REGRESSED, compare
from lorabench.analysis.compare.paired import pair_file
from lorabench.analysis.compare.render import bound_line, render_markdown
from lorabench.analysis.compare.select import run_comparison
from lorabench.cli import main as cli
from lorabench.measure import capacity
from tests.test_capacity import capacity_rows, write_rows

ENGINE = {"max_loras": 2}


def at_least(rate: float, builds: int = 1, **values) -> list:
    """Searches that passed every rate up to ``max_rate`` (``rate``): capacity at least that."""
    stop = {"search_stop": capacity.ABOVE_RANGE, "capacity_max_rate": rate, **values}
    return capacity_rows(ENGINE, [rate] * builds, over=None, **stop)


def bracket(low: float, high: float, builds: int = 1, **values) -> list:
    """Searches that bracketed their SLO edge between ``low`` and ``high``."""
    return capacity_rows(ENGINE, [low] * builds, over=high / low, **values)


def test_a_base_of_at_least_40_against_a_new_bracket_of_10_fails_compare(tmp_path, capsys):
    base = write_rows(tmp_path / "base.csv", at_least(40.0))
    new = write_rows(tmp_path / "new.csv", bracket(10.0, 10.5, capacity_max_rate=40.0))
    assert cli.main(["compare", base, new]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("CAPACITY REGRESSED"))
    assert "base at least 40 req/s, new between 10 and 10.5 req/s: at least 74% lower" in line
    assert "capacity bounds: 1 regressed, 0 improved, 0 not shown" in out


def test_a_new_search_capped_under_what_the_base_passed_is_not_comparable_and_says_raise_max_rate(tmp_path):
    base = write_rows(tmp_path / "base.csv", bracket(10.0, 10.5, builds=2))
    new = write_rows(tmp_path / "new.csv", at_least(8.0, builds=2))
    result = compare(load_run(base), load_run(new))
    assert not result.failed and [b.change for b in result.capacity_bounds] == [0]
    line = bound_line(result.capacity_bounds[0])
    assert "base between 10 and 10.5 req/s, new at least 8 req/s" in line
    assert "not comparable: the new search was capped at max_rate 8" in line
    assert "raise capacity.max_rate past 10.5 on the new side" in line
    assert cli.main(["compare", base, new]) == 0


def test_a_new_search_whose_server_failed_requests_fails_compare_by_its_own_name(tmp_path, capsys):
    """Its search stopped with no verdict after passing 10 (a lower bound): judged on bounds it
    was 'cannot tell', exit 0, and a broken server passed the gate."""
    base = write_rows(tmp_path / "base.csv", bracket(10.0, 10.5))
    stop = "requests failed: POST /v1/completions answered 500"
    new = write_rows(tmp_path / "new.csv", capacity_rows(ENGINE, [10.0], over=None, search_stop=stop))
    result = compare(load_run(base), load_run(new))
    assert result.failed and not result.capacity_bounds and not result.capacity_collapses
    assert result.reasons() == "1 capacity search with no verdict"
    (line,) = result.capacity_unjudged
    assert line.startswith("CAPACITY NOT FOUND: ") and stop in line
    assert cli.main(["compare", base, new]) == 1
    assert "CAPACITY NOT FOUND" in capsys.readouterr().out


def test_bounds_apart_by_the_threshold_are_judged_both_ways_and_nearer_ones_are_not(tmp_path):
    base = load_run(write_rows(tmp_path / "base.csv", at_least(8.0)))
    below = capacity_rows(ENGINE, [None], search_stop=capacity.BELOW_RANGE)
    below = load_run(write_rows(tmp_path / "below.csv", [replace(row, capacity_over_rps=0.5) for row in below]))
    # Below min_rate (under 0.5) on the base side, a bracket [4, 4.4) on the new: improved.
    improved = compare(below, load_run(write_rows(tmp_path / "higher.csv", bracket(4.0, 4.4))))
    assert [b.change for b in improved.capacity_bounds] == [1] and not improved.failed
    assert "base below 0.5 req/s, new between 4 and 4.4 req/s: at least 700% higher" in bound_line(
        improved.capacity_bounds[0]
    )
    # Below min_rate on the new side, against a base that passed a rate: a collapse, named once.
    collapsed = compare(base, below)
    assert len(collapsed.capacity_collapses) == 1 and not collapsed.capacity_bounds and collapsed.failed
    # A new bracket [7.6, 8) under a base of at least 8: wholly below, but by less than 10 %.
    near = compare(base, load_run(write_rows(tmp_path / "near.csv", bracket(7.6, 7.9, capacity_max_rate=8.0))))
    assert [b.change for b in near.capacity_bounds] == [0] and not near.failed
    assert "apart by less than the threshold (10%)" in bound_line(near.capacity_bounds[0])
    strict = run_comparison(str(tmp_path / "base.csv"), str(tmp_path / "near.csv"), thresholds=["capacity_rps=1%"])
    assert strict.failed and strict.reasons() == "1 capacity bound regressed"


def test_a_case_with_any_unbracketed_build_is_judged_on_its_bounds_not_on_the_bracketed_builds(tmp_path):
    base = write_rows(tmp_path / "base.csv", bracket(20.0, 21.0, builds=3))
    # Two builds bracketed lower, one passed everything up to max_rate 40: the hull reaches to inf.
    mixed = [*bracket(15.0, 15.8, builds=2), *at_least(40.0)]
    mixed = [replace(row, build=b, engine_id=f"loras2-rank16-cpu4-build{b}") for b, row in enumerate(mixed)]
    result = compare(load_run(base), load_run(write_rows(tmp_path / "mixed.csv", mixed)))
    assert "capacity_rps" not in {f.metric for f in result.findings}
    assert [b.change for b in result.capacity_bounds] == [0] and not result.failed
    assert "new between 15 and" not in bound_line(result.capacity_bounds[0]) and "new at least 15 req/s" in bound_line(
        result.capacity_bounds[0]
    )


def test_the_bounds_in_markdown_json_and_the_page(tmp_path, capsys):
    base = write_rows(tmp_path / "base.csv", at_least(40.0))
    new = write_rows(tmp_path / "new.csv", bracket(10.0, 10.5, capacity_max_rate=40.0))
    page = render_markdown(compare(load_run(base), load_run(new)))
    assert "- CAPACITY REGRESSED: " in page and "base at least 40 req/s, new between 10 and 10.5 req/s" in page
    assert cli.main(["compare", base, new, "--format", "json"]) == 1
    bound = json.loads(capsys.readouterr().out)["capacity_bounds"][0]
    assert bound["verdict"] == REGRESSED and bound["base_low"] == 40.0 and bound["base_high"] is None
    assert (bound["new_low"], bound["new_high"]) == (10.0, 10.5)
    assert cli.main(["compare", base, new, "--report", str(tmp_path / "page")]) == 1
    assert "CAPACITY REGRESSED: trace capacity loras2-rank16-cpu4" in (tmp_path / "page" / "index.html").read_text()


def ab_session(folder, base_rows: list, new_rows: list, pairs: int = 3):
    """An A/B session's pair files: each pair's turns carry the given rows."""
    for side, rows in (("base", base_rows), ("new", new_rows)):
        (folder / side).mkdir(parents=True)
        for pair in range(pairs):
            slot = 2 * pair + (side == "new")
            turn = [replace(r, run_id=f"{side}-{pair}", timestamp=f"2026-11-23T10:{slot:02d}:00Z") for r in rows]
            frame = pd.read_csv(write_rows(folder / "x.csv", turn)).assign(ab_pair=pair)
            frame.to_csv(pair_file(folder / side, pair), index=False)
    return folder / "base", folder / "new"


@pytest.mark.parametrize(
    ("new_rows", "change"), [(bracket(10.0, 10.5, capacity_max_rate=40.0), -1), (at_least(40.0), 0)]
)
def test_ab_and_the_session_gate_judge_the_bounds_as_compare_does(tmp_path, new_rows, change):
    base, new = ab_session(tmp_path, at_least(40.0), new_rows)
    for result in (compare_pairs(base, new, threshold=0.1, alpha=0.05), run_comparison(str(base), str(new))):
        assert [b.change for b in result.capacity_bounds] == [change]
        assert result.failed == (change < 0)


def test_a_fall_past_the_threshold_is_measured_from_the_base_as_the_t_test_measures_it(tmp_path):
    """The t-test calls a change of (new - base) / base: a fall of 9.1 % is within a 10 %
    threshold. Bounds allowing at most that fall (base at least 11, new below 10) are not shown."""
    base = load_run(write_rows(tmp_path / "base.csv", at_least(11.0)))
    new = load_run(write_rows(tmp_path / "new.csv", bracket(9.0, 10.0, capacity_max_rate=11.0)))
    result = compare(base, new)
    assert [b.change for b in result.capacity_bounds] == [0] and not result.failed
    assert "apart by less than the threshold (10%)" in bound_line(result.capacity_bounds[0])
    # A fall of 11 % from the base's low end passes it.
    new = load_run(write_rows(tmp_path / "ten.csv", bracket(9.0, 9.8, capacity_max_rate=11.0)))
    assert [b.change for b in compare(base, new).capacity_bounds] == [-1]


def test_a_lowered_max_rate_is_no_regression_but_not_comparable_and_a_measured_fall_from_a_cap_is_one(tmp_path, capsys):
    """Base searches passed everything up to a max_rate of 20, new ones up to 8 (the config's
    cap lowered): both are bounds (at least 20, at least 8), and 20 -> 8 is no 60 % fall. A
    new capacity measured under the base's cap is a fall, and fails."""
    base = write_rows(tmp_path / "base.csv", at_least(20.0, builds=2))
    new = write_rows(tmp_path / "new.csv", at_least(8.0, builds=2))
    result = compare(load_run(base), load_run(new))
    assert not result.failed and [b.change for b in result.capacity_bounds] == [0]
    assert "capacity_rps" not in {f.metric for f in result.findings}
    line = bound_line(result.capacity_bounds[0])
    assert "base at least 20 req/s, new at least 8 req/s" in line and "60%" not in line
    assert "not comparable: the new search was capped at max_rate 8 (a bound: at least 8 req/s), under the 20" in line
    assert "raise capacity.max_rate past 20 on the new side" in line
    assert cli.main(["compare", base, new]) == 0
    assert "capacity bounds: 0 regressed, 0 improved, 1 not shown" in capsys.readouterr().out
    # The other way round: the base capped under what the new side passed.
    higher = compare(load_run(new), load_run(write_rows(tmp_path / "bracket.csv", bracket(20.0, 21.0))))
    assert "not comparable: the base search was capped at max_rate 8" in bound_line(higher.capacity_bounds[0])
    # A real measurement under the base's cap: at least 20 against 7.6 to 8 is a fall of at least 60 %.
    fell = compare(
        load_run(base), load_run(write_rows(tmp_path / "fell.csv", bracket(7.6, 8.0, capacity_max_rate=20.0)))
    )
    assert fell.failed and [b.change for b in fell.capacity_bounds] == [-1]
    assert "at least 60% lower" in bound_line(fell.capacity_bounds[0])


def collapsed_build(row, over: float = 0.5):
    """``row`` as a build whose search failed even at its lowest rate (below min_rate)."""
    return replace(row, capacity_rps=None, capacity_over_rps=over, search_stop=capacity.BELOW_RANGE)


def two_builds(first, second) -> list:
    """Two rows as builds 0 and 1 of one configuration."""
    rows = [first, second]
    return [replace(row, build=b, engine_id=f"loras2-rank16-cpu4-build{b}") for b, row in enumerate(rows)]


def test_one_new_build_of_two_that_collapses_fails_compare_and_says_how_many(tmp_path, capsys):
    """The other build's bracket made the case's interval [0, 21): overlapping the base's, so
    'cannot tell' and exit 0 with one engine build serving nothing within its SLOs."""
    base = write_rows(tmp_path / "base.csv", bracket(20.0, 21.0, builds=2))
    good = bracket(20.0, 21.0)[0]
    new = write_rows(tmp_path / "new.csv", two_builds(good, collapsed_build(good)))
    result = compare(load_run(base), load_run(new))
    assert result.failed and result.reasons() == "1 capacity collapsed" and not result.capacity_bounds
    (line,) = result.capacity_collapses
    assert line.startswith("CAPACITY COLLAPSED: ")
    assert "1 of 2 new builds fell below min_rate (0.5 req/s failed), none of the base's 2" in line
    assert cli.main(["compare", base, new]) == 1
    assert "CAPACITY COLLAPSED" in capsys.readouterr().out
    # The session's compare gate and an A/B session judge it alike.
    gate = run_comparison(base, new)
    assert gate.failed and len(gate.capacity_collapses) == 1
    folders = ab_session(tmp_path / "ab", bracket(20.0, 21.0, builds=2), two_builds(good, collapsed_build(good)))
    paired = compare_pairs(*folders, threshold=0.1, alpha=0.05)
    assert paired.failed and "3 of 6 new builds fell below min_rate" in paired.capacity_collapses[0]


def test_a_collapse_on_the_base_side_too_is_judged_on_the_bounds_unless_the_new_side_lost_every_build(tmp_path):
    good = bracket(20.0, 21.0)[0]
    base = load_run(write_rows(tmp_path / "base.csv", two_builds(good, collapsed_build(good))))
    # As broken on both sides (one build of two): no collapse; the bounds overlap.
    same = compare(base, load_run(write_rows(tmp_path / "same.csv", two_builds(good, collapsed_build(good)))))
    assert not same.capacity_collapses and [b.change for b in same.capacity_bounds] == [0] and not same.failed
    # Every new build collapsed where one base build did not.
    every = two_builds(collapsed_build(good), collapsed_build(good, over=0.4))
    gone = compare(base, load_run(write_rows(tmp_path / "gone.csv", every)))
    assert (
        gone.failed
        and "2 of 2 new builds fell below min_rate (0.4 req/s failed), 1 of the base's 2"
        in (gone.capacity_collapses[0])
    )
