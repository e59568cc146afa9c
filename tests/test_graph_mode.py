"""Graph mode as an engine setting: lists expand into configurations with their own names
and case keys, vLLM gets exactly what was set, and rows say what the engine reported."""

from __future__ import annotations

import sys
import tarfile
from types import SimpleNamespace

import pandas as pd
import pytest

from lorabench.config import ConfigError, engine_specs, read_config_file, resolve_config
from lorabench.results import graph
from lorabench.results.schema import CASE_KEY
from tests.helpers import ROOT, result_files

PIECEWISE = {"cudagraph_mode": "PIECEWISE"}


def specs_of(path):
    return engine_specs(read_config_file(path), with_lora_off=True)


def test_each_graph_setting_is_its_own_configuration(tiny_config):
    path = tiny_config(
        engine={"max_loras": 2, "enforce_eager": [True, False], "compilation_config": [PIECEWISE, {"mode": 3}]}
    )
    specs = specs_of(path)
    assert len(specs) == 8, "2 eager values x 2 compilation settings x (lora-off + one LoRA configuration)"
    assert len({s.name for s in specs}) == 8
    modes = {s.name.rsplit("-g", 1)[0] for s in specs if s.enable_lora}
    assert modes == {"loras2-rank16-cpu4-eager", "loras2-rank16-cpu4-graph"}
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    eager_piecewise = next(s for s in specs if s.enable_lora and s.enforce_eager and "PIECEWISE" in s.graph_config)
    kwargs = config.llm_kwargs(eager_piecewise)
    assert kwargs["enforce_eager"] is True and kwargs["compilation_config"] == PIECEWISE
    assert "additional_config" not in kwargs


def test_unset_graph_settings_pass_nothing_and_keep_the_old_names(tiny_config):
    path = tiny_config(engine={"max_loras": 2})
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    (off, lora) = specs_of(path)
    assert (off.name, lora.name) == ("lora-off", "loras2-rank16-cpu4")
    assert not {"enforce_eager", "compilation_config", "additional_config"} & set(config.llm_kwargs(lora))


def test_the_same_settings_in_another_key_order_are_one_configuration_and_refused_twice(tiny_config):
    assert graph.canonical({"compilation_config": {"a": 1, "b": 2}}) == graph.canonical(
        {"compilation_config": {"b": 2, "a": 1}}
    )
    path = tiny_config(engine={"additional_config": [{"x": {"on": True}}, {"x": {"on": True}}]})
    with pytest.raises(ConfigError, match=r"additional_config.*listed more than once"):
        read_config_file(path)


def test_the_engine_reports_its_modes_and_logged_times():
    config = SimpleNamespace(
        compilation_config=SimpleNamespace(
            mode=SimpleNamespace(name="VLLM_COMPILE"),
            cudagraph_mode=SimpleNamespace(name="FULL_AND_PIECEWISE"),
            custom_ops=["none", "+rms_norm"],
        )
    )
    # Two workers of a tensor-parallel build: the build waited for the slower.
    log = (
        "(Worker_TP0) INFO [monitor.py:34] torch.compile took 3.21 s in total\n"
        "(Worker_TP1) INFO [monitor.py:34] torch.compile took 4.50 s in total\n"
        "(Worker_TP1) INFO [gpu_model_runner.py:6582] Graph capturing finished in 12 secs, took 0.50 GiB\n"
        "(Worker_TP0) INFO [gpu_model_runner.py:6582] Graph capturing finished in 9 secs, took 0.50 GiB\n"
    )
    facts = graph.reported(config, log)
    assert facts == graph.GraphFacts("VLLM_COMPILE", "FULL_AND_PIECEWISE", 4.5, 12.0, "none,+rms_norm")
    assert graph.reported(config, "no capture here").graph_capture_s is None


