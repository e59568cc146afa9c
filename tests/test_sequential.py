"""Sequential stopping (--bench-precision, docs/metrics.md#sequential-stopping): the design's
looks and intervals, the option, its ini twin and the config fields, and batch cases on a
stand-in whose rounds are noisy (scripts/bench_sequential_coverage.py's ``NoisyStandIn``)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from scipy import stats

from lorabench.measure.sequential import HEADLINE, Design, cost_line, looks
from lorabench.pytest_plugin.options import parse_precision
from lorabench.targets.standin import write_config
from tests import helpers
from tests.helpers import ROOT, make_row, result_files

PRECISION = ("precision_target_pct", "precision_pct", "precision_reached")


def load_script():
    """scripts/bench_sequential_coverage.py as a module."""
    return helpers.load_script("bench_sequential_coverage")


@pytest.fixture
def noisy(pytester):
    """Runs the repository's batch bench modules on a stand-in whose every round costs a
    lognormal factor of ``sigma`` times its costs; returns the result, rows and samples."""
    for name in ("test_multilora.py", "test_no_lora.py"):
        pytester.makepyfile(**{name[:-3]: (ROOT / "bench" / name).read_text()})
    script = load_script()
    runs = iter(range(100))

    def run(sigma, *args, matrix=None, seed=0):
        folder = pytester.path / f"run{next(runs)}"
        config = write_config(folder, matrix={"rounds": 3, "max_rounds": 6, **(matrix or {})})
        plugin = script.NoisyStandIn(script.Noise("test", sigma), seed)
        result = pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", *args, plugins=[plugin])
        files = result_files(folder / "results")
        if not files:
            return result, None, None
        (csv,) = files
        return result, pd.read_csv(csv), pd.read_csv(csv.with_name(csv.stem + ".samples.csv"))

    return run


def test_looks_grow_by_half_from_the_minimum_to_the_maximum():
    assert looks(3, 12) == (3, 5, 8, 12)
    assert looks(1, 4) == (2, 3, 4), "one round has no variance: the first look is at 2"
    assert looks(3, 3) == (3,)
    assert looks(4, 5) == (4, 5)


def test_each_look_spends_an_equal_share_of_the_error():
    """A t interval on the logs at 1 - 0.05 / (2 x looks): wider than the fixed-n interval that,
    checked after every round, would not keep its coverage."""
    values = [10.0, 11.0, 9.5]
    logs = [math.log(v) for v in values]
    sd = stats.tstd(logs)
    design = Design.of(5.0, 3, 12)
    interval = design.interval(values)
    expected = stats.t.ppf(1 - 0.05 / 8, 2) * sd / math.sqrt(3)
    assert interval.half_width == pytest.approx(math.expm1(expected))
    assert interval.center == pytest.approx(math.exp(sum(logs) / 3))
    assert interval.low == pytest.approx(interval.center / (1 + interval.half_width))
    fixed = math.expm1(stats.t.ppf(0.975, 2) * sd / math.sqrt(3))
    assert interval.half_width > 2 * fixed


def test_a_verdict_is_given_at_looks_only_and_judges_the_metrics_with_positive_values():
    design = Design.of(5.0, 3, 12)
    rounds = [{"e2e_ms": 10.0, "ttft_ms": 2.0, "decode_ms": math.nan}] * 4
    assert design.judge(rounds) is None, "4 rounds is no look of (3, 5, 8, 12)"
    verdict = design.judge(rounds[:3])
    assert set(verdict.intervals) == {"e2e_ms", "ttft_ms"}, "decode has no value: not judged"
    assert verdict.reached and verdict.half_width == 0.0
    assert verdict.fields() == {"precision_target_pct": 5.0, "precision_pct": 0.0, "precision_reached": True}
    spread = [{m: v for m in HEADLINE} for v in (10.0, 12.0, 8.0)]
    assert not design.judge(spread).reached and not design.stops(design.judge(spread))
    last = design.judge(spread * 4)
    assert last.rounds == 12 and design.stops(last), "the last look stops the case, reached or not"


def test_a_case_is_as_precise_as_its_widest_headline_metric():
    """One metric short of the target holds the case back, and its half-width is the row's."""
    design = Design.of(5.0, 3, 12)
    rounds = [{"e2e_ms": 10.0, "ttft_ms": t, "decode_ms": 1.0 + t / 1000} for t in (2.0, 2.4, 1.7)]
    verdict = design.judge(rounds)
    widths = {m: i.half_width for m, i in verdict.intervals.items()}
    assert widths["e2e_ms"] == 0.0 and widths["decode_ms"] < 0.05 < widths["ttft_ms"]
    assert verdict.half_width == widths["ttft_ms"] and not verdict.reached
    assert verdict.fields()["precision_pct"] == pytest.approx(100 * widths["ttft_ms"])


