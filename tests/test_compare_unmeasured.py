"""A side that measured nothing is a finding, not noise: a new side on which no request of a
case finished fails the comparison (separate runs and A/B pairs), a new side that left more
of its requests unfinished fails it whatever its survivors' latencies say, and a build that
measured nothing neither adds freedom to the noise nor turns a p-value into nan."""

from __future__ import annotations

import numpy as np

from lorabench.analysis.compare import compare, load_run
from lorabench.analysis.compare.paired import compare_paired_runs
from tests.test_ab import session_runs
from tests.test_compare import copy_run, edit_run, run_cli

ONLINE_CORE = ["ttft_ms", "decode_ms", "output_tokens_per_s"]


def nothing_finished(rows):
    """Every online case as a run on which no request finished: throughput 0, no latency."""
    online = rows.scenario == "online"
    latencies = [c for c in rows.columns if c.split("_p")[0] in ("ttft_ms", "prefill_ms", "decode_ms", "e2e_ms")]
    rows.loc[online, latencies] = np.nan
    rows.loc[online, "output_tokens_per_s"] = 0.0
    return rows


def test_a_new_side_on_which_nothing_finished_fails_and_is_named(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, nothing_finished)
    assert run_cli(base, new) == 1
    out = capsys.readouterr().out
    lost = [line for line in out.splitlines() if line.startswith("NOT MEASURED ON THE NEW SIDE: ")]
    assert len(lost) == 2 and all("scenario: online" in line for line in lost), out
    assert all(
        line.endswith(
            f"{', '.join(ONLINE_CORE)} measured on the base side, on no build of the new side (did no request finish?)"
        )
        for line in lost
    )
    assert "one engine build per case" not in out, "every case has its builds: that warning would be false"
    assert "? too few builds" not in out
    # The other way round the new side measures what the base did not: nothing lost.
    assert run_cli(new, base) == 0


def test_an_ab_session_whose_new_side_finished_nothing_fails():
    base, new, order = session_runs(6)
    new.all_rows = nothing_finished(new.all_rows)
    new.rows = nothing_finished(new.rows)
    result = compare_paired_runs(base, new, order, threshold=0.05, alpha=0.05)
    assert result.failed and "2 cases no longer measured" in result.reasons()


def test_a_build_that_measured_nothing_leaves_no_nan_verdict(tmp_path, capsys):
    """One build a side measured, the base's other build finished nothing: no case has two
    draws, so nothing is tested; before, the noise counted the empty build's freedom, its
    spread was nan, and a nan p-value read as significant."""
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(base, lambda rows: rows[rows.build < 2])
    edit_run(base, lambda rows: rows.assign(output_tokens_per_s=rows.output_tokens_per_s.where(rows.build == 0, 0.0)))
    edit_run(new, lambda rows: rows[rows.build == 0].assign(output_tokens_per_s=rows.output_tokens_per_s * 2))
    result = compare(load_run(base), load_run(new))
    throughput = [f for f in result.findings if f.metric == "output_tokens_per_s"]
    assert throughput and all(f.p_value is None and f.p_adjusted is None for f in throughput)
    assert not result.regressions and not [f for f in result.findings if f.verdict == "improved"]
    assert "nan" not in capsys.readouterr().out


def aborting(left, faster=1.0):
    """Each online row with ``left`` of its 19 requests aborted at the drain, and its
    survivors' latencies ``faster`` times the base's (the slow ones were the ones aborted)."""

    def change(rows):
        online = rows.scenario == "online"
        rows.loc[online, "unfinished"] = left
        rows.loc[online, "ttft_ms"] *= faster
        rows.loc[online, "slo_attainment"] = (19 - left) / 19
        return rows

    return change


def test_more_requests_unfinished_fails_though_the_survivors_read_faster(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, aborting(3, faster=0.6))
    result = compare(load_run(base), load_run(new))
    online_ttft = [f.verdict for f in result.findings if f.metric == "ttft_ms" and f.case["scenario"] == "online"]
    assert online_ttft == ["improved", "improved"], "the survivors' TTFT alone reads as an improvement"
    assert result.failed and result.reasons() == "2 cases with more requests unfinished"
    assert run_cli(base, new) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("MORE REQUESTS UNFINISHED: ")]
    assert len(lines) == 2 and all(
        "12 of 76 requests unfinished on the new side, 0 of 76 on the base side" in ln for ln in lines
    )


def test_a_few_more_unfinished_or_fewer_are_no_finding(tmp_path):
    base, few, fewer = (copy_run(tmp_path, name) for name in ("base", "few", "fewer"))
    edit_run(base, aborting(1))
    edit_run(few, aborting(2))  # 8 of 76 against 4 of 76: Fisher's p 0.18
    assert run_cli(base, few) == 0
    edit_run(fewer, aborting(0))
    assert run_cli(base, fewer) == 0, "the new side finished more: no finding"


def test_an_ab_session_whose_new_side_aborts_more_fails():
    base, new, order = session_runs(6)
    for frame in ("all_rows", "rows"):
        rows = getattr(new, frame)
        rows.loc[rows.scenario == "online", "unfinished"] = rows.loc[rows.scenario == "online", "num_requests"] // 2
    result = compare_paired_runs(base, new, order, threshold=0.05, alpha=0.05)
    assert result.failed and "more requests unfinished" in result.reasons(), result.reasons()
