"""The capacity search: against probes whose true capacity is known (a queue that grows
above it), its limits and stops, the config's refusals, and one search end to end on the
stand-in engine, whose service rate is set by its costs."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lorabench.analysis import recommend
from lorabench.analysis.compare import load_run
from lorabench.analysis.compare.analysis import IMPROVED, REGRESSED, compare
from lorabench.analysis.report import capacity_figures, write_report
from lorabench.analysis.report.runs import ReportRun
from lorabench.config import ConfigError, read_config_file, resolve_config
from lorabench.measure import capacity
from lorabench.results import search_stops
from lorabench.results.records import replays_path_for, samples_path_for
from lorabench.results.schema import COLUMNS
from lorabench.targets.standin import Costs, StandIn, write_config
from tests.helpers import ROOT, make_row, result_files

LIMITS = capacity.Limits(precision=0.1, min_rate=0.5, max_rate=None, max_probes=20, max_time_s=math.inf)


def queue_probe(true_rps: float, seed: int, target: float = 0.9, seconds: float = 20.0):
    """An engine that serves ``true_rps``: below it, 98 % of requests meet the SLO (drawn,
    so attainment is noisy); above it the queue grows, so requests are left unfinished
    in proportion to the excess, and those that finish mostly miss the SLO."""
    rng = np.random.default_rng(seed)

    def probe(rate: float, stretch: float) -> capacity.Probe:
        n = max(1, round(rate * seconds * stretch))
        excess = max(0.0, rate / true_rps - 1)
        unfinished = min(n, math.ceil(n * excess)) if excess else 0
        met = int(rng.binomial(n - unfinished, 0.98 if not excess else 0.3))
        return capacity.Probe(rate=rate, requests=n, met=met, unfinished=unfinished, target=target, stretch=stretch)

    return probe


@pytest.mark.parametrize("seed", range(6))
def test_the_search_brackets_a_known_capacity_within_its_precision(seed):
    rng = np.random.default_rng(100 + seed)
    true_rps = float(rng.uniform(2, 300))
    estimate = true_rps * float(rng.uniform(0.8, 3.0))
    found = capacity.search(queue_probe(true_rps, seed), estimate, LIMITS)
    assert found.stop == capacity.BRACKETED
    assert found.capacity.rate <= true_rps < found.over.rate
    assert found.over.rate <= found.capacity.rate * (1 + LIMITS.precision)
    assert len(found.probes) <= 8


def edge_probe(true_rps: float, seed: int, width: float = 0.15, seconds: float = 6.0):
    """An engine whose attainment falls off gradually around ``true_rps``: from 0.99 at
    ``(1 - width)`` times it to 0.5 at ``(1 + width)`` times it, drawn binomially from few
    requests, so probes near the edge pass or fail by chance, and out of order."""
    rng = np.random.default_rng(seed)

    def probe(rate: float, stretch: float) -> capacity.Probe:
        n = max(1, round(rate * seconds * stretch))
        x = min(max((rate / true_rps - 1 + width) / (2 * width), 0.0), 1.0)
        met = int(rng.binomial(n, 0.99 - 0.49 * x))
        return capacity.Probe(rate=rate, requests=n, met=met, unfinished=0, target=0.9, stretch=stretch)

    return probe


@pytest.mark.parametrize("seed", range(40))
def test_noise_at_the_edge_never_breaks_the_bracket(seed):
    rng = np.random.default_rng(500 + seed)
    true_rps = float(rng.uniform(5, 100))
    found = capacity.search(edge_probe(true_rps, seed), true_rps * float(rng.uniform(0.5, 3.0)), LIMITS)
    assert found.stop == capacity.BRACKETED
    low, high = found.capacity, found.over
    assert low.rate < high.rate <= low.rate * (1 + LIMITS.precision)
    # Once the bracket exists, every probe is inside it: the first pass and the first fail,
    # and all after them, lie between the rates that bracketed it.
    first_pass = next(i for i, p in enumerate(found.probes) if p.passed)
    first_fail = next(i for i, p in enumerate(found.probes) if p.failed)
    opened = max(first_pass, first_fail)
    bounds = (found.probes[first_pass].rate, found.probes[first_fail].rate)
    inside = [p.rate for p in found.probes[opened + 1 :]]
    assert all(min(bounds) < r < max(bounds) for r in inside)
    # Every passing probe is below every failing one: noise can move the edge, never cross it.
    assert max(p.rate for p in found.probes if p.passed) < min(p.rate for p in found.probes if p.failed)
    # The edge found is where attainment crosses the target, give or take the noise of the band.
    assert 0.8 * true_rps <= low.rate and high.rate <= 1.2 * true_rps


def void_probe(rate: float, stretch: float, **why) -> capacity.Probe:
    extra = {"goodput_rps": 1.0, "ttft_ms_p99": 1.0, "decode_ms_p99": 1.0, "seconds": 1.0}
    return capacity.Probe(rate=rate, requests=50, met=50, unfinished=0, target=0.9, stretch=stretch, extra=extra, **why)


def test_a_probe_whose_requests_failed_is_no_overload_and_stops_the_search():
    def probe(rate, stretch):
        if rate > 10:  # the server broke: every probe from here on has failures
            return void_probe(rate, stretch, failed_requests=3, first_error="HTTP 500: injected failure")
        return void_probe(rate, stretch)

    found = capacity.search(probe, 16.0, LIMITS)
    assert found.stop == "requests failed: HTTP 500: injected failure"
    assert found.over is None and found.capacity.rate == 8.0 and len(found.probes) == 2
    last = found.probes[-1].record(1)
    assert not last.passed and not last.decided and last.failed_requests == 3
    assert last.undecided_why == found.stop


def test_a_client_that_fell_behind_is_probed_once_more_then_stops_the_search():
    behind = "client fell behind: 9 of 50 requests sent over 15 ms late"
    hiccup = iter([behind])  # the first probe's client falls behind once, then keeps up
    found = capacity.search(lambda r, s: void_probe(r, s, behind=next(hiccup, "")), 16.0, LIMITS)
    assert [p.rate for p in found.probes[:2]] == [8.0, 8.0] and found.probes[1].passed
    always = capacity.search(lambda r, s: void_probe(r, s, behind=behind), 16.0, LIMITS)
    assert always.stop == behind and len(always.probes) == 2 and always.capacity is None and always.over is None
    assert always.probes[0].record(0).undecided_why == behind


def test_an_overloaded_probe_never_passes_whatever_its_finished_requests_say():
    overloaded = capacity.Probe(rate=10, requests=100, met=95, unfinished=1, target=0.9)
    assert overloaded.attainment >= 0.9 and not overloaded.passed
    assert capacity.Probe(rate=10, requests=100, met=90, unfinished=0, target=0.9).passed
    assert not capacity.Probe(rate=10, requests=100, met=89, unfinished=0, target=0.9).passed
    assert not capacity.Probe(rate=10, requests=0, met=0, unfinished=0, target=0.9).passed


def test_a_capacity_above_the_range_or_below_its_floor_is_said_so():
    capped = capacity.Limits(precision=0.1, min_rate=0.5, max_rate=40.0, max_probes=20, max_time_s=math.inf)
    above = capacity.search(queue_probe(1000.0, 0), 10.0, capped)
    assert above.stop == capacity.ABOVE_RANGE and above.capacity.rate == 40.0 and above.over is None
    below = capacity.search(queue_probe(0.1, 0), 10.0, capped)
    assert below.stop == capacity.BELOW_RANGE and below.capacity is None and below.over.rate == 0.5


def test_limits_on_probes_and_time_stop_the_search_and_say_which():
    few = capacity.Limits(precision=0.01, min_rate=0.5, max_rate=None, max_probes=3, max_time_s=math.inf)
    found = capacity.search(queue_probe(50.0, 0), 10.0, few)
    assert found.stop == capacity.PROBE_LIMIT and len(found.probes) == 3
    ticks = iter(range(100))
    brief = capacity.Limits(precision=0.01, min_rate=0.5, max_rate=None, max_probes=99, max_time_s=2, probe_s=0.5)
    found = capacity.search(queue_probe(50.0, 0), 10.0, brief, clock=lambda: next(ticks))
    assert found.stop == capacity.TIME_LIMIT and len(found.probes) == 1


def test_the_wilson_interval_of_a_share():
    low, high = capacity.wilson_interval(9, 10)
    assert (round(low, 4), round(high, 4)) == (0.5958, 0.9821)
    assert capacity.wilson_interval(20, 20)[1] == 1.0 and capacity.wilson_interval(20, 20)[0] > 0.8


EXCERPT = ROOT / "config" / "traces" / "azure-code-excerpt.jsonl"
CAPACITY = {
    "slo_ttft_ms": 60,
    "slo_tpot_ms": 50,
    "probe_duration_s": 0.7,
    "warmup_s": 0.1,
    "drain_s": 0.4,
    "precision": 0.2,
    "estimate_requests": 12,
    "estimate_concurrency": 1,
    "shapes": [{"name": "s", "num_adapters": [2], "cv": [0.1], "input_range": [20, 20], "output_range": [4, 4]}],
}


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"warmup_s": 1.0}, "warmup_s 1 leaves nothing of probe_duration_s 0.7"),
        ({"max_rate": 5}, "max_rate 5 is at or below 16.7 requests/s"),
        ({"target": 1.5}, "capacity.target"),
        ({"max_probes": 1}, "capacity.max_probes"),
        ({"shapes": [{"num_adapters": [9]}]}, "field 'capacity.shapes[0].num_adapters' has bad value 9"),
        ({"shapes": [{"trace": "missing.jsonl"}]}, "field 'capacity.shapes[0].trace'"),
        ({"slo_ttft_ms": 200}, "probe_duration_s 0.7 is too short to tell an overload from a pass"),
        ({"precision": 0}, "capacity.precision"),
        ({"drain_s": 0}, "capacity.drain_s"),
        (
            {"probe_duration_s": 2, "warmup_s": 1, "shapes": [{"trace": str(EXCERPT)}]},
            "holds 15 requests, too few for a 2 s probe at 10 requests/s",
        ),
    ],
)
def test_bad_capacity_values_are_refused_with_file_field_and_fix(tmp_path, override, expected):
    path = write_config(tmp_path, capacity={**CAPACITY, **override})
    with pytest.raises(ConfigError) as info:
        resolve_config(path, read_config_file(path), needs_lora=True)
    assert str(path) in str(info.value) and expected in str(info.value)


def service_rps(costs: Costs, input_len: int, output_len: int) -> float:
    """The stand-in serving one request at a time: a prefill step, then a decode step per token."""
    return 1000.0 / (input_len * costs.prefill_ms_per_token + output_len * costs.decode_ms_per_step)


def hidden_overload_rps(rate: float) -> float:
    """The highest rate a probe of ``CAPACITY`` can pass with the stand-in serving ``rate``:
    above it the queue grows by (r / rate - 1) seconds of wait a second, and a probe passes
    while 90 % of its measured requests stay within the TTFT SLO, so a short probe hides a
    small overload (a busy host only slows the stand-in, so nothing faster passes)."""
    span, warmup = CAPACITY["probe_duration_s"], CAPACITY["warmup_s"]
    return rate * (1 + CAPACITY["slo_ttft_ms"] / 1000 / (span - 0.1 * (span - warmup)))


def test_a_search_on_the_stand_in_finds_its_service_rate_and_keeps_every_probe(pytester, tmp_path):
    costs = Costs(prefill_ms_per_token=0.1, decode_ms_per_step=4.0)
    pytester.makepyfile(test_bench_capacity=(ROOT / "bench" / "test_capacity.py").read_text())
    engine = {"max_loras": 2, "max_lora_rank": 8, "max_cpu_loras": 4, "max_num_seqs": 1}
    config = write_config(pytester.path / "run", adapters=2, capacity=CAPACITY, engine=engine)
    result = pytester.runpytest(
        "--bench-config", str(config), "-p", "no:cacheprovider", plugins=[StandIn(costs, virtual_clock=True)]
    )
    result.assert_outcomes(passed=1)
    (csv,) = result_files(pytester.path / "run" / "results")
    (row,) = pd.read_csv(csv).to_dict("records")
    # One request at a time with regular arrivals: the queue grows above the service rate,
    # which the closed-loop estimate (one request in flight) measures. It is a little below
    # what the costs give: each step has an overhead of its own (a fraction of a millisecond).
    # A busy host makes the stand-in slower, never faster: the estimate may come out well below
    # the costs' rate (0.7x on the shared 2-core host at load 5), and no probe passes above
    # what a 0.7 s probe can hide (60.3/s passed once at 55.6/s: 1.085x).
    served, rate = row["estimate_rps"], service_rps(costs, 20, 4)
    most = hidden_overload_rps(rate)
    assert 0.5 * rate <= served <= rate
    assert row["search_stop"] == capacity.BRACKETED
    assert 0.8 * served <= row["capacity_rps"] <= most and 1.05 * served < 1.25 * row["capacity_over_rps"]
    assert row["capacity_over_rps"] <= row["capacity_rps"] * 1.2
    assert row["attainment_at_capacity"] >= 0.9 and row["attainment_ci_low"] < row["attainment_at_capacity"]
    assert math.isnan(row["trace_rate"]) and row["trace_duration_s"] == CAPACITY["probe_duration_s"]

    probes = pd.read_csv(replays_path_for(csv, "probes"))
    assert len(probes) == row["probes"] == row["rounds"] and probes["probe"].tolist() == list(range(len(probes)))
    # Kept as each finished, keyed as the row written after them.
    assert probes["timestamp"].unique().tolist() == [row["timestamp"]] and (probes["run_id"] == row["run_id"]).all()
    # A probe stopped early is judged on the requests it planned (tests/test_probe_stop.py).
    assert (probes["decided"] == (probes["planned"] >= capacity.MIN_REQUESTS)).all()
    whole = probes[probes["stopped_early"].isna()]
    assert (whole["requests"] == whole["planned"]).all() and (whole["sent"] == whole["planned"]).all()
    first = probes[probes["rate"] != probes["rate"].shift()]  # a rerun follows its probe at its rate
    assert np.isclose(first["duration_s"], CAPACITY["probe_duration_s"]).all() and (probes["busy_at_start"] == 0).all()
    passing = probes[probes["passed"]]
    assert (passing["unfinished"] == 0).all() and (passing["attainment"] >= 0.9).all()
    assert (passing["rate"] <= most).all(), "an overload a probe can see passed"
    assert (
        row["capacity_rps"] == passing["rate"].max()
        and row["capacity_over_rps"] == probes[probes["decided"] & ~probes["passed"]]["rate"].min()
    )
    samples = pd.read_csv(samples_path_for(csv))
    measured = samples[samples["arrival_s"] >= CAPACITY["warmup_s"]].groupby("round").size()
    assert measured.tolist() == probes["sent"].tolist()

    page = write_report([csv], tmp_path / "report")
    assert 'src="capacity_knee.png"' in page.read_text() and (page.parent / "capacity_knee.png").is_file()


def capacity_rows(engine: dict, capacities, over=1.2, **values) -> list:
    """A search's rows, one per build: each passed ``capacity`` and failed ``over`` times it."""
    name = f"loras{engine['max_loras']}-rank16-cpu4"
    fields = {
        "scenario": "capacity",
        "workload": "trace",
        "batch_size": None,
        "input_len": None,
        "output_len": None,
        "trace_suite": "s",
        "trace_num_adapters": 4,
        "trace_alpha": 1.0,
        "trace_cv": 1.0,
        "slo_ttft_ms": 500.0,
        "slo_tpot_ms": 50.0,
        "slo_target": 0.9,
        "search_stop": capacity.BRACKETED,
        **engine,
        **values,
    }
    return [
        make_row(
            **fields,
            capacity_rps=c,
            capacity_over_rps=c * over if c is not None and over is not None else None,
            engine_id=f"{name}-build{b}",
            build=b,
        )
        for b, c in enumerate(capacities)
    ]


