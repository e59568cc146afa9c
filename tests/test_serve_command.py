"""``lorabench serve-command``: the server a configuration is, to start by hand and benchmark
by URL. The engine test does what a user does: start the printed command, wait for it, run
the benchmark against its URL, and stop it."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
import urllib.request

import pandas as pd
import pytest

from lorabench.cli.main import main
from lorabench.targets.http.serve import free_port, port_free
from tests.helpers import ROOT, result_files


def printed(capsys, *args: str) -> tuple[int, list[str]]:
    """The exit status, and what was printed: the command on stdout, a refusal on stderr."""
    status = main(["serve-command", *args])
    out = capsys.readouterr()
    return status, (out.out if status == 0 else out.err).splitlines()


def test_the_command_is_the_configurations_server_and_the_pytest_line_selects_it(tiny_config, capsys, monkeypatch):
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    path = tiny_config(engine={"max_loras": [1, 2], "enforce_eager": True})
    status, (command, then) = printed(
        capsys, "--config", str(path), "--engine", "loras2-rank16-cpu4-eager", "--port", "9"
    )
    assert status == 0
    words = shlex.split(command)
    assert words[:4] == [
        "VLLM_CPU_KVCACHE_SPACE=1",
        "PYTHONHASHSEED=0",  # as the serve target runs it (engine_environment)
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1",
        "VLLM_WORKER_MULTIPROC_METHOD=spawn",
    ]
    flags = words[words.index("--model") :]
    assert flags[flags.index("--max-loras") + 1] == "2" and flags[flags.index("--max-cpu-loras") + 1] == "4"
    assert "--enforce-eager" in flags and "--no-enable-prefix-caching" in flags
    assert "--enable-prompt-tokens-details" in flags, "each usage says the prompt tokens found cached"
    assert flags[-4:] == ["--host", "127.0.0.1", "--port", "9"]
    modules = flags[flags.index("--lora-modules") + 1 : flags.index("--host")]
    assert len(modules) == 4 and all(os.path.isdir(m.split("=", 1)[1]) for m in modules), "generated, so they exist"
    assert then == (
        f"# then: pytest bench -k 'multilora and loras2-rank16-cpu4-eager' --bench-config {path} "
        "--bench-target http://127.0.0.1:9"
    )


def test_a_config_of_several_configurations_needs_engine_and_names_them(tiny_config, capsys):
    path = tiny_config()
    status, lines = printed(capsys, "--config", str(path))
    assert status == 2
    assert lines == [
        f"lorabench serve-command: {path} lists several engine configurations: give --engine, "
        "one of loras1-rank16-cpu4, loras2-rank16-cpu4"
    ]
    status, lines = printed(capsys, "--config", str(path), "--engine", "loras3")
    assert status == 2 and "has no engine configuration 'loras3'" in lines[0]
    status, lines = printed(capsys, "--config", str(path.parent / "none.json"))
    assert status == 2 and lines == [f"lorabench serve-command: --config {path.parent / 'none.json'}: no such file"]


@pytest.mark.engine
def test_a_server_started_from_the_printed_command_is_benchmarked_by_its_url(pytester, tiny_config, tmp_path, capsys):
    path = tiny_config(engine={"max_loras": 2}, matrix={"workloads": ["distinct"]})
    port = free_port()
    status, (command, _) = printed(capsys, "--config", str(path), "--port", str(port))
    assert status == 0
    log = (tmp_path / "server.log").open("wb")
    # exec env: the shell becomes the server, with the variables, so waiting for it waits for the server.
    server = subprocess.Popen(
        f"exec env {command}", shell=True, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        _wait_healthy(server, port)
        pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
        url = f"http://127.0.0.1:{port}"
        result = pytester.runpytest_subprocess("--bench-config", str(path), "--bench-target", url, timeout=300)
        result.assert_outcomes(passed=1)
        (row,) = pd.read_csv(result_files(tmp_path / "results")[0]).to_dict("records")
        assert (row["target"], row["endpoint"], row["max_loras"], row["failed"]) == ("url", url, 2, 0)
        assert row["ttft_ms_p50"] > 0 and row["digest_mismatches"] == 0
    finally:
        with contextlib.suppress(ProcessLookupError):  # already gone: the assertion above says why
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()
    deadline = time.monotonic() + 30
    while not port_free(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert port_free(port)


def _wait_healthy(server: subprocess.Popen, port: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, f"the printed command exited with {server.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"no /health within {timeout_s} s")