@pytest.mark.parametrize(
    "line",
    [
        "INFO 10-02 [monitor.py:33] torch.compile takes 7.25 s in total",  # vLLM up to 0.11
        "INFO [decorators.py:705] torch.compile and initial profiling/warmup run together took 7.25 s in total",
    ],
)
def test_compile_times_in_other_vllm_versions_wording(line):
    old = SimpleNamespace(compilation_config=SimpleNamespace(level=3, cudagraph_mode=None))
    facts = graph.reported(old, line + "\n")
    assert facts.compile_s == 7.25 and facts.compilation_mode == "3"


def test_an_engine_reads_only_what_its_own_build_logged(tmp_path, tiny_config):
    """The log file is appended to: a line an earlier run left there is not this build's."""
    from lorabench.targets.standin import Costs, StandInEngine

    log = tmp_path / "engine.log"
    log.write_text("INFO torch.compile took 99.00 s in total\n")
    path = tiny_config(engine={"max_loras": 2})
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    spec = engine_specs(config.file, with_lora_off=False)[0]
    with StandInEngine(config, spec, "cpu", log, costs=Costs(), weights={}) as engine:
        assert engine.graph.compile_s is None
        assert engine._log_text() == ""


def test_eager_and_graph_rows_on_the_stand_in_have_their_own_keys(pytester):
    from lorabench.targets.standin import Costs, StandIn, write_config

    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
    config = write_config(pytester.path / "run", engine={"enforce_eager": [True, False]})
    result = pytester.runpytest(
        "--bench-config", str(config), "-p", "no:cacheprovider", plugins=[StandIn(Costs(), virtual_clock=True)]
    )
    result.assert_outcomes(passed=2)
    (csv,) = result_files(pytester.path / "run" / "results")
    rows = pd.read_csv(csv).set_index("enforce_eager")
    assert rows.loc[True, "compilation_mode"] == "NONE" and rows.loc[False, "compilation_mode"] == "VLLM_COMPILE"
    assert rows.loc[True, "engine_id"] == "loras2-rank8-cpu4-eager-build0"
    keys = pd.read_csv(csv)[list(CASE_KEY)].astype(object).fillna("").astype(str).agg("|".join, axis=1)
    assert keys.nunique() == 2, "compare must not match an eager row against a graph row"


@pytest.mark.engine
def test_a_real_cpu_run_writes_eager_and_graph_rows_and_bundles_them(pytester, tiny_config, tmp_path):
    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
    path = tiny_config(engine={"max_loras": 2, "enforce_eager": [True, False]}, matrix={"workloads": ["identical"]})
    result = pytester.runpytest_subprocess("--bench-config", str(path), "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(passed=2)
    (csv,) = result_files(tmp_path / "results")
    rows = pd.read_csv(csv)
    assert sorted(rows["enforce_eager"]) == [False, True]
    assert set(rows["engine_id"]) == {"loras2-rank16-cpu4-eager-build0", "loras2-rank16-cpu4-graph-build0"}
    # vLLM's CPU backend turns compilation off for every LoRA engine: asked for is not what ran.
    assert rows["compilation_mode"].eq("NONE").all() and rows["cudagraph_mode"].eq("NONE").all()
    # What does differ: eager keeps vLLM's custom kernels on, the graph build leaves them to compilation.
    ops = rows.set_index("enforce_eager")["custom_ops"]
    assert ops.notna().all() and ops[True] != ops[False]

    out = tmp_path / "bundle.tar.gz"
    assert pytester.run(sys.executable, "-m", "lorabench", "bundle", str(csv), "--out", str(out)).ret == 0
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        stem = csv.stem
        assert {f"{stem}/{csv.name}", f"{stem}/logs/config.json", f"{stem}/doctor.txt"} <= names
        assert f"{stem}/logs/loras2-rank16-cpu4-eager-build0.log" in names
        doctor = tar.extractfile(f"{stem}/doctor.txt").read().decode()
    assert "resolves: 4 adapters" in doctor