def test_the_recommendation_names_the_best_and_whether_its_lead_is_real():
    two, eight = {"max_loras": 2}, {"max_loras": 8}
    clear = recommend.for_session(capacity_rows(two, [10.0, 10.5]) + capacity_rows(eight, [13.0, 13.4]))
    assert len(clear) == 1 and "choose loras8-rank16-cpu4: 13.2 req/s, builds 13-13.4" in clear[0]
    assert "29% over loras2-rank16-cpu4 (10.2 req/s" in clear[0] and "a real lead" in clear[0]
    assert "1024 KV cache tokens, peak 700 MiB" in clear[0] and "TTFT 500 ms and TPOT 50 ms for 90%" in clear[0]
    # Every build of loras8 passed 11 or more, but loras2's second build passed 12.1.
    overlapping = recommend.for_session(capacity_rows(two, [10.0, 12.1]) + capacity_rows(eight, [11.0, 12.4]))
    assert "not shown: within the searches' precision and the spread" in overlapping[0]
    # One build each: the spread between builds is unknown, so the lead is not tested.
    single = recommend.for_session(capacity_rows(two, [10.0]) + capacity_rows(eight, [11.5]))
    assert "1 build: lead not tested" in single[0]
    below = {"search_stop": capacity.BELOW_RANGE}
    none = recommend.for_session(capacity_rows(two, [None], **below) + capacity_rows(eight, [None], **below))
    assert "no configuration met the SLOs" in none[0]
    stopped = {"search_stop": capacity.PROBE_LIMIT}
    unknown = recommend.for_session(capacity_rows(two, [None], **stopped) + capacity_rows(eight, [None], **stopped))
    assert "not found: every search stopped before a probe passed (max_probes)" in unknown[0]
    capped = recommend.for_session(capacity_rows(two, [40.0], over=None) + capacity_rows(eight, [40.0], over=None))
    assert "at least 40 req/s" in capped[0] and "raise max_rate" in capped[0]
    other_slo = capacity_rows(two, [10.0], slo_ttft_ms=900.0) + capacity_rows(eight, [12.0])
    assert len(recommend.for_session(other_slo)) == 2, "a shape searched under other SLOs is its own question"


