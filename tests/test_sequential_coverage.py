"""Sequential stopping keeps its coverage: seeded sessions of one batch case on the noisy
stand-in (scripts/bench_sequential_coverage.py), whose truth is known, each stopped by
``--bench-precision``'s rule; and the script's own report, and that of its builds mode
(scripts/bench_build_coverage.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lorabench.measure.sequential import HEADLINE
from tests import helpers
from tests.test_sequential import load_script

SESSIONS = 100
# 2 rounds at least, 16 at most, noise of 6 % for a 5 % target: cases stop at every look, and
# a fixed-n t interval checked after each round covers about 88 % (the script's naive figure).
MATRIX = {"rounds": 2, "max_rounds": 16, "precision_pct": 5.0, "warmup_rounds": 0}
SIGMA = 0.06


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """The truth (a noise-free round's values) and the sessions' figures."""
    script = load_script()
    engine, ctx = script.case_runner(tmp_path_factory.mktemp("coverage"), MATRIX)
    with engine:
        free = script.one_session(engine, ctx, script.Noise("none", 0.0), 0)
        noise = script.Noise("normal", SIGMA)
        rows = [script.one_session(engine, ctx, noise, seed) for seed in range(SESSIONS)]
    return {m: free["intervals"][m]["center"] for m in HEADLINE}, rows


def test_the_intervals_cover_the_truth_in_90_percent_of_sessions_or_more(sessions):
    script = load_script()
    truth, rows = sessions
    for metric in HEADLINE:
        covered = np.mean([script.covers(r["intervals"][metric], truth[metric]) for r in rows])
        assert covered >= 0.90, f"{metric}: {covered:.2f} of {SESSIONS} intervals hold the truth"


def test_the_sessions_stopped_at_different_looks_some_short_of_the_target(sessions):
    """The coverage above is under optional stopping, not of a fixed design."""
    _, rows = sessions
    rounds = [r["rounds"] for r in rows]
    assert {2, 3, 5, 8, 12, 16} >= set(rounds) and len(set(rounds)) >= 3, sorted(set(rounds))
    reached = [r["precision_reached"] for r in rows]
    assert 0 < sum(reached) < SESSIONS
    for r in rows:
        widest = max(i["half_width"] for i in r["intervals"].values())
        assert r["precision_pct"] == pytest.approx(100 * widest)
        assert r["precision_reached"] == (widest <= 0.05)
        assert r["precision_reached"] or r["rounds"] == 16, "a case short of the target runs to the maximum"


def test_the_script_reports_coverage_rounds_and_the_fixed_design(tmp_path, capsys):
    out = tmp_path / "coverage.json"
    assert load_script().main(["--sessions", "4", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["cpu"] and figures["truth_ms"]["e2e_ms"] > 0
    laws = {law["noise"]: law for law in figures["laws"]}
    assert laws["normal 0.5 %"]["rounds_min_median_max"] == [3, 3, 3], "little noise: the minimum"
    assert laws["normal 8 %"]["fixed_design_rounds"] > 12
    for law in laws.values():
        assert law["sessions"] == 4 and set(law["coverage"]) == set(HEADLINE)
        assert 3 <= law["rounds_mean"] <= 12 and 0 <= law["naive_coverage"] <= 1
    assert math.isclose(figures["target_pct"], 5.0) and "wall" in capsys.readouterr().out


def load_build_script():
    """scripts/bench_build_coverage.py as a module, after the rounds' script it imports."""
    load_script()
    return helpers.load_script("bench_build_coverage")


def test_the_builds_mode_reports_coverage_builds_and_the_fixed_design(tmp_path, capsys):
    """Through the plugin: noise-free builds stop at the first look, 2 builds, their interval on
    the truth; builds that differ by 10 % run to max_builds, short of a 5 % target."""
    out = tmp_path / "builds.json"
    argv = ["--sessions", "2", "--targets", "5", "--laws", "none", "normal 10 %", "--round-sigma", "0"]
    assert load_build_script().main([*argv, "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["cpu"] and figures["truth_ms"]["e2e_ms"] > 0 and (figures["builds"], figures["max_builds"]) == (2, 6)
    free, noisy = figures["settings"]
    assert free["build_noise"] == "none" and free["builds_min_median_max"] == [2, 2, 2] and free["reached"] == 1
    assert free["coverage"] == dict.fromkeys([*HEADLINE, "all"], 1.0) and free["fixed_design_builds"] == 2
    assert noisy["sd_log"] == 0.1 and noisy["fixed_design_builds"] > 6
    for setting in (free, noisy):
        assert setting["sessions"] == 2 and set(setting["coverage"]) == {*HEADLINE, "all"}
        assert all(0 <= c <= 1 for c in setting["coverage"].values())
        low, median, high = setting["builds_min_median_max"]
        assert 2 <= low <= median <= high <= 6 and low <= setting["builds_mean"] <= high
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 and lines[1].startswith("| target | build noise ") and lines[-1].startswith("wall ")
    assert lines[3].startswith("| 5 %    | none ") and lines[3].count("|") == lines[1].count("|") == 14
