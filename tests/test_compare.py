"""lorabench compare on real result files (tests/data: two runs of the default benchmark
on the CPU engine, same code, back to back), with changes planted into copies of them."""

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lorabench.analysis.compare import (
    IMPROVED,
    NOT_SIGNIFICANT,
    REGRESSED,
    TOO_FEW,
    WITHIN,
    compare,
    find_runs,
    load_run,
    parse_thresholds,
)
from lorabench.analysis.compare.noise import benjamini_hochberg, t_ppf, t_sf
from lorabench.cli import main as cli
from tests.helpers import ROOT

DATA = ROOT / "tests" / "data" / "default-run.csv"
DATA2 = ROOT / "tests" / "data" / "default-run-2.csv"
LATENCIES = ("ttft_ms", "prefill_ms", "decode_ms", "e2e_ms", "request_e2e_ms", "queue_ms")


def copy_run(tmp_path, name, source=DATA):
    csv = tmp_path / f"{name}.csv"
    shutil.copy(source, csv)
    return csv


def edit_run(csv, change):
    """Apply ``change(rows)`` (in place, or returning a new frame) to a copied run."""
    rows = pd.read_csv(csv)
    rows = change(rows)
    rows.to_csv(csv, index=False)


def batch(rows):
    return rows.scenario != "online"


def case_mask(rows, workload="distinct", batch_size=8, max_loras=8):
    return (rows.workload == workload) & (rows.batch_size == batch_size) & (rows.max_loras == max_loras)


def scale(metric, factor, where=batch):
    """Multiply ``metric`` (its mean and percentiles) in the rows ``where`` selects."""

    def change(rows):
        columns = [c for c in rows.columns if c == metric or c.startswith(metric + "_p")]
        rows.loc[where(rows), columns] *= factor
        return rows

    return change


def slower(factor, where=batch):
    """Everything ``factor`` times slower: every latency up, throughput down."""

    def change(rows):
        for metric in LATENCIES:
            rows = scale(metric, factor, where)(rows)
        return scale("output_tokens_per_s", 1 / factor, where)(rows)

    return change


def set_columns(**values):
    def change(rows):
        for column, value in values.items():
            rows[column] = value
        return rows

    return change


def run_cli(*args):
    return cli.main(["compare", *map(str, args)])


def verdicts(base, new, **kwargs):
    result = compare(load_run(base), load_run(new), **kwargs)
    return {
        (f.case["workload"], f.case["batch_size"], f.case["max_loras"], f.metric): f.verdict for f in result.findings
    }


BUILDS = pd.read_csv(DATA)["build"].nunique()


def test_data_is_a_real_run_with_several_builds_per_configuration():
    rows = pd.read_csv(DATA)
    assert rows["run_id"].nunique() == 1 and rows.vllm_version.notna().all()
    assert set(rows.scenario) == {"multilora", "online"}
    per_case = rows.groupby(["scenario", "workload", "batch_size", "max_loras"])["build"].apply(sorted)
    assert BUILDS >= 2 and (per_case.map(tuple) == tuple(range(BUILDS))).all()


def test_two_real_runs_of_the_same_code_flag_nothing(capsys):
    assert run_cli(DATA, DATA2) == 0
    assert not {REGRESSED, IMPROVED} & set(verdicts(DATA, DATA2).values())
    assert "0 regressed, 0 improved" in capsys.readouterr().out


def test_planted_slowdown_is_flagged_against_the_noise_between_runs(tmp_path, capsys):
    """Slower decode in every batch case. Against this machine's noise (about 10 % per
    build) the builds of one run a side cannot tell 20 % from noise, and say so. With two
    runs a side each run's mean is one draw (df 2: drift between runs counts as noise):
    20 % is not enough either, 50 % is flagged, and nothing else."""
    base = [copy_run(tmp_path, "base1"), copy_run(tmp_path, "base2", DATA2)]
    new = [copy_run(tmp_path, "new1"), copy_run(tmp_path, "new2", DATA2)]
    for csv in new:
        edit_run(csv, scale("decode_ms", 1.2))
    single = compare(load_run(base[0]), load_run(new[0]))
    assert {f.verdict for f in single.findings if f.metric == "decode_ms" and f.case["workload"] != "trace"} == {
        NOT_SIGNIFICANT
    }
    assert single.detectable_pct["decode_ms"][1] > 10
    assert "assume no drift between runs" in "\n".join(single.notes)
    pooled = compare(load_run(base), load_run(new))
    assert pooled.noise["decode_ms"].df == 2 and not pooled.regressions
    for csv in new:
        edit_run(csv, scale("decode_ms", 1.5 / 1.2))

    assert run_cli(",".join(map(str, base)), ",".join(map(str, new))) == 1
    found = verdicts(base, new)
    flagged = {k for k, v in found.items() if v != WITHIN}
    assert flagged == {k for k in found if k[3] == "decode_ms" and k[0] != "trace"}
    assert {found[k] for k in flagged} == {REGRESSED}
    out = capsys.readouterr().out
    assert "REGRESSED" in out and "12 regressed, 0 improved" in out
    assert out.index("workload: distinct") < out.index("workload: trace"), "worst regressions first"