def write_rows(path, rows) -> str:
    pd.DataFrame([asdict(r) for r in rows], columns=COLUMNS).to_csv(path, index=False)
    return str(path)


def test_compare_calls_a_lower_capacity_a_regression_and_a_higher_one_an_improvement(tmp_path):
    engine = {"max_loras": 2}
    base = write_rows(tmp_path / "base.csv", capacity_rows(engine, [20.0, 20.4, 19.8]))
    lower = write_rows(tmp_path / "lower.csv", capacity_rows(engine, [16.0, 16.3, 15.9]))
    higher = write_rows(tmp_path / "higher.csv", capacity_rows(engine, [24.0, 24.3, 23.8]))
    verdict = {f.metric: f.verdict for f in compare(load_run(base), load_run(lower)).findings}
    assert verdict["capacity_rps"] == REGRESSED
    verdict = {f.metric: f.verdict for f in compare(load_run(base), load_run(higher)).findings}
    assert verdict["capacity_rps"] == IMPROVED


def test_compare_tests_only_bracketed_capacities_and_fails_on_a_collapse(tmp_path):
    engine = {"max_loras": 2}
    base = write_rows(tmp_path / "base.csv", capacity_rows(engine, [20.0, 20.4, 19.8]))
    stopped = capacity_rows(engine, [30.0, 30.2, 29.9], over=None, search_stop=capacity.PROBE_LIMIT)
    bounded = compare(load_run(base), load_run(write_rows(tmp_path / "stopped.csv", stopped)))
    assert "capacity_rps" not in {f.metric for f in bounded.findings} and not bounded.failed
    below = capacity_rows(engine, [None, None, None], search_stop=capacity.BELOW_RANGE)
    collapsed = compare(load_run(base), load_run(write_rows(tmp_path / "below.csv", below)))
    assert collapsed.failed and len(collapsed.capacity_collapses) == 1
    assert (
        "CAPACITY COLLAPSED" in collapsed.capacity_collapses[0] and "below min_rate" in collapsed.capacity_collapses[0]
    )


