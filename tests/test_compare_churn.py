"""lorabench compare on churn cases: the load and unload medians and the TTFT ratio judged
like the other metrics, failed operations on the new side failing the comparison, and
files from before the churn columns compared on what they have. The churn rows are the
real runs' online rows (tests/data) turned into churn cases, with churn figures drawn 10 %
apart between builds, as the builds of a real run spread."""

import json

import numpy as np
import pandas as pd

from lorabench.analysis.compare import IMPROVED, REGRESSED, compare, load_run
from tests.test_compare import DATA, DATA2, copy_run, run_cli

# Typical medians of the CPU build (ms) and a ratio of loads holding the traffic back.
CHURN = {"load_ms_p50": 8.0, "unload_ms_p50": 2.0, "ttft_load_ratio": 1.3}
OPS = 6  # per build: a 3 s trace at 2 operations a second


def churn_run(tmp_path, name, source=DATA, seed=0, failed=0, **factors):
    """``source`` with a churn case beside each online case (same trace and builds): its
    churn figures drawn around ``CHURN`` times ``factors``, ``failed`` of its operations
    failed on every build (a list: per row)."""
    rows = pd.read_csv(source)
    churn = rows[rows.scenario == "online"].copy()
    rng = np.random.default_rng(seed)
    churn["scenario"], churn["churn_rate"], churn["churn_adapters"] = "churn", 2.0, 2
    churn["churn_ops"], churn["churn_failed_ops"] = OPS, failed
    for metric, value in CHURN.items():
        churn[metric] = value * factors.get(metric, 1.0) * np.exp(rng.normal(0, 0.1, len(churn)))
    csv = tmp_path / f"{name}.csv"
    pd.concat([rows, churn], ignore_index=True).to_csv(csv, index=False)
    return csv


def churn_verdicts(base, new):
    result = compare(load_run(base), load_run(new))
    return {(f.case["max_loras"], f.metric): f.verdict for f in result.findings if f.case["scenario"] == "churn"}


def test_slower_loads_are_a_regression(tmp_path, capsys):
    base, same = churn_run(tmp_path, "base"), churn_run(tmp_path, "same", DATA2, seed=1)
    assert not {REGRESSED, IMPROVED} & set(churn_verdicts(base, same).values()), "builds 10 % apart: no change"
    assert run_cli(base, same) == 0
    slow = churn_run(tmp_path, "slow", DATA2, seed=1, load_ms_p50=2.0)
    found = churn_verdicts(base, slow)
    assert {found[(engine, "load_ms_p50")] for engine in ("2", "8")} == {REGRESSED}
    assert not {REGRESSED, IMPROVED} & {v for (_, metric), v in found.items() if metric != "load_ms_p50"}
    capsys.readouterr()
    assert run_cli(base, slow) == 1
    out = capsys.readouterr().out
    assert "noise between engine builds (sd of one build): " in out and "load_ms_p50 " in out
    assert "churn loras2-rank16-cpu8 skew" in out and " churn2" in out, "the case names its churn rate"


def test_cheaper_unloads_and_loads_that_no_longer_hold_traffic_back_are_improvements(tmp_path):
    base = churn_run(tmp_path, "base")
    better = churn_run(tmp_path, "better", DATA2, seed=1, unload_ms_p50=0.5, ttft_load_ratio=0.77)
    found = churn_verdicts(base, better)
    assert {found[(e, m)] for e in ("2", "8") for m in ("unload_ms_p50", "ttft_load_ratio")} == {IMPROVED}
    assert not {REGRESSED, IMPROVED} & {found[(e, "load_ms_p50")] for e in ("2", "8")}
    assert run_cli(base, better) == 0


def test_failed_operations_on_the_new_side_fail_the_comparison(tmp_path, capsys):
    """Failed operations leave the latencies of the ones that worked: as fast as ever. Only
    the count says so, and only the new side's fails a gate (the base's is history)."""
    base = churn_run(tmp_path, "base")
    failing = [0] * 7 + [2]  # one build of one configuration: 2 of its 6 operations failed
    new = churn_run(tmp_path, "new", DATA2, seed=1, failed=failing)
    assert run_cli(base, new) == 1
    out = capsys.readouterr().out
    assert "0 regressed" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("CHURN OPERATIONS FAILED")]
    assert "scenario: churn" in line and "max_loras: 8" in line
    assert f"2 of {4 * OPS} loads and unloads failed on the new side (base: 0 of {4 * OPS})" in line
    assert run_cli(base, new, "--format", "json") == 1
    assert json.loads(capsys.readouterr().out)["churn_failures"] == [line]
    assert run_cli(base, new, "--format", "markdown") == 1
    assert f"- {line}" in capsys.readouterr().out
    assert run_cli(new, base) == 0, "failures on the base side only: the new side fixed them"


def test_files_without_the_churn_columns_still_compare(tmp_path, capsys):
    old = copy_run(tmp_path, "old")
    assert not {"churn_failed_ops", *CHURN} & set(pd.read_csv(old).columns)
    new = churn_run(tmp_path, "new", DATA2, seed=1)
    for base, other in ((old, new), (new, old)):
        result = compare(load_run(base), load_run(other))
        assert result.findings and not {f.metric for f in result.findings} & set(CHURN) and not result.failed
        assert [c["scenario"] for c in result.only_base + result.only_new] == ["churn", "churn"]
    capsys.readouterr()
    assert run_cli(old, new) == 0
    assert "only in new: trace churn loras2-rank16-cpu8 skew" in capsys.readouterr().out


def test_what_fails_a_comparison_is_counted_by_kind():
    from lorabench.analysis.compare.analysis import Comparison

    clean = Comparison(None, None, findings=[])
    assert clean.reasons() == "" and not clean.failed
    collapsed = Comparison(None, None, findings=[], capacity_collapses=["c"], churn_failures=["a", "b"])
    assert collapsed.failed
    assert collapsed.reasons() == "1 capacity collapsed, 2 churn cases with failed operations"