@pytest.mark.parametrize("text, pct", [("5%", 5.0), ("5", 5.0), (" 2.5 % ", 2.5), ("0.1%", 0.1)])
def test_the_option_takes_a_percentage(text, pct):
    assert parse_precision(text) == pct


@pytest.mark.parametrize("text", ["abc", "0", "0%", "-1", "100", "nan", "inf", ""])
def test_the_option_refuses_what_is_no_half_width(text):
    with pytest.raises(ValueError, match="percentage|above 0"):
        parse_precision(text)


def test_the_option_and_its_ini_twin_are_in_the_help(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--bench-precision=PCT*", "*bench_precision*"])


def refused(result) -> list[str]:
    assert result.ret == 2, result.stdout.str()
    result.stdout.fnmatch_lines(["*lorabench: bad input: nothing ran (exit status 2)*"])
    assert "engine builds" not in result.stdout.str() and "Traceback" not in result.stderr.str()
    return [line for line in result.stderr.lines if line]


def test_a_bad_precision_is_refused_in_one_line_before_any_engine(noisy, pytester):
    result, rows, _ = noisy(0.01, "--bench-precision", "abc")
    assert rows is None and refused(result) == ["lorabench: --bench-precision abc: expected a percentage such as 5%"]
    pytester.makeini("[pytest]\nbench_precision = 0\n")
    result, rows, _ = noisy(0.01)
    (line,) = refused(result)
    assert line.startswith("lorabench: ")
    assert "ini option bench_precision = 0: a relative half-width lies above 0" in line


@pytest.mark.parametrize(
    "matrix, found",
    [
        ({"precision_pct": 0}, "field 'matrix.precision_pct' has bad value 0"),
        ({"precision_pct": "5%"}, "field 'matrix.precision_pct' has bad value '5%'"),
        ({"max_rounds": 2}, "field 'matrix.max_rounds' has bad value 2: rounds = 3 is the minimum a case runs: give 3"),
        ({"max_rounds": 1, "rounds": 1}, "field 'matrix.max_rounds' has bad value 1"),
    ],
)
def test_bad_config_fields_are_refused_in_one_line_before_any_engine(noisy, matrix, found):
    result, rows, _ = noisy(0.01, matrix=matrix)
    (line,) = refused(result)
    assert rows is None and found in line, line


def test_the_command_line_wins_over_the_ini_twin_and_the_ini_twin_over_the_config(noisy, pytester):
    pytester.makeini("[pytest]\nbench_precision = 40\n")
    _, rows, _ = noisy(0.01, "-k", "multilora", matrix={"precision_pct": 50})
    assert rows["precision_target_pct"].tolist() == [40.0]
    _, rows, _ = noisy(0.01, "-k", "multilora", "--bench-precision", "0.001%", matrix={"precision_pct": 50})
    assert rows["precision_target_pct"].tolist() == [0.001]
    assert rows["rounds"].tolist() == [6] and not rows["precision_reached"].iloc[0]


def test_a_case_with_low_noise_stops_at_the_minimum_and_records_the_target_reached(noisy):
    result, rows, samples = noisy(0.001, "-k", "multilora or no_lora", "--bench-precision", "5%")
    assert result.ret == 0 and len(rows) == 3, "multilora, and no_lora on the LoRA and LoRA-off engines"
    assert rows["rounds"].tolist() == [3, 3, 3]
    assert rows["precision_reached"].tolist() == [True] * 3
    assert (rows["precision_target_pct"] == 5).all() and (rows["precision_pct"] < 1).all()
    assert samples.groupby(["engine_id", "scenario"])["round"].nunique().tolist() == [3, 3, 3]
    # The cost against the fixed rounds (3 a case): stopped at the first look, the same.
    result.stdout.fnmatch_lines(
        [
            "sequential stopping: 3 of 3 cases reached 5 %, in 9 measured rounds (3 a case without a target): "
            "* s measured against about * s at the fixed rounds (1.00x), no-LoRA baselines apart"
        ]
    )


def per_round_values(samples: pd.DataFrame) -> list[dict[str, float]]:
    """Each round's headline values, from the samples file: its batch e2e, its mean TTFT and decode."""
    by_round = samples.groupby("round")
    means = by_round[["ttft_ms", "decode_ms"]].mean()
    return means.assign(e2e_ms=by_round["batch_e2e_ms"].first()).to_dict("records")


def test_a_case_with_high_noise_runs_to_the_maximum_and_records_its_half_width(noisy, tmp_path):
    out = tmp_path / "benchmark.json"
    result, rows, samples = noisy(0.5, "-k", "multilora", "--bench-precision", "5", f"--benchmark-json={out}")
    assert result.ret == 0
    (bench,) = json.loads(out.read_text())["benchmarks"]
    assert bench["stats"]["rounds"] == 6, "pytest-benchmark counts the rounds past its pedantic ones"
    assert set(bench["extra_info"]["intervals"]) == set(HEADLINE)
    row = rows.iloc[0]
    assert row["rounds"] == 6 and not row["precision_reached"]
    # The row's half-width is the widest of the last look's, from the rounds it recorded.
    verdict = Design.of(5.0, 3, 6).judge(per_round_values(samples))
    assert verdict.rounds == 6 and row["precision_pct"] == pytest.approx(100 * verdict.half_width)
    assert row["precision_pct"] > 5
    assert row["e2e_ms"] == pytest.approx(samples.groupby("round")["batch_e2e_ms"].first().mean())
    # Each headline metric's interval at the stopping look, and the rounds' measured seconds.
    for metric, interval in verdict.intervals.items():
        assert row[f"{metric}_ci_pct"] == pytest.approx(100 * interval.half_width)
    assert row["measured_s"] == pytest.approx(samples.groupby("round")["batch_e2e_ms"].first().sum() / 1000)
    result.stdout.fnmatch_lines(["sequential stopping: 0 of 1 cases reached 5 %, in 6 measured rounds (3 a *(2.00x)*"])


def test_without_a_target_rows_are_unchanged(noisy):
    """Same rounds, the columns blank, and the same figures as a run whose target is met at the
    minimum: the noise is seeded, so the same rounds cost the same."""
    _, plain, plain_samples = noisy(0.02, "-k", "multilora")
    _, met, _ = noisy(0.02, "-k", "multilora", "--bench-precision", "50")
    assert plain["rounds"].tolist() == [3] and plain_samples["round"].nunique() == 3
    assert plain[list(PRECISION)].isna().all().all()
    assert met["rounds"].tolist() == [3] and met["precision_reached"].tolist() == [True]
    figures = ["e2e_ms", "ttft_ms", "decode_ms", "baseline_e2e_ms", "lora_overhead", "output_tokens_per_s"]
    assert plain[figures].to_dict("records") == met[figures].to_dict("records")
    assert plain.columns.tolist() == met.columns.tolist()
    # Without a target, the fixed rounds' intervals (one look), from the rounds the samples file recorded.
    fixed = Design.fixed(3).judge(per_round_values(plain_samples)).interval_fields()
    assert plain[list(fixed)].iloc[0].to_dict() == pytest.approx(fixed) and all(v > 0 for v in fixed.values())


def test_one_round_or_a_nan_metric_gives_no_interval_and_no_target_gives_no_cost_line():
    assert Design.fixed(1).judge([{"e2e_ms": 5.0, "ttft_ms": 1.0, "decode_ms": 1.0}]).interval_fields() == {}
    rounds = [{"e2e_ms": 5.0, "ttft_ms": math.nan, "decode_ms": 1.0}, {"e2e_ms": 6.0, "ttft_ms": 2.0, "decode_ms": 1.1}]
    assert set(Design.fixed(2).judge(rounds).interval_fields()) == {"e2e_ms_ci_pct", "decode_ms_ci_pct"}
    assert cost_line([make_row(measured_s=1.0, rounds=2)], 2) is None, "no case had a target"