def test_shapes_sharing_a_name_get_panels_of_their_own():
    rows = [
        *capacity_rows({"max_loras": 2}, [10.0], trace_num_adapters=4),
        *capacity_rows({"max_loras": 2}, [6.0], trace_num_adapters=16),
    ]
    frame = pd.DataFrame([asdict(r) for r in rows]).assign(engine="loras2-rank16-cpu4")
    labels = [label for label, _ in recommend.shapes(frame)]
    assert len(labels) == 2 and "4 adapters" in labels[0] and "16 adapters" in labels[1]
    run = ReportRun("run", Path("x.csv"), frame, *(pd.DataFrame() for _ in range(4)))
    figure = capacity_figures.capacity_by_configuration([run])
    assert [ax.get_title().split(" (")[0] for ax in figure.axes] == ["s", "s"]
    assert [ax.patches[0].get_height() for ax in figure.axes] == [10.0, 6.0]


def test_the_figure_draws_no_capacity_where_the_search_gave_no_verdict_and_marks_a_bound():
    """As the recommendation reads them: a search whose client fell behind has no capacity
    (its last passing rate is no SLO edge), one above its range a lower bound only."""
    rows = [
        *capacity_rows({"max_loras": 2}, [4.0]),
        *capacity_rows({"max_loras": 8}, [6.0], search_stop=f"{search_stops.BEHIND}: 40 % of requests sent late"),
        *capacity_rows({"max_loras": 16}, [9.0], search_stop=capacity.ABOVE_RANGE),
    ]
    frame = pd.DataFrame([asdict(r) for r in rows])
    frame = frame.assign(engine=frame["max_loras"].map(lambda n: f"loras{n}-rank16-cpu4"))
    run = ReportRun("run", Path("x.csv"), frame, *(pd.DataFrame() for _ in range(4)))
    (ax,) = capacity_figures.capacity_by_configuration([run]).axes
    bars = {tick.get_text(): bar for tick, bar in zip(ax.get_xticklabels(), ax.patches)}
    two, eight, sixteen = (bars[f"loras{n}-rank16-cpu4"] for n in (2, 8, 16))
    assert two.get_height() == 4.0 and np.isnan(eight.get_height()) and sixteen.get_height() == 9.0
    assert (two.get_hatch(), eight.get_hatch(), sixteen.get_hatch()) == (None, None, "//")
    ticks = {tick.get_text(): x for tick, x in zip(ax.get_xticklabels(), ax.get_xticks())}
    assert [(t.get_text(), t.get_position()[0]) for t in ax.texts] == [("no verdict", ticks["loras8-rank16-cpu4"])]


