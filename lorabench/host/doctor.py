"""What ``lorabench doctor`` reads about the host, without importing vllm-ascend or torch-npu,
and the findings it makes of it.

Which accelerator the host is set up for comes from the packages' metadata and the
management tools on PATH: vllm-ascend, torch-npu or ``npu-smi`` make an Ascend host,
``nvidia-smi`` a CUDA one. What vLLM's platform resolves to, as an engine would resolve
it, is asked of a Python process of its own: on an Ascend node that imports vllm-ascend
and torch-npu, which a CANN environment that was not sourced can break, or crash.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from lorabench.host import stack
from lorabench.host.stack import Package

# How long vLLM's platform may take to resolve (it imports torch, and torch-npu on a node).
PROBE_TIMEOUT_S = 180
_MARK = "lorabench-probe:"
# Resolves vLLM's platform as an engine would, then reads vLLM's engine arguments once,
# so that the config check in the doctor's process finds them in lorabench's cache
# (lorabench.targets.vllm_args) instead of importing vLLM there.
_PROBE = """
import json
found = {}
try:
    from vllm.platforms import current_platform
    found["device_type"] = str(current_platform.device_type)
    from lorabench.targets.vllm_args import engine_arg_names
    engine_arg_names()
except BaseException as exc:
    while exc.__cause__ or exc.__context__:  # the first failure: a library not found, say
        exc = exc.__cause__ or exc.__context__
    found["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
print("\\nMARK" + json.dumps(found))
""".replace("MARK", _MARK)


OK, NOTE, FAIL = "ok", "note", "FAIL"


@dataclass(frozen=True)
class Finding:
    """One line of the doctor's: ``ok``, ``note`` or ``FAIL`` (would stop a run), with its fix."""

    level: str
    text: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.level:<4}  {self.text}" + (f" -- fix: {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class Host:
    """What the checks read, gathered in one place so a test can fake any part of it.

    ``device_type`` is the accelerator the host is set up for (the one the checks are
    about); ``vllm_platform`` what vLLM's platform resolved to in a process of its own
    (blank: not asked), and ``platform_note`` why, when that was not the same.
    """

    packages: Mapping[str, Package]
    device_type: str
    environ: Mapping[str, str] = field(default_factory=dict)
    platform_note: str = ""
    vllm_platform: str = ""


@dataclass(frozen=True)
class Probe:
    device_type: str  # blank when vLLM's platform did not resolve
    why: str = ""  # the error, or the last exception line the process printed


def probe_platform(environ: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """vLLM's ``current_platform.device_type`` in a fresh ``python`` with ``environ``."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=dict(environ),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Probe("", f"vLLM's platform did not resolve within {timeout_s:.0f} s")
    except OSError as exc:
        return Probe("", f"cannot start {sys.executable}: {exc}")
    found: dict[str, str] = {}
    for line in done.stdout.splitlines():
        if line.startswith(_MARK):
            found = json.loads(line[len(_MARK) :])
    why = found.get("error") or _last_exception(done.stdout + "\n" + done.stderr)
    if not found and done.returncode != 0:
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
        why = f"python died resolving vLLM's platform ({how})" + (f": {why}" if why else "")
    return Probe(found.get("device_type", ""), why)


def _last_exception(text: str) -> str:
    """The last ``SomeError: message`` line: what a failed import or plugin load printed."""
    lines = [line.strip() for line in text.splitlines()]
    errors = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception")) and ":" in line]
    return errors[-1] if errors else ""


def host_kind(packages: Mapping[str, Package], vllm_platform: str, which=shutil.which) -> str:
    """The accelerator the host is set up for: npu where vllm-ascend, torch-npu or npu-smi
    is installed; cuda where vLLM's platform is CUDA or nvidia-smi is on PATH beside a
    vLLM that is not the CPU build; else what vLLM's platform says, or cpu."""
    if "vllm-ascend" in packages or "torch-npu" in packages or which("npu-smi"):
        return "npu"
    vllm = packages.get("vllm")
    cpu_build = vllm is not None and stack.is_cpu_build(vllm)
    if vllm_platform == "cuda" or (which("nvidia-smi") and not cpu_build):
        return "cuda"
    return vllm_platform if vllm_platform in ("cpu", "npu") else "cpu"


def read_host() -> Host:
    environ = dict(os.environ)
    packages = stack.installed()
    probe = probe_platform(environ)
    kind = host_kind(packages, probe.device_type)
    note = probe.why if probe.device_type != kind else ""
    return Host(packages, kind, environ, note, probe.device_type or "none")


def describe_host(host: Host) -> str:
    kind = {"npu": "Ascend NPU", "cuda": "CUDA GPU", "cpu": "CPU"}.get(host.device_type, host.device_type)
    platform = f"; vLLM's platform: {host.vllm_platform}" if host.vllm_platform else ""
    return f"{host.device_type} host ({kind}{platform})"
