"""The plugin as a user meets it, through pytester. Only the last test starts engines."""

import shutil

import pandas as pd
import pytest

from lorabench.results.records import samples_path_for
from tests.engine_sessions import CHURN_SUITE, ONLINE_WARMUP_S, SMOKE_SUITE, TIMELINE_SUITE, fast_base
from tests.helpers import ROOT, on_the_stand_in, result_files
from tests.test_session_end import CONFTEST as FINISHED_RUN

BENCH_MODULES = ("test_no_lora.py", "test_multilora.py")


@pytest.fixture
def real_bench_dir(pytester):
    """The repository's own bench modules, copied into pytester's folder."""
    for name in BENCH_MODULES:
        pytester.makepyfile(**{name[:-3]: (ROOT / "bench" / name).read_text()})
    return pytester


@pytest.fixture
def bench_dir(real_bench_dir):
    """The bench modules on the stand-in engine: these tests read what the plugin collects,
    refuses and writes, and vLLM's own platform (an import of seconds) is the engine tests'
    (``pytest -m engine``, which use ``real_bench_dir``)."""
    on_the_stand_in(real_bench_dir)
    return real_bench_dir


def test_options_and_ini_twins_are_registered(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(
        [
            "multi-LoRA benchmarks on vLLM:",
            "*--bench-config=PATH*",
            "*--bench-output=PATH*",
            "*--bench-builds=N*",
            "*--bench-compare=BASE*",
            "*--bench-compare-fail*",
            "*--bench-compare-threshold=*",
            "*--bench-compare-alpha=ALPHA*",
            "*--bench-compare-noise-from=RUNS*",
            "*--bench-report=DIR*",
            "*bench_config*",
            "*bench_output*",
            "*bench_builds*",
            "*bench_compare*",
            "*bench_compare_fail*",
            "*bench_compare_threshold*",
            "*bench_compare_alpha*",
            "*bench_compare_noise_from*",
            "*bench_report*",
        ]
    )


def test_plugin_is_inert_without_bench_tests(pytester):
    pytester.makepyfile("def test_plain(): assert True")
    result = pytester.runpytest("--bench-config", "does/not/exist.json")
    result.assert_outcomes(passed=1)


def test_bad_config_exits_2_one_line_a_problem_before_any_engine(bench_dir, tiny_config):
    path = tiny_config(engine={"max_lora_rank": 24, "max_loras": 4, "max_cpu_loras": 2}, matrix={"batch_size": [2]})
    result = bench_dir.runpytest("--bench-config", str(path))
    assert result.ret == 2
    result.stderr.fnmatch_lines(
        [
            f"lorabench: {path}: field 'engine.max_lora_rank' has bad value 24*",
            f"lorabench: {path}: unknown key 'matrix.batch_size': did you mean 'batch_sizes'?*",
        ]
    )
    assert all(line.startswith("lorabench: ") for line in result.stderr.lines if line), result.stderr.lines
    result.stdout.fnmatch_lines(["*lorabench: bad input: nothing ran (exit status 2)*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert "engine builds" not in result.stdout.str()


def test_a_weightless_model_folder_is_refused_before_any_engine(bench_dir, tiny_config, tmp_path):
    from lorabench.load import builtin

    model = tmp_path / "no-weights"
    model.mkdir()
    (model / "config.json").write_text((builtin.ensure_model("tiny-llama") / "config.json").read_text())
    result = bench_dir.runpytest("--bench-config", str(tiny_config(model=str(model))))
    assert result.ret == 2
    result.stderr.fnmatch_lines(
        [f"*field 'model': {model} has a config.json but no weight files*engine.load_format*dummy*"]
    )
    assert "engine builds" not in result.stdout.str() and "Traceback" not in result.stderr.str()


def test_bad_compare_inputs_are_refused_before_the_run_not_after_it(bench_dir, tiny_config, tmp_path):
    """A base that is not there, or a threshold that does not parse, was found only once every
    case had run, and the session exited 0 with one summary line."""
    base = tmp_path / "base.csv"
    base.write_text("x\n")
    args = ("--bench-config", str(tiny_config()), "--bench-compare", f"{base},{tmp_path / 'gone.csv'}")
    result = bench_dir.runpytest(*args, "--bench-compare-threshold", "bogus", "--bench-compare-noise-from", "nowhere")
    assert result.ret == 2
    result.stderr.fnmatch_lines(
        [
            f"lorabench: --bench-compare {base},{tmp_path / 'gone.csv'}: {tmp_path / 'gone.csv'}: no such file*",
            "lorabench: --bench-compare-noise-from nowhere: nowhere: no such file or folder*",
            "lorabench: --bench-compare-threshold: --threshold 'bogus': expected a percentage*",
        ]
    )
    assert "engine builds" not in result.stdout.str() and "Traceback" not in result.stderr.str()


def test_each_path_of_an_ini_list_is_from_the_rootdir(bench_dir, tmp_path):
    from lorabench.pytest_plugin import options

    bench_dir.makeini("[pytest]\nbench_compare = bases/b1.csv,bases/b2.csv\n")
    config = bench_dir.parseconfig()
    assert options.value(config, "bench_compare") == f"{bench_dir.path}/bases/b1.csv,{bench_dir.path}/bases/b2.csv"


def test_ini_twin_selects_the_config(bench_dir, tmp_path):
    (tmp_path / "broken.json").write_text("{")
    bench_dir.makeini(f"[pytest]\nbench_config = {tmp_path / 'broken.json'}\n")
    result = bench_dir.runpytest()
    assert result.ret == 2
    result.stderr.fnmatch_lines([f"*{tmp_path / 'broken.json'}:1:2: invalid JSON*"])


def test_bench_test_without_scenario_mark_is_a_usage_error(pytester, tiny_config):
    pytester.makepyfile("def test_x(lorabench, engine, batch_size): pass")
    result = pytester.runpytest("--bench-config", str(tiny_config()))
    assert result.ret == 2
    result.stderr.fnmatch_lines(["*test_x*needs @pytest.mark.scenario(NAME)*"])


def test_case_ids_and_keyword_selection(bench_dir, tiny_config):
    path = tiny_config()
    multilora = bench_dir.runpytest("--bench-config", str(path), "-k", "multilora", "--collect-only", "-q")
    ids = [line.rsplit("/", 1)[-1] for line in multilora.stdout.lines if "::" in line]
    assert ids == [
        f"test_multilora.py::test_multilora[{engine}-build0-{workload}-bs2]"
        for engine in ("loras1-rank16-cpu4", "loras2-rank16-cpu4")
        for workload in ("distinct", "identical")
    ]
    baseline = bench_dir.runpytest("--bench-config", str(path), "-k", "no_lora", "--collect-only", "-q")
    ids = [line.rsplit("/", 1)[-1] for line in baseline.stdout.lines if "::" in line]
    assert sorted(ids) == [
        f"test_no_lora.py::test_no_lora[{engine}-build0-bs2]"
        for engine in ("lora-off", "loras1-rank16-cpu4", "loras2-rank16-cpu4")
    ]


def test_builds_are_interleaved_and_overridable(bench_dir, tiny_config):
    """Each configuration is built matrix.builds times, build-major, so a configuration's
    builds are spread over the run; --bench-builds and its ini twin override the count."""
    path = tiny_config(matrix={"builds": 2})

    def ids(*args):
        # One token: a separate path argument would move pytest's rootdir, and with it the ini file.
        result = bench_dir.runpytest(
            f"--bench-config={path}", "-k", "multilora and distinct", "--collect-only", "-q", *args
        )
        return [line.split("[")[1].rstrip("]") for line in result.stdout.lines if "::" in line]

    assert ids() == [f"loras{n}-rank16-cpu4-build{b}-distinct-bs2" for b in (0, 1) for n in (1, 2)]
    assert ids("--bench-builds", "3")[-1] == "loras2-rank16-cpu4-build2-distinct-bs2"
    bench_dir.makeini("[pytest]\nbench_builds = 1\n")
    assert ids() == [f"loras{n}-rank16-cpu4-build0-distinct-bs2" for n in (1, 2)]
    result = bench_dir.runpytest("--bench-config", str(path), "--bench-builds", "0")
    assert result.ret == 2
    result.stderr.fnmatch_lines(["*--bench-builds 0: an engine configuration is built at least once*"])
    bench_dir.makeini("[pytest]\nbench_builds = two\n")
    result = bench_dir.runpytest(f"--bench-config={path}")
    assert result.ret == 2
    result.stderr.fnmatch_lines(["*tox.ini: ini option bench_builds = two: expected a whole number such as 2"])


def test_baseline_runs_need_no_adapters(bench_dir, tiny_config, tmp_path):
    (tmp_path / "none.json").write_text("[]")
    path = tiny_config(adapters="none.json")
    assert bench_dir.runpytest("--bench-config", str(path), "-k", "no_lora", "--collect-only").ret == 0
    result = bench_dir.runpytest("--bench-config", str(path), "-k", "multilora", "--collect-only")
    assert result.ret == 2
    result.stderr.fnmatch_lines(["*no adapters, but multi-LoRA cases were selected*"])


def test_cases_for_an_absent_device_skip_with_the_reason(bench_dir, tiny_config):
    # An NPU config whose paths exist only on the NPU node: nothing is resolved here.
    path = tiny_config(device="npu", model="/models/Llama-2-7b-hf", adapters="/models/adapters.json")
    result = bench_dir.runpytest("--bench-config", str(path), "-rs")
    result.assert_outcomes(skipped=7)
    result.stdout.fnmatch_lines(
        [
            "benchmark cases skipped: needs vLLM's npu platform; this host runs cpu",
            "SKIPPED [[]4[]] test_multilora.py:*: needs vLLM's npu platform; this host runs cpu",
        ]
    )
    assert "engine builds" not in result.stdout.str()


def test_device_marks_skip_plain_tests_too(pytester):
    on_the_stand_in(pytester)  # whose platform is the CPU, as vLLM's is on this host
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.npu
        def test_npu_only(): pass

        @pytest.mark.cpu
        def test_cpu_only(): pass
        """
    )
    reports = pytester.inline_run().getreports("pytest_runtest_logreport")
    skipped = [r for r in reports if r.skipped]
    assert [r.nodeid.split("::")[-1] for r in skipped] == ["test_npu_only"]
    assert skipped[0].longrepr[2] == "Skipped: needs vLLM's npu platform; this host runs cpu"
    assert [r.nodeid.split("::")[-1] for r in reports if r.when == "call" and r.passed] == ["test_cpu_only"]


@pytest.mark.engine
def test_end_to_end_on_the_real_cpu_engine(real_bench_dir, tiny_config, tmp_path):
    """Both scenarios with text prompts on real engines: one build per configuration (the
    LoRA one and lora-off), one durable row per case, every latency positive."""
    path = tiny_config(engine={"max_loras": 2}, matrix={"rounds": 2, "warmup_rounds": 1})
    result = real_bench_dir.runpytest_subprocess("--bench-config", str(path), "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(passed=4)
    out = result.stdout.str()
    assert "engine builds: 2 (" in out
    # The reaper spares multiprocessing's resource tracker, which serves the whole session.
    assert "resource_tracker" not in out + result.stderr.str()
    (rss_line,) = [
        line for line in result.stdout.lines if line.startswith("process tree RSS after each engine shut down")
    ]
    rss = [float(v) for v in rss_line.split(":")[1].split(",")]
    assert len(rss) == 2 and max(rss) - min(rss) < 256, f"memory grows across engine builds: {rss}"
    for engine in ("lora-off", "loras2-rank16-cpu4"):
        assert out.count(f"{engine}-build0 ") >= 2  # in the build line and the summary table

    (csv,) = result_files(tmp_path / "results")
    rows = pd.read_csv(csv)
    assert len(rows) == 4
    assert sorted(rows["scenario"].value_counts().items()) == [("multilora", 2), ("no_lora", 2)]
    assert set(rows.loc[rows.scenario == "multilora", "workload"]) == {"distinct", "identical"}
    assert (rows["rounds"] == 2).all() and (rows["warmup_rounds"] == 1).all()
    for column in (
        "ttft_ms",
        "prefill_ms",
        "decode_ms",
        "e2e_ms",
        "request_e2e_ms",
        "output_tokens_per_s",
        "peak_memory_mb",
        "kv_cache_tokens",
    ):
        assert (rows[column] > 0).all(), column
    assert (rows["ttft_ms_p99"] >= rows["ttft_ms_p50"]).all()
    assert rows["device_type"].eq("cpu").all() and rows["model"].eq("builtin:tiny-llama").all()
    assert rows["vllm_version"].notna().all()
    multilora = rows[rows.scenario == "multilora"]
    assert (multilora["num_adapters"] == multilora["workload"].map({"distinct": 2, "identical": 1})).all()
    # Measured once per build, on purpose: the same figure on every row of a LoRA build.
    per_build = rows.groupby("engine_id")["adapter_load_ms"]
    assert per_build.nunique(dropna=False).eq(1).all(), per_build.unique().to_dict()
    assert rows.loc[rows.enable_lora, "adapter_load_ms"].between(0.05, 5000).all()
    assert rows.loc[~rows.enable_lora, "adapter_load_ms"].isna().all(), "no adapter loads without LoRA"
    assert (multilora["timed_adapter_loads"] == 0).all(), "a batch's adapters fit the CPU cache here"
    builds = rows.groupby("engine_id")["engine_build_s"].nunique()
    assert (builds == 1).all(), "every case of a configuration shares one engine"
    assert rows.loc[rows.engine_id == "lora-off-build0", "enable_lora"].tolist() == [False]
    assert rows["build"].eq(0).all() and rows["run_id"].nunique() == 1

    samples = pd.read_csv(csv.with_name(csv.stem + ".samples.csv"))
    assert len(samples) == 2 * (2 * 2 + 2 * 2)  # rounds x requests of every case
    distinct = samples[(samples.workload == "distinct")]
    assert set(distinct["adapter"]) == {"dummy-lora-rank-8-0", "dummy-lora-rank-16-0"}
    assert (samples["output_tokens"] == 4).all()
    assert samples["prompt_tokens"].between(2, 64).all(), "text prompts, tokenized by the built-in tokenizer"


@pytest.mark.engine
def test_bench_compare_fails_the_session_on_a_regression(compare_session):
    """A real run of two builds compared with a made-up base far faster than this
    machine: the session prints the comparison and, with --bench-compare-fail, fails."""
    result, base = compare_session.result, compare_session.folder / "base.csv"
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "engine builds: 2 (loras1-rank16-cpu4-build0 *, loras1-rank16-cpu4-build1 *)",
            "*= lorabench compare =*",
            f"base: {base}  commit *",
            "one run a side: verdicts assume no drift between runs*",
            "noise between engine builds (sd of one build): ttft_ms *(df 2)*",
            "workload: identical",
            "*multilora loras1-rank16-cpu4 bs2 in16 out4  e2e_ms*REGRESSED*",
            "1 cases compared; of their * metrics 5 regressed, 0 improved*",
            "5 regressions: the session fails (--bench-compare-fail)",
        ]
    )
    rows = compare_session.rows
    assert sorted(rows["build"]) == [0, 1]
    # The KV cache a configuration gets does not depend on the build.
    assert rows["kv_cache_tokens"].nunique() == 1 and rows["kv_cache_tokens"].iloc[0] > 0


@pytest.mark.engine
def test_bench_compare_takes_a_noise_floor_from_earlier_runs(compare_session, pytester, tmp_path):
    """The same comparison with --bench-compare-noise-from two earlier runs of the base that
    strayed 20-fold apart: against that floor nothing is significant, and the session passes.
    The real run of the test above, compared again at the end of a session that runs no
    engine (as tests/test_session_end.py does)."""
    run = tmp_path / "run.csv"
    shutil.copy(compare_session.csv, run)
    base, slow = compare_session.folder / "base.csv", fast_base(tmp_path / "slow.csv", speedup=1)
    pytester.makeconftest(FINISHED_RUN.format(results=str(run)))
    pytester.makepyfile("def test_plain(): pass")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--bench-compare", str(base), "--bench-compare-fail",
        "--bench-compare-noise-from", f"{base},{slow}",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*one run a side: noise no smaller than the spread of 2 earlier runs of one commit",
            "noise between runs, floor from 2 earlier runs of one commit (sd of one run's mean): ttft_ms *(df 1)*",
            "1 cases compared; of their * metrics 0 regressed, 0 improved*",
        ]
    )


@pytest.mark.engine
def test_online_replay_on_the_real_cpu_engine(replay_session):
    """A short trace replayed on a real async engine: every request accounted for. The
    ``smoke`` trace of the replay session (tests/engine_sessions.py), which also replays the
    timeline test's trace and a churn case on the same build."""
    from lorabench.config import online_cases, read_config_file
    from lorabench.load.traces import synthetic as trace

    result, report = replay_session.result, replay_session.folder / "report"
    assert replay_session.passed("test_multilora_online") == 2 and not replay_session.failed()
    replays = SMOKE_SUITE["duration"] + TIMELINE_SUITE["duration"] + CHURN_SUITE["duration"]
    result.stdout.fnmatch_lines(
        [
            f"lorabench: 1 engine builds, 3 cases, {replays} s of replays: about * (a first guess*",
            "trace smoke-n4-a0.3-cv1-r4: 10% (* of 5 s): */* sent, * finished, about * s of arrivals to go",
            "trace smoke-n4-a0.3-cv1-r4: 90% *",
            "trace smoke-n4-a0.3-cv1-r4: all * requests sent, * finished; waiting for the rest",
            "lorabench: 1 of 1 engine builds done, * elapsed, about 0 s to go",
            "engine builds: 1 (loras2-rank16-cpu4-build0 *)",
            f"report: {report / 'index.html'}",
        ]
    )
    # A report of a real run: the traces' figures from their samples, none of the batch ones.
    assert {p.name for p in report.glob("*.png")} == {"online_cdf.png", "online_adapters.png", "memory.png"}

    config = replay_session.folder / "common.json"
    (case,) = [c for c in online_cases(read_config_file(config)) if c.suite == "smoke"]
    expected = trace.generate(case.params, [f"dummy-lora-rank-{r}-{i}" for i, r in ((0, 8), (0, 16), (1, 8), (1, 16))])
    rows = replay_session.rows
    (row,) = rows[rows["trace_suite"] == "smoke"].to_dict("records")
    assert row["scenario"] == "online" and row["trace_rate"] == 4
    assert row["unfinished"] == 0
    assert row["num_requests"] == sum(r.arrival_s >= ONLINE_WARMUP_S for r in expected)
    assert 0 < row["ttft_ms_p50"] <= row["ttft_ms_p99"] and row["decode_ms"] > 0 and row["request_throughput"] > 0
    assert 0 <= row["slo_attainment"] <= 1 and row["send_lag_ms_p99"] >= 0
    samples = pd.read_csv(samples_path_for(replay_session.csv))
    samples = samples[samples["trace_suite"] == "smoke"]
    assert len(samples) == len(expected) and samples["finished"].all()
    assert samples["output_tokens"].tolist() == [r.output_len for r in expected]
    assert samples["adapter"].tolist() == [r.adapter for r in expected]


def test_compare_names_the_setting_two_real_sessions_ran_apart_in(bench_dir, tmp_path, capsys):
    """End to end: each session keeps its config beside its result file, and compare reads
    both and names the one engine setting the second changed."""
    from lorabench.cli import main as cli
    from lorabench.targets.standin import write_config

    runs = []
    for name, seqs in (("base", 16), ("new", 32)):
        config = write_config(tmp_path / name, engine={"max_num_seqs": seqs})
        assert bench_dir.runpytest("--bench-config", str(config), "-k", "no_lora", "-p", "no:cacheprovider").ret == 0
        (csv,) = result_files(tmp_path / name / "results")
        runs.append(str(csv))
    capsys.readouterr()
    cli.main(["compare", *runs])
    out = capsys.readouterr().out
    assert "WARNING: the runs' configs differ, so a change may be the settings': engine.max_num_seqs: 16 -> 32" in out