def test_jitter_of_two_percent_passes(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    rng = np.random.default_rng(0)

    def jitter(rows):
        columns = [c for c in rows.columns if c.split("_p")[0] in (*LATENCIES, "output_tokens_per_s")]
        rows[columns] *= rng.uniform(0.98, 1.02, size=(len(rows), len(columns)))
        return rows

    edit_run(new, jitter)
    assert run_cli(base, new) == 0
    assert set(verdicts(base, new).values()) == {WITHIN}
    assert "0 regressed, 0 improved" in capsys.readouterr().out


def test_throughput_direction(tmp_path):
    base, faster, slow = copy_run(tmp_path, "base"), copy_run(tmp_path, "faster"), copy_run(tmp_path, "slower")
    edit_run(faster, slower(1 / 1.3))
    key = ("distinct", "8", "8")
    assert verdicts(base, faster)[(*key, "output_tokens_per_s")] == IMPROVED
    assert verdicts(base, faster)[(*key, "e2e_ms")] == IMPROVED
    assert run_cli(base, faster) == 0
    edit_run(slow, slower(1.3))
    assert verdicts(base, slow)[(*key, "output_tokens_per_s")] == REGRESSED
    assert verdicts(base, slow)[(*key, "e2e_ms")] == REGRESSED
    assert run_cli(base, slow) == 1


def test_unmatched_cases_are_listed_not_dropped(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")

    def reshape(rows):
        rows.loc[case_mask(rows, "identical", 8, 2), "output_len"] = 32
        return rows[~case_mask(rows, "uniform", 4, 2)]

    edit_run(new, reshape)
    run_cli(base, new)
    out = capsys.readouterr().out
    assert "only in base: uniform multilora loras2-rank16-cpu8 bs4 in64 out16" in out
    assert "only in base: identical multilora loras2-rank16-cpu8 bs8 in64 out16" in out
    assert "only in new: identical multilora loras2-rank16-cpu8 bs8 in64 out32" in out
    assert "12 cases compared" in out  # 14 less the two


def test_threshold_overrides(tmp_path):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, scale("decode_ms", 1.5))
    assert run_cli(base, new) == 1
    assert run_cli(base, new, "--threshold", "decode_ms=55%") == 0
    assert run_cli(base, new, "--threshold", "60", "--threshold", "decode_ms=15%") == 1
    assert parse_thresholds(["5%", "ttft_ms=1.5"]) == (0.05, {"ttft_ms": 0.015})


def test_one_build_a_side_is_said_and_never_fails(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(base, lambda rows: rows[rows.build == 0])
    edit_run(new, lambda rows: slower(1.5)(rows[rows.build == 0].copy()))
    assert verdicts(base, new)[("distinct", "8", "8", "e2e_ms")] == TOO_FEW
    assert run_cli(base, new) == 0
    out = capsys.readouterr().out
    assert "? too few builds" in out and "WARNING: one engine build per case on each side" in out


def test_one_slow_build_is_not_a_significant_change(tmp_path):
    """One build of a case 60 % slower moves the mean past the threshold, but the other
    build disagrees: that is what build-to-build noise looks like, not a change."""
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, scale("ttft_ms", 1.6, lambda rows: case_mask(rows) & (rows.build == 0)))
    assert verdicts(base, new)[("distinct", "8", "8", "ttft_ms")] == NOT_SIGNIFICANT
    assert run_cli(base, new) == 0


def test_provenance_differences_are_warned(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, set_columns(hostname="npu-node-7", vllm_version="0.99.0"))
    run_cli(base, new)
    out = capsys.readouterr().out
    assert "WARNING: hostname differs:" in out and "-> npu-node-7" in out
    assert "WARNING: vllm_version differs:" in out


def keep_config(csv, config):
    (csv.with_suffix(".logs")).mkdir(exist_ok=True)
    (csv.with_suffix(".logs") / "config.json").write_text(json.dumps(config))


def test_settings_the_runs_were_configured_apart_in_are_named_and_where_to_nothing(tmp_path, capsys):
    """Settings outside the case key (max_num_seqs, warm-up rounds, the KV cache's size)
    move every latency: a comparison names each that differs, and none that cannot
    change a figure (where results went, comments)."""
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    config = json.loads((ROOT / "config" / "common.json").read_text())
    keep_config(base, config)
    run_cli(base, new)
    assert "configs differ" not in capsys.readouterr().out, "one side kept no config: nothing to say"
    # Comments anywhere, inside a list too (the imported-trace config comments a suite so).
    online = {**config["online"], "suites": [{"//": "another note", **s} for s in config["online"]["suites"]]}
    keep_config(new, {**config, "results_dir": "elsewhere", "//": "another comment", "online": online})
    run_cli(base, new)
    assert "configs differ" not in capsys.readouterr().out
    engine = {**config["engine"], "max_num_seqs": 256}
    matrix = {**config["matrix"], "warmup_rounds": 0}
    keep_config(new, {**config, "engine": engine, "matrix": matrix, "env": {}})
    assert run_cli(base, new) == 0, "a warning, not a finding"
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "configs differ" in line]
    assert line.startswith("WARNING: ") and line.endswith(
        'engine.max_num_seqs: 16 -> 256; env.VLLM_CPU_KVCACHE_SPACE: "1" -> -; matrix.warmup_rounds: 1 -> 0'
    )


