"""The report opens on what a reader came for: the cases LoRA slows most, the configuration
the capacity search chose, and any failed check; and says so plainly when a run has none."""

from __future__ import annotations

from dataclasses import asdict, replace

import pandas as pd

from lorabench.cli import main as cli
from lorabench.measure import capacity
from lorabench.results.schema import COLUMNS
from tests.helpers import make_row


def engine(max_loras: int, build: int) -> dict:
    return {"max_loras": max_loras, "engine_id": f"loras{max_loras}-rank16-cpu4-build{build}", "build": build}


def batch_rows(overheads: dict[tuple[str, int, int], tuple[float, float]], **values) -> list:
    """Multi-LoRA rows, two builds a case: (workload, batch size, max_loras) -> each build's overhead."""
    return [
        make_row(workload=w, batch_size=b, lora_overhead=o, **engine(loras, build), **values)
        for (w, b, loras), builds in overheads.items()
        for build, o in enumerate(builds)
    ]


def capacity_rows(max_loras: int, capacities: list[float]) -> list:
    shape = {
        "scenario": "capacity",
        "workload": "trace",
        "batch_size": None,
        "input_len": None,
        "output_len": None,
        "lora_overhead": None,
        "trace_suite": "s",
        "trace_num_adapters": 4,
        "trace_alpha": 1.0,
        "trace_cv": 1.0,
        "slo_ttft_ms": 500.0,
        "slo_tpot_ms": 50.0,
        "slo_target": 0.9,
        "search_stop": capacity.BRACKETED,
    }
    return [
        make_row(**shape, **engine(max_loras, b), capacity_rps=c, capacity_over_rps=c * 1.2)
        for b, c in enumerate(capacities)
    ]


def headline_of(tmp_path, rows) -> str:
    path = tmp_path / "run.csv"
    pd.DataFrame([asdict(r) for r in rows], columns=COLUMNS).to_csv(path, index=False)
    assert cli.main(["report", str(path), "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert page.index("<h2>Headline</h2>") < page.index("<h2>Runs</h2>"), "the headline comes first"
    return page.split("<h2>Headline</h2>")[1].split("</section>")[0]


def test_the_headline_names_the_largest_overheads_in_order_the_choice_and_the_failed_checks(tmp_path):
    overheads = {
        ("distinct", 2, 2): (1.2, 1.3),
        ("distinct", 8, 2): (3.0, 3.2),  # the largest
        ("uniform", 8, 2): (2.0, 2.1),  # third
        ("identical", 8, 2): (1.0, 2.9),  # fourth by its mean (left out), second by its top build
        ("distinct", 8, 8): (2.4, 2.7),  # second
    }
    batch = batch_rows(overheads, digest_mismatches=0)
    # loras8's second build answers one adapter's greedy probe differently.
    batch = [
        replace(r, digest_mismatches=1) if r.engine_id.startswith("loras8-rank16-cpu4-build1") else r for r in batch
    ]
    isolation = make_row(
        scenario="isolation", workload="isolation", lora_overhead=None, isolation_checked=4, isolation_broken=1
    )
    rows = [*batch, *capacity_rows(2, [10.0, 10.5]), *capacity_rows(8, [13.0, 13.4]), isolation]
    headline = headline_of(tmp_path, rows)

    named = [part.split("</b>")[0] for part in headline.split("<b>")[1:] if " bs" in part.split("</b>")[0]]
    assert named == [
        "distinct bs8 on loras2-rank16-cpu4",
        "distinct bs8 on loras8-rank16-cpu4",
        "uniform bs8 on loras2-rank16-cpu4",
    ]
    assert "3.10× (builds 3.00-3.20)" in headline and "2.55×" in headline and "identical" not in headline
    assert "href='#lora_overhead'" in headline
    assert "choose loras8-rank16-cpu4: 13.2 req/s" in headline
    assert "Failed checks: 2" in headline
    assert "OUTPUT DIGESTS MISMATCH: loras8-rank16-cpu4-build1: wrong out 1 in 1 of 1 cases" in headline
    assert "ADAPTER ISOLATION BROKEN: isolation loras2-rank16-cpu4" in headline and "1 of 4 answers" in headline


def test_the_recommendation_is_said_once_in_the_headline(tmp_path):
    rows = [*capacity_rows(2, [10.0, 10.5]), *capacity_rows(8, [13.0, 13.4])]
    headline = headline_of(tmp_path, rows)
    page = (tmp_path / "report" / "index.html").read_text()
    assert "choose loras8" in headline and page.count("choose loras8") == 1


def test_a_run_with_none_of_these_says_so_plainly(tmp_path):
    headline = headline_of(tmp_path, batch_rows({("distinct", 2, 2): (None, None)}, digest_mismatches=0))
    assert "Largest LoRA overhead</b>: none measured" in headline
    assert "Configuration to choose</b>: none recommended: no capacity search in this run" in headline
    assert "Checks</b>: no check failed: greedy output digests matched on all 2 LoRA builds" in headline
    unchecked = headline_of(tmp_path, batch_rows({("distinct", 2, 2): (1.5, 1.5)}, digest_mismatches=None))
    assert "no check failed, and none ran" in unchecked
