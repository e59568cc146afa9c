"""lorabench compare on a real result file (tests/data, from the default benchmark on
the CPU engine), with changes planted into copies of it."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from lorabench import cli
from lorabench.compare import (
    IMPROVED, NOT_SIGNIFICANT, REGRESSED, TOO_FEW, WITHIN, compare, find_runs, load_run, parse_thresholds,
)
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data" / "default-run.csv"
REQUEST_METRICS = ("ttft_ms", "prefill_ms", "decode_ms", "request_e2e_ms", "queue_ms")


def copy_run(tmp_path, name):
    csv = tmp_path / f"{name}.csv"
    shutil.copy(DATA, csv)
    shutil.copy(DATA.with_name(DATA.stem + ".samples.csv"), tmp_path / f"{name}.samples.csv")
    return csv


def edit_run(csv, change):
    """Apply ``change(rows, samples)`` (in place, or returning new frames) to a copied run."""
    samples_path = csv.with_name(csv.stem + ".samples.csv")
    rows, samples = pd.read_csv(csv), pd.read_csv(samples_path)
    rows, samples = change(rows, samples) or (rows, samples)
    rows.to_csv(csv, index=False)
    samples.to_csv(samples_path, index=False)


def case_mask(frame, workload="distinct", batch_size=8, max_loras=8):
    return (frame.workload == workload) & (frame.batch_size == batch_size) & (frame.max_loras == max_loras)


def slow_down(metric, factor, **case):
    """Scale ``metric`` of one case, in its row (mean and percentiles) and in its samples."""
    def change(rows, samples):
        columns = [c for c in rows.columns if c == metric or c.startswith(metric + "_p")]
        rows.loc[case_mask(rows, **case), columns] *= factor
        if metric in samples:
            samples.loc[case_mask(samples, **case), metric] *= factor
    return change


def run_cli(*args):
    return cli.main(["compare", *map(str, args)])


def verdicts(base, new, **kwargs):
    result = compare(load_run(base), load_run(new), **kwargs)
    return {(f.case["workload"], f.case["batch_size"], f.case["max_loras"], f.metric): f.verdict for f in result.findings}


def test_data_is_a_real_run_with_enough_rounds():
    rows = pd.read_csv(DATA)
    assert len(rows) == 12 and (rows.rounds >= 5).all() and rows.vllm_version.notna().all()


def test_planted_20_percent_slowdown_is_flagged(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, slow_down("decode_ms", 1.2))
    assert run_cli(base, new) == 1
    found = verdicts(base, new)
    assert found[("distinct", "8", "8", "decode_ms")] == REGRESSED
    assert [k for k, v in found.items() if v != WITHIN] == [("distinct", "8", "8", "decode_ms")]
    out = capsys.readouterr().out
    assert "REGRESSED" in out and "1 regressed" in out
    assert out.index("workload: distinct") < out.index("workload: uniform"), "worst regressions first"


def test_jitter_of_two_percent_passes(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    rng = np.random.default_rng(0)

    def jitter(rows, samples):
        metric_columns = [c for c in rows.columns if c.split("_p")[0] in (*REQUEST_METRICS, "e2e_ms", "output_tokens_per_s")]
        rows[metric_columns] *= rng.uniform(0.98, 1.02, size=(len(rows), len(metric_columns)))
        for column in (*REQUEST_METRICS, "batch_e2e_ms"):
            samples[column] *= rng.uniform(0.98, 1.02, size=len(samples))

    edit_run(new, jitter)
    assert run_cli(base, new) == 0
    assert set(verdicts(base, new).values()) == {WITHIN}
    assert "0 regressed, 0 improved" in capsys.readouterr().out


def test_throughput_direction(tmp_path):
    base, faster, slower = copy_run(tmp_path, "base"), copy_run(tmp_path, "faster"), copy_run(tmp_path, "slower")
    edit_run(faster, slow_down("batch_e2e_ms", 1 / 1.25))
    edit_run(faster, slow_down("e2e_ms", 1 / 1.25))
    edit_run(faster, slow_down("output_tokens_per_s", 1.25))
    key = ("distinct", "8", "8")
    assert verdicts(base, faster)[(*key, "output_tokens_per_s")] == IMPROVED
    assert verdicts(base, faster)[(*key, "e2e_ms")] == IMPROVED
    assert run_cli(base, faster) == 0
    edit_run(slower, slow_down("batch_e2e_ms", 1.25))
    edit_run(slower, slow_down("e2e_ms", 1.25))
    edit_run(slower, slow_down("output_tokens_per_s", 1 / 1.25))
    assert verdicts(base, slower)[(*key, "output_tokens_per_s")] == REGRESSED
    assert run_cli(base, slower) == 1


def test_unmatched_cases_are_listed_not_dropped(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")

    def reshape(rows, samples):
        rows.loc[case_mask(rows, "identical", 8, 2), "output_len"] = 32
        return rows[~case_mask(rows, "uniform", 4, 2)], samples

    edit_run(new, reshape)
    run_cli(base, new)
    out = capsys.readouterr().out
    assert "only in base: uniform multilora loras2-rank16-cpu8 bs4 in64 out16" in out
    assert "only in base: identical multilora loras2-rank16-cpu8 bs8 in64 out16" in out
    assert "only in new: identical multilora loras2-rank16-cpu8 bs8 in64 out32" in out
    assert "10 cases compared" in out


def test_threshold_overrides(tmp_path):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, slow_down("decode_ms", 1.2))
    assert run_cli(base, new, "--threshold", "decode_ms=25%") == 0
    assert run_cli(base, new, "--threshold", "30", "--threshold", "decode_ms=15%") == 1
    assert parse_thresholds(["5%", "ttft_ms=1.5"]) == (0.05, {"ttft_ms": 0.015})


def test_too_few_rounds_or_no_samples_is_said_and_never_fails(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, slow_down("decode_ms", 1.5))
    edit_run(new, lambda rows, samples: (rows, samples[samples["round"] < 2]))
    assert verdicts(base, new)[("distinct", "8", "8", "decode_ms")] == TOO_FEW
    assert run_cli(base, new) == 0
    new.with_name("new.samples.csv").unlink()
    assert run_cli(base, new) == 0
    out = capsys.readouterr().out
    assert "? too few samples" in out and "raw samples missing for one run" in out


def test_noisy_change_is_marked_not_significant(tmp_path):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")

    def one_slow_round(rows, samples):
        rows.loc[case_mask(rows), "ttft_ms"] *= 1.3
        samples.loc[case_mask(samples) & (samples["round"] == 0), "ttft_ms"] *= 2.5

    edit_run(new, one_slow_round)
    assert verdicts(base, new)[("distinct", "8", "8", "ttft_ms")] == NOT_SIGNIFICANT


def test_provenance_differences_are_warned(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")

    def other_host(rows, samples):
        rows["hostname"] = "npu-node-7"
        rows["vllm_version"] = "0.99.0"

    edit_run(new, other_host)
    run_cli(base, new)
    out = capsys.readouterr().out
    assert "WARNING: hostname differs:" in out and "-> npu-node-7" in out
    assert "WARNING: vllm_version differs:" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("a,b\n1,2\n", "not a lorabench result file: missing columns"),
        ("", "not a CSV file"),
    ],
    ids=["missing", "foreign", "empty"],
)
def test_bad_input_exits_2(tmp_path, capsys, content, message):
    other = tmp_path / "other.csv"
    if content is not None:
        other.write_text(content)
    assert run_cli(copy_run(tmp_path, "base"), other) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_no_case_in_common_and_bad_threshold_exit_2(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, lambda rows, samples: rows.__setitem__("model", "Llama-2-7b-hf"))
    assert run_cli(base, new) == 2
    assert "no case in common" in capsys.readouterr().err
    assert run_cli(base, base, "--threshold", "fast") == 2
    assert run_cli(base, base, "--threshold", "tpot=5%") == 2
    assert "unknown metric 'tpot'" in capsys.readouterr().err


def test_results_dir_picks_the_latest_run_of_each_commit(tmp_path, capsys):
    first, second = copy_run(tmp_path, "a"), copy_run(tmp_path, "b")
    edit_run(second, lambda rows, samples: rows.__setitem__("timestamp", "2099-01-01T00:00:00Z"))
    commit = pd.read_csv(first)["git_commit"].iloc[0]
    assert find_runs(tmp_path, commit[:7]) == [second]
    assert find_runs(tmp_path, commit[:7], all_runs=True) == [first, second]
    assert run_cli(commit[:7], commit[:10], "--results-dir", tmp_path) == 0
    assert run_cli("deadbeef", commit[:7], "--results-dir", tmp_path) == 2
    assert "no result file of a commit starting with 'deadbeef'" in capsys.readouterr().err


def test_formats_and_plot(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, slow_down("decode_ms", 1.2))
    assert run_cli(base, new, "--format", "json", "--plot", tmp_path / "ratios.png") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["regressions"] == 1 and len(report["findings"]) == 12 * 5
    assert (tmp_path / "ratios.png").read_bytes()[:4] == b"\x89PNG"
    run_cli(base, new, "--format", "csv")
    table = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert (table.verdict == REGRESSED).sum() == 1
    run_cli(base, new, "--format", "markdown")
    assert "| case | metric | base | new | ratio | change | p | verdict |" in capsys.readouterr().out


def scale_everything(factor):
    """A whole engine build running ``factor`` times slower: every latency up, throughput down."""
    def change(rows, samples):
        for metric in (*REQUEST_METRICS, "e2e_ms"):
            columns = [c for c in rows.columns if c == metric or c.startswith(metric + "_p")]
            rows[columns] *= factor
        rows["output_tokens_per_s"] /= factor
        for column in (*REQUEST_METRICS, "batch_e2e_ms"):
            samples[column] *= factor
    return change


def test_pooled_runs_count_build_to_build_offsets_as_noise(tmp_path):
    runs = {}
    for name, factor in (("base1", 1.0), ("base2", 1.12), ("new1", 1.04), ("new2", 1.15)):
        runs[name] = copy_run(tmp_path, name)
        edit_run(runs[name], scale_everything(factor))
    single = verdicts(runs["base1"], runs["new2"])
    assert REGRESSED in single.values(), "one build against another: the offset looks like a regression"
    pooled = verdicts([runs["base1"], runs["base2"]], [runs["new1"], runs["new2"]])
    assert REGRESSED not in pooled.values() and IMPROVED not in pooled.values()
    assert run_cli(f"{runs['base1']},{runs['base2']}", f"{runs['new1']},{runs['new2']}") == 0


def test_pooled_runs_still_catch_a_real_slowdown(tmp_path, capsys):
    runs = {}
    for name, factor in (("base1", 1.0), ("base2", 1.12), ("new1", 1.35), ("new2", 1.45)):
        runs[name] = copy_run(tmp_path, name)
        edit_run(runs[name], scale_everything(factor))
    pooled = verdicts([runs["base1"], runs["base2"]], [runs["new1"], runs["new2"]])
    assert {v for k, v in pooled.items() if k[3] == "e2e_ms"} == {REGRESSED}
    assert run_cli(f"{runs['base1']},{runs['base2']}", f"{runs['new1']},{runs['new2']}") == 1
    assert "(2 runs)" in capsys.readouterr().out
