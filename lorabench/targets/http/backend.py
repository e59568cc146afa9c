"""What the plugin builds engines with when the target is a server: a ``vllm serve`` it
starts for each build, or the server at a URL (see ``lorabench.pytest_plugin.hooks`` for the interface)."""

from __future__ import annotations

from pathlib import Path

from lorabench.config import BenchConfig, EngineSpec
from lorabench.config.target import SERVE, Target
from lorabench.host.device import Platform, detect_platform
from lorabench.targets.http.engine import HttpEngine
from lorabench.targets.http.serve import ServeEngine


class HttpBackend:
    """``serve``: the server runs on this host, on the platform vLLM detects here (read
    without touching a device). A URL: the server's platform is the config's ``device``
    where it says one, else ``remote``; nothing about it is read from this host."""

    def __init__(self, target: Target, device: str | None = None) -> None:
        self.target = target
        self.device = device
        # vllm serve takes the engine arguments a config lists; a URL's server was started by someone else.
        self.checks_vllm_args = target.kind == SERVE

    def platform(self) -> Platform:
        if self.target.kind == SERVE:
            return detect_platform()
        return Platform(self.device or "remote", f"the server at {self.target.url}")

    def engine(self, config: BenchConfig, spec: EngineSpec, device_type: str, log_path: Path | None) -> HttpEngine:
        kind = ServeEngine if self.target.kind == SERVE else HttpEngine
        return kind(config, spec, device_type, log_path, self.target)
