"""The serve target's lifecycle: a server process started on a free port, waited for,
benchmarked, stopped and reaped; one that fails says why. The stand-in server plays
``vllm serve`` in the quick loop; the last test starts the real one."""

from __future__ import annotations

import math
import sys
import time

import numpy as np
import pandas as pd
import psutil
import pytest

from lorabench.config import EngineSpec, read_config_file, resolve_config
from lorabench.config.target import SERVE, Target
from lorabench.results.records import replays_path_for
from lorabench.targets.failures import EngineBuildError
from lorabench.targets.http.serve import ServeEngine, port_free
from lorabench.targets.standin import write_config
from tests.engine_sessions import SERVE_ONLINE
from tests.helpers import ROOT


class StandInServe(ServeEngine):
    """``vllm serve`` replaced by the stand-in server's process, or by ``script``."""

    script: str | None = None

    def command(self, port: int) -> list[str]:
        if self.script is not None:
            return [sys.executable, "-c", self.script]
        names = ",".join(a.name for a in self.config.adapters)
        return [sys.executable, "-m", "lorabench.targets.standin.server", "--port", str(port), "--adapters", names]


def engine(tmp_path, script=None, **sections):
    path = write_config(tmp_path, adapters=3, **sections)
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    served = StandInServe(config, EngineSpec(True, 2, 8, 4), "cpu", tmp_path / "logs" / "e.log", Target(SERVE))
    served.script = script
    return served, config


def test_the_server_is_started_waited_for_stopped_and_reaped(tmp_path):
    served, config = engine(tmp_path)
    with served:
        pid, port = served.server.pid, served.port
        assert served.build_s > 0 and served.endpoint == f"http://127.0.0.1:{port}"
        (out,) = served.generate([[1, 2, 3]], [config.adapters[0]], 4)
        assert len(out.outputs[0].token_ids) == 4
        served.check_alive()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert port_free(port) and served.server is None
    assert "lorabench.targets.standin.server --port" in (tmp_path / "logs" / "e.log").read_text(), (
        "the command is logged"
    )


def test_a_server_that_exits_fails_the_build_with_its_logs_reason(tmp_path):
    script = "import sys; print('ValueError: no model at /nowhere', flush=True); sys.exit(3)"
    served, _ = engine(tmp_path, script)
    with pytest.raises(EngineBuildError, match=r"exited with status 3: ValueError: no model at /nowhere \(server log"):
        served.__enter__()
    served.script = "import sys; print('usage: x\\nx: error: unrecognized arguments: --bad'); sys.exit(2)"
    with pytest.raises(EngineBuildError, match="status 2: x: error: unrecognized arguments: --bad"):
        served.__enter__()
    assert served.server is None and served.loop is None


def test_a_server_that_does_not_answer_in_time_fails_the_build_naming_the_setting(tmp_path):
    """A model still loading when ``serve.health_timeout_s`` runs out: the build fails saying
    which setting to raise, with the log's last line; a server that ignores SIGTERM is
    killed after ``serve.stop_timeout_s``, not after the default 30 s."""
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('Loading safetensors checkpoint shards: 40% Completed', flush=True); time.sleep(120)"
    )
    served, config = engine(tmp_path, script, serve={"health_timeout_s": 0.6, "stop_timeout_s": 0.2})
    started = time.monotonic()
    with pytest.raises(EngineBuildError) as info:
        served.__enter__()
    took = time.monotonic() - started
    assert f"did not answer /health within 0.6 s (serve.health_timeout_s in {config.path}: raise it" in str(info.value)
    assert "Loading safetensors checkpoint shards: 40% Completed (server log:" in str(info.value)
    assert 0.6 <= took < 10 and served.server is None


@pytest.mark.parametrize("bad", [0, -5, "ten", math.inf])
def test_a_bad_wait_is_refused_before_any_engine_starts(pytester, bad):
    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
    path = write_config(pytester.path / "run", adapters=3, serve={"stop_timeout_s": 5, "health_timeout_s": bad})
    result = pytester.runpytest("--bench-config", str(path), "--bench-target", "serve", "-p", "no:cacheprovider")
    assert result.ret == 2
    result.stderr.fnmatch_lines([f"*{path}: field 'serve.health_timeout_s' has bad value {bad!r}: *"])
    if bad in (0, -5):  # "ten" and inf: not a finite number at all, as pydantic says
        result.stderr.fnmatch_lines(["*bad value*give a number of seconds above 0: how long vllm serve may take*"])
    assert not (pytester.path / "run" / "results").exists(), "nothing ran"


