"""Device facts read from outside this process: ``npu-smi`` on Ascend, ``nvidia-smi`` on CUDA.

Nothing here imports torch_npu or touches CUDA. On Ascend, initializing torch_npu in the
pytest process breaks every engine it starts afterwards: vLLM forks the engine core,
and torch_npu cannot be initialized again in a forked child (vllm-ascend issue 4502).
On CUDA, a context in this process holds memory on GPU 0 for the whole session. The
management tools read the driver's own counters, for every device, from a process of
their own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TOOL_TIMEOUT_S = 20
NVIDIA_QUERY = "index,uuid,name,memory.used,memory.total,driver_version"
# What `npu-smi info` prints as "used / total" (MB); the last pair of a chip row is HBM.
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")
ASCEND_HOME = Path(os.environ.get("ASCEND_HOME_PATH", "/usr/local/Ascend/ascend-toolkit/latest"))
ASCEND_ROOT = Path("/usr/local/Ascend")


class DeviceToolError(RuntimeError):
    """The management tool is missing, failed or printed something unreadable."""


@dataclass(frozen=True)
class DeviceReading:
    """One device as its driver reports it, in MiB."""

    index: int
    name: str
    used_mib: float
    total_mib: float
    uuid: str = ""


def parse_npu_smi_info(text: str) -> list[DeviceReading]:
    """Devices from ``npu-smi info``: an NPU row (NPU id, name, health) then its chip rows
    (chip id, then on Atlas A3 and 300I cards the device id: ``Chip Phy-ID`` / ``Chip
    Device``; bus id; AICore; memory pairs). A chip row's device id is the index
    ``ASCEND_RT_VISIBLE_DEVICES`` takes; where the row has none (910B, one chip a card),
    the NPU id is. The last used/total pair is HBM, or DDR on cards without HBM. The
    process table below the devices is ignored."""
    devices: list[DeviceReading] = []
    npu: tuple[int, str] | None = None
    for line in text.splitlines():
        if "Process id" in line:
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        head = cells[0].split()
        if len(cells) < 3 or not head or not head[0].isdigit():
            continue
        if len(head) >= 2 and not head[1].isdigit():
            npu = (int(head[0]), " ".join(head[1:]))
        elif npu is not None and len(head) <= 2 and all(h.isdigit() for h in head):
            pairs = _PAIR.findall(" ".join(cells[2:]))
            if pairs:
                used, total = pairs[-1]
                index = int(head[1]) if len(head) == 2 else npu[0]
                devices.append(DeviceReading(index, npu[1], float(used), float(total)))
    if not devices:
        raise DeviceToolError("npu-smi info printed no device rows")
    return devices


def parse_npu_smi_version(text: str) -> str:
    """The driver version in the header of ``npu-smi info``: ``| npu-smi 24.1.rc2  Version: 24.1.rc2 |``."""
    match = re.search(r"npu-smi\s+\S+\s+Version:\s*(\S+)", text)
    return match.group(1) if match else ""


def parse_nvidia_smi_csv(text: str) -> list[DeviceReading]:
    """Devices from ``nvidia-smi --query-gpu=<NVIDIA_QUERY> --format=csv,noheader,nounits``."""
    devices = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            raise DeviceToolError(f"unexpected nvidia-smi line: {line!r}")
        try:
            devices.append(DeviceReading(int(parts[0]), parts[2], float(parts[3]), float(parts[4]), uuid=parts[1]))
        except ValueError:
            raise DeviceToolError(f"unexpected nvidia-smi line: {line!r}") from None
    if not devices:
        raise DeviceToolError("nvidia-smi listed no GPU")
    return devices


def parse_nvidia_driver(text: str) -> str:
    """The driver version, the last column of the query above (the same on every GPU)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first.split(",")[-1].strip() if first.count(",") >= 5 else ""


def _run(args: list[str]) -> str:
    if shutil.which(args[0]) is None:
        raise DeviceToolError(f"{args[0]} not found on PATH")
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise DeviceToolError(f"{' '.join(args)} did not answer within {TOOL_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise DeviceToolError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout


def tool_output(device_type: str) -> str:
    """The management tool's raw output for ``device_type`` ('npu' or 'cuda')."""
    if device_type == "npu":
        return _run(["npu-smi", "info"])
    if device_type == "cuda":
        return _run(["nvidia-smi", f"--query-gpu={NVIDIA_QUERY}", "--format=csv,noheader,nounits"])
    raise DeviceToolError(f"no device tool for {device_type!r}")


def read_devices(device_type: str) -> list[DeviceReading]:
    text = tool_output(device_type)
    return parse_npu_smi_info(text) if device_type == "npu" else parse_nvidia_smi_csv(text)


VISIBLE_VARIABLES = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}


def visible(devices: list[DeviceReading], device_type: str, env: Mapping[str, str]) -> list[DeviceReading]:
    """The devices an engine started with ``env`` can see, in the order it numbers them.

    The variable lists device indices (or, on CUDA, UUIDs); unset, every device is visible.
    """
    value = env.get(VISIBLE_VARIABLES.get(device_type, ""), None)
    if value is None or not value.strip():
        return list(devices)
    by_key = {str(d.index): d for d in devices} | {d.uuid: d for d in devices if d.uuid}
    chosen = []
    for key in (k.strip() for k in value.split(",")):
        match = by_key.get(key) or next((d for d in devices if d.uuid and d.uuid.startswith(key)), None)
        if match is not None:
            chosen.append(match)
    return chosen


def _key_value_file(path: Path, key: str) -> str:
    """``key=value`` from one of Ascend's ``version.info`` / ``*_install.info`` files."""
    try:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            name, _, value = line.partition("=")
            if name.strip().lower() == key.lower():
                return value.strip()
    except OSError:
        pass
    return ""


def toolkit_version(home: Path) -> str:
    """The CANN toolkit's version under ``home`` (``$ASCEND_HOME_PATH``), blank when no file says."""
    for info in sorted(home.glob("*-linux/ascend_toolkit_install.info")):
        version = _key_value_file(info, "version")
        if version:
            return version
    return _key_value_file(home / "version.cfg", "version")


def ascend_versions() -> dict[str, str]:
    """CANN toolkit, NPU driver and firmware versions, from the files the installers write."""
    return {
        "toolkit_version": toolkit_version(ASCEND_HOME),
        "driver_version": _key_value_file(ASCEND_ROOT / "driver" / "version.info", "Version"),
        "firmware_version": _key_value_file(ASCEND_ROOT / "firmware" / "version.info", "Version"),
    }