def test_the_figure_draws_no_bar_for_a_configuration_the_recommendation_does_not_rank():
    """One build with no verdict, or one that found no capacity, leaves the configuration
    unranked in the recommendation; the figure drew its other build's bar (8 req/s, the
    highest here), and 0 for a search stopped at a limit before anything passed."""
    behind = f"{search_stops.BEHIND}: 40 % of requests sent late"
    first, second = (
        [replace(row, build=b, engine_id=f"{row.engine_id[:-1]}{b}") for row in rows]
        for b, rows in enumerate(
            [
                [
                    *capacity_rows({"max_loras": 2}, [4.0]),
                    *capacity_rows({"max_loras": 8}, [8.0]),
                    *capacity_rows({"max_loras": 16}, [None], over=None, search_stop=capacity.PROBE_LIMIT),
                    *capacity_rows({"max_loras": 32}, [None], over=None, search_stop=capacity.PROBE_LIMIT),
                ],
                [
                    *capacity_rows({"max_loras": 2}, [4.4]),
                    *capacity_rows({"max_loras": 8}, [7.0], search_stop=behind),
                    *capacity_rows({"max_loras": 16}, [3.0]),
                    *capacity_rows({"max_loras": 32}, [None], over=None, search_stop=capacity.PROBE_LIMIT),
                ],
            ]
        )
    )
    frame = pd.DataFrame([asdict(r) for r in (*first, *second)])
    frame = frame.assign(engine=frame["max_loras"].map(lambda n: f"loras{n}-rank16-cpu4"))
    (line,) = recommend.recommendations(frame)
    assert "choose loras2-rank16-cpu4" in line and "loras16-rank16-cpu4 not ranked: 1 of 2 searches" in line, line
    run = ReportRun("run", Path("x.csv"), frame, *(pd.DataFrame() for _ in range(4)))
    (ax,) = capacity_figures.capacity_by_configuration([run]).axes
    heights = {tick.get_text(): bar.get_height() for tick, bar in zip(ax.get_xticklabels(), ax.patches)}
    assert heights["loras2-rank16-cpu4"] == pytest.approx(4.2)
    assert all(np.isnan(heights[f"loras{n}-rank16-cpu4"]) for n in (8, 16, 32)), heights
    ticks = dict(zip(ax.get_xticks(), (t.get_text() for t in ax.get_xticklabels())))
    said = {ticks[round(t.get_position()[0])]: t.get_text() for t in ax.texts}
    assert said == {
        "loras8-rank16-cpu4": "no verdict",
        "loras16-rank16-cpu4": "not ranked: 1 of 2 found none",
        "loras32-rank16-cpu4": "none passed",
    }