@pytest.mark.engine
def test_vllm_serve_runs_a_batch_and_a_trace_and_is_gone_after(serve_session):
    """The real CPU build: lorabench starts vllm serve, runs a batch case and a short trace
    against it, and stops it: no process left, the port free. The trace's timeline comes
    from the real server's /metrics, so the names the parser reads are vLLM's own. The serve
    session (tests/engine_sessions.py) runs the other serve tests' scenarios on the same server."""
    # Requests of 16-32 tokens at 4 a second: 1-2 running at most scrapes (with 2-4 tokens, none
    # was running at any of a replay's 7 scrapes, and its gauges read 0 throughout).
    assert serve_session.passed("test_multilora") == 1 and serve_session.passed("test_multilora_online") == 1
    assert not serve_session.failed(but="test_isolation"), serve_session.failed(but="test_isolation")
    rows = serve_session.rows[serve_session.rows["scenario"].isin(["multilora", "online"])]
    assert sorted(rows["scenario"]) == ["multilora", "online"]
    assert (rows["target"] == "serve").all() and rows["endpoint"].str.startswith("http://127.0.0.1:").all()
    assert rows["ttft_ms_p50"].gt(0).all() and (rows["failed"] == 0).all() and rows["queue_ms"].isna().all()
    assert rows["kv_cache_tokens"].gt(0).all(), "vllm:cache_config_info read"
    duration = SERVE_ONLINE["suites"][0]["duration"]
    check_timeline(serve_session.csv, rows[rows["scenario"] == "online"].iloc[0], duration)
    assert serve_session.ports_free and all(serve_session.ports_free.values()), serve_session.ports_free
    assert not serve_session.vllm_left and serve_session.children_after <= serve_session.children_before


def check_timeline(csv, row, duration_s):
    """The online row's timeline columns and the timeline file, scraped from a real server's
    /metrics: the gauges in their ranges, the counters moving, a record every scrape, and the
    row's columns summed up from the records after the warm-up."""
    timeline = pd.read_csv(replays_path_for(csv, "timeline"))
    timeline = timeline[timeline["scenario"] == "online"]
    measured = timeline[timeline["t_s"] >= (row["trace_warmup_s"] if pd.notna(row["trace_warmup_s"]) else 0.0)]
    assert 0 < row["kv_usage_max"] == measured["kv_usage"].max() <= 1
    assert row["waiting_p99"] == pytest.approx(np.percentile(measured["waiting"], 99))
    assert row["preemptions"] == measured["preemptions"].sum()
    assert row["adapters_waiting_max"] == measured["adapters_waiting"].max() <= row["trace_num_adapters"]
    assert len(timeline) >= 2 * duration_s, f"{len(timeline)} scrapes in a {duration_s} s replay"
    assert timeline["t_s"].is_monotonic_increasing and timeline["kv_usage"].between(0, 1).all()
    assert timeline["running"].max() >= 1 and timeline["adapters_running"].max() >= 1
    assert (timeline["adapters_running"] <= timeline["running"]).all()
    assert timeline["steps"].sum() > 0 and timeline["generation_tokens"].sum() > 0, "counters read"
    assert timeline["prompt_tokens"].sum() > 0 and (timeline[["steps", "preemptions"]] >= 0).all().all()


@pytest.mark.engine
def test_the_isolation_canaries_through_vllm_serve_find_what_they_find_in_process(serve_session):
    """vLLM 0.32's runtime API and prefix cache through its own server, caching on: no adapter
    finds another's blocks, each control finds its own (the usage's cached tokens, which the
    serve target asks for), and a reload in place finds its old weights' blocks (the finding
    docs/scenarios.md#isolation documents), failing the case after its row is written."""
    (failed,) = serve_session.failed()
    assert failed.startswith("FAILED test_isolation.py::"), failed
    (row,) = serve_session.rows[serve_session.rows["scenario"] == "isolation"].to_dict("records")
    assert row["target"] == "serve" and row["enable_prefix_caching"] and row["engine_id"].endswith("-pc-build0")
    assert (row["isolation_checked"], row["isolation_broken"], row["isolation_control_changed"]) == (7, 0, 0)
    assert (row["isolation_reload_broken"], row["isolation_cached_tokens"], row["isolation_unjudged"]) == (1, 128, 0)
    serve_session.result.stdout.fnmatch_lines(["*ADAPTER ISOLATION BROKEN: lorabench-reloaded*in place*"])


@pytest.mark.engine
def test_vllm_reads_the_http_body_as_the_in_process_sampling_whatever_the_models_generation_config():
    """vLLM's server fills what a request leaves out from the model's generation_config.json
    (Llama-2: top_p 0.9; Qwen2.5-Instruct: repetition_penalty 1.05): read by vLLM's own
    request model with such defaults, lorabench's body samples as the in-process engine does."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from lorabench.targets.engine_requests import Requests
    from lorabench.targets.http.client import completion_body

    model_defaults = {"top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.05, "temperature": 0.6}
    settings = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
    for greedy in (True, False):
        body = completion_body("m", [5, 6, 7], 4, 0.0 if greedy else 1.0)
        served = CompletionRequest(**body).to_sampling_params(4, default_sampling_params=model_defaults)
        local = Requests.sampling_params(None, 4, greedy=greedy)
        assert {s: getattr(served, s) for s in settings} == {s: getattr(local, s) for s in settings}
