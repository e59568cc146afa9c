"""``lorabench ab --sequential`` (lorabench.analysis.compare.sequential): a look after each pair
from the third stops the session where its verdict is decided, found or cleared; a session
whose pairs cannot decide runs to its --pairs. Error rates and pairs saved, over many seeded
sessions, are scripts/bench_ab_sequential.py's (the lab log)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from lorabench.ab.plan import BASE, NEW
from lorabench.analysis.compare.analysis import REGRESSED, Finding
from lorabench.analysis.compare.paired import compare_paired_runs, pair_files
from lorabench.analysis.compare.sequential import CLEARED, FOUND, decision, look_alpha, worse_bound_pct
from tests.test_ab import ab_args, run_ab, session_runs, write_fake_python


def test_a_slowdown_every_pair_shows_stops_at_the_third_pair_and_exits_1(tmp_path):
    fake, out = write_fake_python(tmp_path), tmp_path / "ab"
    done = run_ab(*ab_args(fake, out, 8, "--sequential", "--new-env", "FAKE_SCALE=1.5"))
    assert done.returncode == 1, done.stderr
    assert (
        "decided after 3 of 8 pairs (found what fails the session, each look at alpha 0.00833 of 6 looks): "
        "5 pairs saved" in done.stderr
    )
    assert sorted(pair_files(out / NEW)) == [0, 1, 2] and sorted(pair_files(out / BASE)) == [0, 1, 2]
    record = json.loads((out / "ab.json").read_text())["sequential"]
    assert (record["stopped_at"], record["saved_pairs"], record["decided"]) == (3, 5, FOUND)
    assert "3 complete pairs" in (out / "comparison.txt").read_text()


def test_two_equal_sides_are_cleared_at_the_third_pair_and_exit_0(tmp_path):
    fake, out = write_fake_python(tmp_path), tmp_path / "ab"
    done = run_ab(*ab_args(fake, out, 8, "--sequential"))
    assert done.returncode == 0, done.stderr
    assert "decided after 3 of 8 pairs (no case-metric can be slower than its threshold" in done.stderr
    assert json.loads((out / "ab.json").read_text())["sequential"]["decided"] == CLEARED


def test_without_sequential_every_pair_runs(tmp_path):
    fake, out = write_fake_python(tmp_path), tmp_path / "ab"
    done = run_ab(*ab_args(fake, out, 4, "--new-env", "FAKE_SCALE=1.5"))
    assert done.returncode == 1 and "decided after" not in done.stderr
    assert sorted(pair_files(out / NEW)) == [0, 1, 2, 3] and "sequential" not in json.loads(
        (out / "ab.json").read_text()
    )


def test_noisy_pairs_and_a_tight_threshold_leave_the_look_undecided():
    """Turns 3 % apart at random, a 2 % threshold: 3 pairs can neither find nor clear it."""
    base, new, order = session_runs(3, turn_sd=0.03, rng=np.random.default_rng(1))
    alpha = look_alpha(0.05, 8)
    result = compare_paired_runs(base, new, order, threshold=0.02, alpha=alpha)
    assert decision(result, 0, alpha) is None
    bounds = [worse_bound_pct(f, alpha) for f in result.findings]
    assert all(b is not None for b in bounds) and max(bounds) > 2, "some bound is past the threshold"
    assert decision(result, 1, alpha) == FOUND, "a finding of another kind decides at once"


def test_the_looks_split_alpha_and_a_bound_reads_the_bad_direction():
    assert look_alpha(0.05, 8) == 0.05 / 6 and look_alpha(0.05, 3) == 0.05 and look_alpha(0.05, 1) == 0.05
    base, new, order = session_runs(4, factor=0.8, turn_sd=0.0, rng=np.random.default_rng(2))
    result = compare_paired_runs(base, new, order, threshold=0.1, alpha=0.05)
    (faster,) = [f for f in result.findings if f.metric == "e2e_ms"][:1]
    (slower_tps,) = [f for f in result.findings if f.metric == "output_tokens_per_s"][:1]
    assert worse_bound_pct(faster, 0.05) < -15, "20 % faster: its bound on the slower side is far below 0"
    assert worse_bound_pct(slower_tps, 0.05) < -15, "throughput up 25 %: higher is better, so that is better too"


def test_a_near_threshold_slowdown_is_found_at_an_interim_look_only_once_its_lower_bound_is_past():
    """REGRESSED on its estimate (12 % slower, significant) is not enough to stop early: its
    lower bound at alpha / looks must be past the 10 % threshold too."""
    alpha = look_alpha(0.05, 8)

    def looked(ratio):
        f = Finding(
            {"case": "c"},
            "e2e_ms",
            1.0,
            ratio,
            ratio,
            (ratio - 1) * 100,
            10.0,
            (5, 5),
            0.001,
            0.001,
            REGRESSED,
            se=0.03,
            df=3,
        )
        return SimpleNamespace(findings=[f], capacity_bounds=[]), f

    near, f = looked(1.12)
    assert worse_bound_pct(f, alpha, upper=False) < 10 < worse_bound_pct(f, alpha)
    assert decision(near, 0, alpha) is None, "neither past the threshold nor cleared of it"
    clear, f = looked(1.5)
    assert worse_bound_pct(f, alpha, upper=False) > 10 and decision(clear, 0, alpha) == FOUND
    held, _ = looked(1.0)
    held.findings[0].verdict = "within"
    held.capacity_bounds.append(SimpleNamespace(change=0))
    assert decision(held, 0, alpha) is None, "a capacity its bounds cannot tell blocks clearing"


def test_resume_keeps_a_decided_session_and_refuses_another_design(tmp_path, monkeypatch):
    fake, out = write_fake_python(tmp_path), tmp_path / "ab"
    assert run_ab(*ab_args(fake, out, 8, "--sequential", "--new-env", "FAKE_SCALE=1.5")).returncode == 1
    again = run_ab(*ab_args(fake, out, 8, "--sequential", "--resume", "--new-env", "FAKE_SCALE=1.5"))
    assert again.returncode == 1 and "decided after 3 pairs already" in again.stderr
    assert sorted(pair_files(out / NEW)) == [0, 1, 2], "no pair run after the decision"
    assert json.loads((out / "ab.json").read_text())["sequential"]["stopped_at"] == 3, "the looks kept"
    for change in (["--resume"], ["--sequential", "--resume", "--alpha", "0.1"]):
        refused = run_ab(
            *ab_args(fake, out, 8 if change != ["--resume"] else 8, *change, "--new-env", "FAKE_SCALE=1.5")
        )
        assert refused.returncode == 2 and "--resume: the design is" in refused.stderr, refused.stderr
    refused = run_ab(*ab_args(fake, out, 10, "--sequential", "--resume", "--new-env", "FAKE_SCALE=1.5"))
    assert refused.returncode == 2 and "'pairs': 10" in refused.stderr, "more pairs: other looks"


def test_the_final_comparison_of_a_sequential_session_is_at_the_looks_level(tmp_path, monkeypatch):
    import lorabench.analysis.compare as compare

    levels, real = [], compare.compare_pairs

    def spy(*args, **kwargs):
        levels.append(kwargs["alpha"])
        return real(*args, **kwargs)

    monkeypatch.setattr(compare, "compare_pairs", spy)
    fake, out = write_fake_python(tmp_path), tmp_path / "ab"
    assert run_ab(*ab_args(fake, out, 8, "--sequential", "--new-env", "FAKE_SCALE=1.5")).returncode == 1
    assert levels == [0.05 / 6, 0.05 / 6], "the look at pair 3, then the session's comparison"


def test_a_case_metric_not_tested_on_pairs_neither_clears_nor_finds():
    """One pair's case-metric has no spread (se None): no bound, so the look goes on."""
    alpha = look_alpha(0.05, 8)
    f = Finding({"case": "c"}, "e2e_ms", 1.0, 1.0, 1.0, 0.0, 10.0, (1, 1), None, None, "too few")
    assert worse_bound_pct(f, alpha) is None and worse_bound_pct(f, alpha, upper=False) is None
    assert decision(SimpleNamespace(findings=[f], capacity_bounds=[]), 0, alpha) is None
    assert decision(SimpleNamespace(findings=[], capacity_bounds=[]), 0, alpha) is None, "nothing compared"