def test_a_side_that_ran_beside_neighbours_in_a_fleet_is_warned_once(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    run_cli(base, new)
    assert "fleet" not in capsys.readouterr().out  # the files have no fleet columns: two sequential runs
    edit_run(new, set_columns(fleet_devices="cpu 0", fleet_neighbours="loras2-rank16-cpu12-build0"))
    run_cli(base, new)
    out = capsys.readouterr().out
    assert out.count("WARNING: new ran in a fleet, beside other configurations on its node, and the other side") == 1
    assert "fleet_devices differs" not in out and "fleet_neighbours differs" not in out
    edit_run(base, set_columns(fleet_devices="cpu 1", fleet_neighbours=""))
    run_cli(base, new)
    assert "WARNING: new ran in a fleet" in capsys.readouterr().out  # a fleet of one slot ran beside nobody


def test_driver_and_toolkit_differences_are_warned(tmp_path, capsys):
    """An NPU driver or CANN upgrade between two runs can explain a change by itself."""
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(base, set_columns(toolkit_version="8.0.RC3", driver_version="24.1.rc2", firmware_version="7.5.0.1.129"))
    edit_run(new, set_columns(toolkit_version="8.1.RC1", driver_version="24.1.rc2", firmware_version="7.7.0.1.231"))
    run_cli(base, new)
    out = capsys.readouterr().out
    assert "WARNING: toolkit_version differs: 8.0.RC3 -> 8.1.RC1" in out
    assert "WARNING: firmware_version differs: 7.5.0.1.129 -> 7.7.0.1.231" in out
    assert "driver_version differs" not in out


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
    edit_run(new, set_columns(model="Llama-2-7b-hf"))
    assert run_cli(base, new) == 2
    assert "no case in common" in capsys.readouterr().err
    assert run_cli(base, base, "--threshold", "fast") == 2
    assert run_cli(base, base, "--threshold", "tpot=5%") == 2
    assert run_cli(base, base, "--threshold", "nan") == 2 and run_cli(base, base, "--threshold", "e2e_ms=inf%") == 2
    assert run_cli(base, base, "--threshold", "-5%") == 2
    assert "unknown metric 'tpot'" in capsys.readouterr().err
    assert run_cli(base, base, "--alpha", "2") == 2
    assert "--alpha 2.0: a significance level lies between 0 and 1" in capsys.readouterr().err


def test_results_dir_picks_the_latest_run_of_each_commit(tmp_path, capsys):
    first, second = copy_run(tmp_path, "a"), copy_run(tmp_path, "b")
    edit_run(second, set_columns(timestamp="2099-01-01T00:00:00Z"))
    commit = pd.read_csv(first)["git_commit"].iloc[0]
    assert find_runs(tmp_path, commit[:7]) == [second]
    assert find_runs(tmp_path, commit[:7], all_runs=True) == [first, second]
    assert run_cli(commit[:7], commit[:10], "--results-dir", tmp_path) == 0
    assert run_cli("deadbeef", commit[:7], "--results-dir", tmp_path) == 2
    assert "no result file of a commit starting with 'deadbeef'" in capsys.readouterr().err


def test_a_fixed_file_holding_several_runs_is_read_as_its_latest_run(tmp_path):
    """--bench-output appends every run to one file: its run_id tells them apart."""
    base, both = copy_run(tmp_path, "base"), tmp_path / "both.csv"
    first = pd.read_csv(DATA)
    second = slower(1.5)(first.copy())
    second["run_id"], second["timestamp"] = "later-run", "2099-01-01T00:00:00Z"
    pd.concat([first, second]).to_csv(both, index=False)
    run = load_run(both)
    assert set(run.all_rows["run_id"]) == {"later-run"} and len(run.all_rows) == len(first)
    assert run_cli(base, both) == 1


def test_formats_and_plot(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, scale("decode_ms", 1.5))
    assert run_cli(base, new, "--format", "json", "--plot", tmp_path / "ratios.png") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["regressions"] == 12 and len(report["findings"]) == 12 * 5 + 2 * 3  # online: no prefill, no batch e2e
    assert report["noise"]["decode_ms"] | {"sd_pct": 0} == {
        "sd_pct": 0,
        "df": 8 * (BUILDS - 1),
        "draws": BUILDS,
        "level": "engine builds (sd of one build)",
    }
    assert (tmp_path / "ratios.png").read_bytes()[:4] == b"\x89PNG"
    run_cli(base, new, "--format", "csv")
    table = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert (table.verdict == REGRESSED).sum() == 12
    assert table["p_adjusted"].ge(table["p_value"]).all()
    run_cli(base, new, "--format", "markdown")
    out = capsys.readouterr().out
    assert "| case | metric | base | new | ratio | change | p (BH) | verdict |" in out
    assert "noise between engine builds (sd of one build): ttft_ms " in out and "decode_ms" in out
    assert "one run a side: verdicts assume no drift between runs" in out


def test_pooled_runs_are_tested_on_run_means(tmp_path, capsys):
    runs = {}
    for name, factor in (("base1", 1.0), ("base2", 1.03), ("new1", 1.35), ("new2", 1.4)):
        runs[name] = copy_run(tmp_path, name)
        edit_run(runs[name], slower(factor))
    single, pooled = (
        compare(load_run(runs["base1"]), load_run(runs["new1"])),
        compare(load_run([runs["base1"], runs["base2"]]), load_run([runs["new1"], runs["new2"]])),
    )
    # One run a side: 4 engine configurations (2 batch, 2 online) on each of 2 sides, each
    # giving builds - 1. Two runs a side: each run's mean is a draw, runs - 1 a side.
    assert (single.noise["decode_ms"].df, pooled.noise["decode_ms"].df) == (8 * (BUILDS - 1), 2)
    assert pooled.noise["decode_ms"].level.startswith("runs") and "drift between runs counts" in pooled.notes[0]
    assert {f.verdict for f in pooled.findings if f.metric == "e2e_ms" and f.case["workload"] != "trace"} == {REGRESSED}
    assert run_cli(f"{runs['base1']},{runs['base2']}", f"{runs['new1']},{runs['new2']}") == 1
    assert "(2 runs)" in capsys.readouterr().out


def simulated_run(name, rng, build_sd, factor=1.0):
    """The real file with a fresh random speed per engine build (shared by all its cases,
    as on the machine) and a little per-case noise: a run of the same code, or of one
    ``factor`` times slower. Loaded from memory, as if from the file ``name``: the property
    test makes 180 runs, and writing and parsing each took a third of its time (reading
    files is tested above)."""
    rows = real_run()
    builds, columns = _simulated_parts()
    # The same draws as one per build in order of appearance, then one per row.
    offset = rng.lognormal(0, build_sd, builds.max() + 1)[builds]
    speed = offset * rng.lognormal(0, 0.02, len(rows)) * factor
    rows[columns] = rows[columns].to_numpy() * speed[:, None]  # one assignment: the property test makes 180 runs
    rows["output_tokens_per_s"] /= speed
    return load_run(Path(name), [rows])


@functools.cache
def _simulated_parts():
    """Each row's engine build (its index in order of appearance) and the latency columns:
    the same for every simulated run, worked out once (a quarter of each run's time here)."""
    rows = _real_run()
    online = rows.scenario.eq("online").map({True: "-online", False: ""})
    builds, _ = pd.factorize(rows.max_loras.astype(str) + online + "/" + rows.build.astype(str))
    return builds, [c for metric in LATENCIES for c in rows.columns if c == metric or c.startswith(metric + "_p")]


@functools.cache
def _real_run():
    return pd.read_csv(DATA)


def real_run():
    """A fresh copy of the real run's rows, read from disk once."""
    return _real_run().copy()


def test_same_code_flags_nothing_at_the_stated_rate_and_a_slowdown_is_caught():
    """The property the design rests on: with builds 10 % apart (sd) and the cases of a
    build moving together, two same-code runs flag anything in about alpha of trials,
    and a 60 % slower machine is caught in nearly all.

    How many trials: 40 same-code comparisons may flag at most 4 (10 %): a compare that
    flagged noise in 20 % of them would still pass 8 % of the time, in 25 % of them 1.6 %.
    The 60 % slowdown is judged on 20 of the same base runs and must be caught in 18: a
    compare with 70 % power passes 3.5 % of the time. (It was 60 trials of both, at 12 %
    and 90 %; about as sharp, for half the comparisons. The seeded draws give 0 and 20.)"""
    rng = np.random.default_rng(1)
    same_trials, slow_trials, false_flags, caught = 40, 20, 0, 0
    for trial in range(same_trials):
        base = simulated_run("base.csv", rng, 0.1)
        same = compare(base, simulated_run("same.csv", rng, 0.1))
        false_flags += any(f.verdict in (REGRESSED, IMPROVED) for f in same.findings)
        if trial < slow_trials:
            slow = compare(base, simulated_run("slow.csv", rng, 0.1, factor=1.6))
            caught += bool(slow.regressions)
    assert false_flags <= 0.1 * same_trials, f"{false_flags} of {same_trials} same-code comparisons flagged something"
    assert caught >= 0.9 * slow_trials, f"a 60 % slowdown was caught in only {caught} of {slow_trials}"


def write_digests(csv, digests):
    """A digests file beside ``csv`` for its run: ``{adapter: digest}`` on two builds."""
    run_id = pd.read_csv(csv)["run_id"].iloc[-1]
    rows = [
        {
            "run_id": run_id,
            "model": "builtin:tiny-llama",
            "device_type": "cpu",
            "engine_id": f"e-build{b}",
            "build": b,
            "adapter": adapter,
            "adapter_rank": 8,
            "digest": value,
            "base_digest": "0000",
        }
        for b in (0, 1)
        for adapter, value in digests.items()
    ]
    pd.DataFrame(rows).to_csv(csv.with_name(csv.stem + ".digests.csv"), index=False)


def test_an_adapter_whose_output_changed_between_runs_fails_the_comparison(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    write_digests(base, {"a": "1111", "b": "2222"})
    write_digests(new, {"a": "1111", "b": "2222"})
    assert run_cli(base, new) == 0
    write_digests(new, {"a": "1111", "b": "3333"})
    assert run_cli(base, new) == 1
    out = capsys.readouterr().out
    assert "OUTPUT CHANGED: adapter b (builtin:tiny-llama) answers the greedy probe differently: 2222 -> 3333" in out
    assert "adapter a " not in out
    assert "outputs not compared" not in out
    # The new side's digests left behind: unchecked is said, not passed as unchanged.
    new.with_name(new.stem + ".digests.csv").unlink()
    assert run_cli(base, new) == 0
    assert (
        "WARNING: the base side recorded its adapters' greedy-output digests and the new side none"
        in capsys.readouterr().out
    )


def test_lora_overhead_is_compared_and_can_be_gated_on(tmp_path):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    multilora = lambda rows: rows.scenario == "multilora"  # noqa: E731
    for csv in (base, new):
        edit_run(csv, lambda rows: rows.assign(lora_overhead=np.where(multilora(rows), rows["e2e_ms"] / 100, np.nan)))
    edit_run(new, scale("lora_overhead", 1.6, where=multilora))
    found = verdicts(base, new)
    overhead = {k: v for k, v in found.items() if k[3] == "lora_overhead"}
    assert overhead and set(overhead.values()) == {REGRESSED}
    assert not any(k[3] == "lora_overhead" and k[0] == "none" for k in found), "no-LoRA rows carry no overhead"
    assert run_cli(base, new, "--threshold", "lora_overhead=100%") == 0


def test_the_comparison_as_a_page(tmp_path, capsys):
    base, new = copy_run(tmp_path, "base"), copy_run(tmp_path, "new")
    edit_run(new, scale("decode_ms", 1.5))
    assert run_cli(base, new, "--report", tmp_path / "cmp") == 1
    page = (tmp_path / "cmp" / "index.html").read_text()
    assert (tmp_path / "cmp" / "ratios.png").stat().st_size > 0 and "src='ratios.png'" in page
    assert page.count("<tr class='regressed'>") == 12, "every regressed case-metric, marked"
    assert "noise between engine builds" in page


def drifted_runs(tmp_path, factors, commit="aaa"):
    """Runs of one commit whose every case drifted by a factor: what separate runs on a
    shared machine look like."""
    tmp_path.mkdir(exist_ok=True)
    runs = []
    for i, factor in enumerate(factors):
        csv = copy_run(tmp_path, f"{commit}-{i}", DATA if i % 2 == 0 else DATA2)
        edit_run(csv, slower(factor))
        edit_run(csv, set_columns(git_commit=commit, timestamp=f"2026-11-2{i}T00:00:00Z", run_id=f"{commit}-{i}"))
        runs.append(csv)
    return runs


def test_a_noise_floor_from_earlier_runs_keeps_drift_from_being_called_a_change(tmp_path, capsys):
    base = copy_run(tmp_path, "base")
    new = copy_run(tmp_path, "new", DATA2)
    edit_run(new, slower(1.3))  # the whole machine 30 % slower: drift, or a change?
    assert run_cli(base, new) == 1
    assert "verdicts assume no drift between runs" in capsys.readouterr().out
    earlier = drifted_runs(tmp_path / "earlier", [1.0, 1.25, 0.8, 1.1])
    assert run_cli(base, new, "--noise-from", tmp_path / "earlier") == 0
    out = capsys.readouterr().out
    assert "noise no smaller than the spread of 4 earlier runs of one commit" in out
    assert "noise between runs, floor from 4 earlier runs of one commit" in out
    assert run_cli(base, new, "--noise-from", earlier[0]) == 2
    assert "needs at least 2 runs of one commit" in capsys.readouterr().err


def test_results_dir_takes_the_floor_from_every_run_of_the_base_commit(tmp_path, capsys):
    drifted_runs(tmp_path, [1.0, 1.25, 0.8], commit="aaa")
    drifted_runs(tmp_path, [1.3], commit="bbb")
    assert run_cli("aaa", "bbb", "--results-dir", tmp_path) == 0
    assert "spread of 3 earlier runs of one commit" in capsys.readouterr().out


def test_the_t_distribution_and_the_adjustment_are_scipy_statss_own():
    """compare computes them through scipy.special, sparing every CLI run the import of
    scipy.stats: the figures must be those scipy.stats gives, to the last bit."""
    from scipy.stats import false_discovery_control, t

    for df in (1, 2, 5, 30, 200):
        for x in (0.0, 0.5, 2.0, 12.7, 300.0):
            assert t_sf(x, df) == t.sf(x, df)
        for q in (0.5, 0.975, 1 - 0.05 / 400):
            assert t_ppf(q, df) == t.ppf(q, df)
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        ps = rng.uniform(size=n) ** 3
        ps[: n // 3] = ps[0]  # ties
        np.testing.assert_array_equal(benjamini_hochberg(ps), false_discovery_control(ps))


def test_a_file_with_every_column_of_this_version_loads_without_pandas_warnings(tmp_path):
    """Pandas warns ("highly fragmented") when a column is inserted into a frame of one block
    per column, which a wide file's concatenation gives; compare must print its own lines only."""
    import warnings

    from lorabench.results.schema import COLUMNS

    rows = pd.read_csv(ROOT / "tests" / "data" / "default-run.csv")
    rows = pd.concat([rows, pd.DataFrame({c: np.nan for c in COLUMNS if c not in rows}, index=rows.index)], axis=1)
    path = tmp_path / "wide.csv"
    rows.to_csv(path, index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        load_run([path, path])
