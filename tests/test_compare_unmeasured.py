"""A side that measured nothing is a finding, not noise: a new side on which no request of a
case finished fails the comparison (separate runs and A/B pairs), and a build that measured
nothing neither adds freedom to the noise nor turns a p-value into nan."""

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