@pytest.mark.engine
def test_a_small_search_on_the_real_cpu_engine_for_both_configurations(pytester, tmp_path):
    """The default config's model and engine settings, a short search: each configuration's
    capacity lies between its passing and failing probes, and the report draws the knee."""
    config = json.loads((ROOT / "config" / "common.json").read_text())
    config.update(
        prompts=str(ROOT / "config" / "prompts.json"),
        results_dir=str(tmp_path / "results"),
        capacity={
            "slo_ttft_ms": 1000,
            "slo_tpot_ms": 200,
            "precision": 0.5,
            "probe_duration_s": 3,
            "warmup_s": 0.5,
            "drain_s": 2,
            "max_probes": 4,
            "max_time_s": 25,
            "shapes": [{"name": "small", "num_adapters": [4], "input_range": [16, 48], "output_range": [8, 16]}],
        },
    )
    path = tmp_path / "capacity.json"
    path.write_text(json.dumps(config))
    pytester.makepyfile(test_bench_capacity=(ROOT / "bench" / "test_capacity.py").read_text())
    csv = tmp_path / "capacity.csv"
    args = ("--bench-config", str(path), "-p", "no:cacheprovider", "--bench-output", str(csv))
    result = pytester.runpytest_subprocess(*args, timeout=400)
    result.assert_outcomes(passed=2)
    rows = pd.read_csv(csv)
    assert sorted(rows["max_loras"]) == [2, 8] and (rows["probes"] >= 2).all()
    probes = pd.read_csv(replays_path_for(csv, "probes"))
    for _, row in rows.iterrows():
        mine = probes[probes["engine_id"] == row["engine_id"]]
        assert len(mine) == row["probes"]
        passed, failed = mine[mine["passed"]], mine[mine["decided"] & ~mine["passed"]]
        assert not passed.empty and not failed.empty, f"{row['engine_id']}: {row['search_stop']}"
        assert row["capacity_rps"] == passed["rate"].max() < row["capacity_over_rps"] == failed["rate"].min()
        # The edge's interval is the decided probes' profile likelihood, as the probes file has them.
        decided = mine[mine["decided"]]
        kept = [
            capacity.Probe(
                r.rate,
                r.requests,
                r.met,
                r.unfinished,
                row["slo_target"],
                stopped=r.stopped_early if isinstance(r.stopped_early, str) else "",
                planned=r.planned,
            )
            for r in decided.itertuples()
        ]
        edge = tuple(math.nan if v is None else v for v in capacity.boundary_interval(kept))
        assert (row["capacity_ci_low_rps"], row["capacity_ci_high_rps"]) == pytest.approx(edge, nan_ok=True)
    assert "capacity, small (4 adapters" in result.stdout.str() and "choose loras" in result.stdout.str()
    page = write_report([csv], tmp_path / "report")
    assert (page.parent / "capacity_knee.png").is_file() and (page.parent / "capacity.png").is_file()


def test_the_knee_draws_an_undecided_probe_neither_as_a_pass_nor_as_a_fail():
    probes = pd.DataFrame(
        {
            "rate": [4.0, 8.0, 6.0],
            "attainment": [1.0, 0.5, 0.9],
            "ci_low": [0.9, 0.4, 0.6],
            "ci_high": [1.0, 0.6, 1.0],
            "passed": [True, False, False],
            "decided": [True, True, False],
        }
    )
    fig = capacity_figures.pyplot().figure()
    ax = fig.add_subplot()
    capacity_figures._probes(ax, probes, "C0", ("-", "o"), "loras2")
    by_marker = {line.get_marker(): list(line.get_xdata()) for line in ax.lines if len(line.get_xdata())}
    assert by_marker["x"] == [6.0], "the undecided probe alone, as an x"
    filled = [list(line.get_xdata()) for line in ax.lines if line.get_marker() == "o" and line.get_mfc() != "none"]
    hollow = [list(line.get_xdata()) for line in ax.lines if line.get_marker() == "o" and line.get_mfc() == "none"]
    assert filled == [[4.0]] and hollow == [[8.0]]
