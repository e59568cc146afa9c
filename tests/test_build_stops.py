"""Sequential stopping across builds (matrix.max_builds with --bench-precision,
docs/metrics.md#sequential-stopping): a batch case whose builds agree is skipped on the optional
builds after the look that found it precise, and a build none of whose cases runs is never
built; noisy builds run to max_builds; the design is the rounds' one, over builds."""

from __future__ import annotations

import math

import pytest

from lorabench.config import EngineSpec
from lorabench.config.schema import Matrix
from lorabench.pytest_plugin.build_stops import builds_at_most, design, earlier_rows, stop_reason
from tests.helpers import make_row
from tests.test_sequential import noisy, refused  # noqa: F401 - noisy: the stand-in fixture

MATRIX = {"builds": 2, "max_builds": 5}


def matrix(**values):
    return Matrix(batch_sizes=[2], output_len=4, **values)


def rows(*e2e, ttft=1.0, decode=1.0):
    return [make_row(e2e_ms=v, ttft_ms=ttft, decode_ms=decode, build=b) for b, v in enumerate(e2e)]


def test_builds_stop_sequentially_only_with_a_target_and_a_maximum_above_the_minimum():
    assert builds_at_most(matrix(max_builds=5), 2) == 2, "no precision target"
    assert builds_at_most(matrix(max_builds=5, precision_pct=5), 2) == 5
    assert builds_at_most(matrix(max_builds=5, precision_pct=5), 6) == 6, "--bench-builds above the maximum"
    assert design(matrix(precision_pct=5), 2) is None
    assert design(matrix(max_builds=6, precision_pct=5), 2).looks == (2, 3, 5, 6), "the rounds' looks, over builds"


def test_a_case_stops_at_the_first_look_its_builds_agree_at_and_never_between_looks():
    plan = design(matrix(max_builds=6, precision_pct=5), 2)
    assert stop_reason(plan, rows(100.0, 100.1)).startswith("precise after 2 builds: the builds' 95% intervals (")
    assert stop_reason(plan, rows(100.0, 150.0)) is None, "apart: t with 1 degree of freedom at 0.05/8"
    # Three builds agree only with the third: a look (3), so it stops there.
    assert stop_reason(plan, rows(100.0, 150.0, 100.0, 100.0)) is None, "3 builds still apart"
    agree = rows(100.0, 101.0, 100.5, 100.2, 100.1)
    assert stop_reason(plan, agree[:4]).startswith("precise after 3 builds"), "stopped at look 3, not 4"
    nan_ttft = rows(100.0, 100.1, ttft=math.nan)
    assert "ttft_ms" not in stop_reason(plan, nan_ttft), "a metric with no value on a build is not judged"


def test_a_cases_earlier_builds_are_found_by_its_test_id_with_the_build_changed():
    spec = EngineSpec(True, 2, 8, 4, build=2)

    class Item:
        nodeid = f"bench/test_multilora.py::test_multilora[{spec.id}-distinct-2]"

    def row(build, test):
        return make_row(build=build, test_id=Item.nodeid.replace(spec.id, f"loras2-rank8-cpu4-build{build}") + test)

    found = earlier_rows(Item, spec, [row(1, ""), row(0, ""), row(0, "x"), row(3, "")])
    assert [r.build for r in found] == [0, 1], "in build order; another case's and a later build's left out"


def test_max_builds_below_builds_is_refused_in_one_line_before_any_engine(noisy):  # noqa: F811
    result, rows_, _ = noisy(0.01, matrix={"builds": 3, "max_builds": 2})
    (line,) = refused(result)
    assert rows_ is None and "field 'matrix.max_builds' has bad value 2: builds = 3 is the least" in line, line


def test_agreeing_builds_skip_the_optional_builds_and_leave_them_unbuilt(noisy):  # noqa: F811
    result, rows_, _ = noisy(0.001, "-k", "multilora or no_lora", "--bench-precision", "5%", "-rs", matrix=MATRIX)
    assert result.ret == 0
    assert sorted(rows_["build"].tolist()) == [0, 0, 0, 1, 1, 1], "3 cases, on the 2 builds of the minimum"
    result.assert_outcomes(passed=6, skipped=9)
    result.stdout.fnmatch_lines(
        [
            "sequential builds: 3 case(s) precise before matrix.max_builds, 9 of their runs skipped, 6 build(s) "
            "not needed: about * s saved",
            "SKIPPED [[]3[]] *: precise after 2 builds: the builds' 95% intervals (e2e_ms ±*%, ttft_ms ±*%, "
            "decode_ms ±*%) are within 5%",
        ]
    )


def test_noisy_builds_run_to_max_builds_and_each_row_records_the_builds_interval_so_far(noisy):  # noqa: F811
    result, rows_, _ = noisy(0.3, "-k", "multilora", "--bench-precision", "1%", matrix=MATRIX)
    assert result.ret == 0 and sorted(rows_["build"].tolist()) == [0, 1, 2, 3, 4]
    result.stdout.fnmatch_lines(["sequential builds: no case was precise before matrix.max_builds: every build ran"])
    rows_ = rows_.sort_values("build")
    plan = design(matrix(max_builds=5, precision_pct=1), 2)
    for n in (2, 3, 4, 5):
        values = rows_.head(n)[["e2e_ms", "ttft_ms", "decode_ms"]].to_dict("records")
        widest = max(plan.interval([v[m] for v in values]).half_width for m in ("e2e_ms", "ttft_ms", "decode_ms"))
        row = rows_.iloc[n - 1]
        assert row["builds_precision_pct"] == pytest.approx(100 * widest) and not row["builds_precision_reached"]
    assert math.isnan(rows_.iloc[0]["builds_precision_pct"]), "one build has no interval"


def test_a_row_says_where_its_builds_reached_the_target(noisy):  # noqa: F811
    _, rows_, _ = noisy(0.001, "-k", "multilora", "--bench-precision", "5%", matrix=MATRIX)
    rows_ = rows_.sort_values("build")
    assert rows_["builds_precision_reached"].tolist()[1] == True  # noqa: E712 - read from CSV
    assert rows_["builds_precision_pct"].iloc[1] < 5


@pytest.mark.parametrize(
    "args, builds", [((), 2), (("--bench-builds", "3"), 3), (("--bench-precision", "5%", "--bench-builds", "6"), 6)]
)
def test_without_a_target_or_with_a_minimum_past_the_maximum_every_build_runs(noisy, args, builds):  # noqa: F811
    result, rows_, _ = noisy(0.001, "-k", "multilora", *args, matrix=MATRIX)
    assert result.ret == 0 and sorted(rows_["build"].tolist()) == list(range(builds))
    assert rows_["builds_precision_pct"].isna().all(), "no optional builds, no builds' verdict"
