"""The accelerator cards a run's engines will see, read from ``npu-smi`` / ``nvidia-smi``
(never from a device runtime in this process), against what the config's engine asks
of them: the doctor's device findings."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Any

from lorabench.host import smi
from lorabench.host.doctor import FAIL, OK, Finding, Host


def check_devices(host: Host, engine: Mapping[str, Any] | None = None) -> list[Finding]:
    """The cards the engines will see, with their free memory, against what the config's
    ``engine`` asks of them (``tensor_parallel_size`` cards, ``gpu_memory_utilization`` of each)."""
    if host.device_type not in smi.VISIBLE_VARIABLES:
        return [Finding(OK, f"{host.device_type} host: no accelerator to check")]
    tool = "npu-smi" if host.device_type == "npu" else "nvidia-smi"
    variable = smi.VISIBLE_VARIABLES[host.device_type]
    try:
        devices = smi.read_devices(host.device_type)
    except smi.DeviceToolError as exc:
        fix = (
            f"install the driver and put {tool} on PATH"
            if shutil.which(tool) is None
            else f"run {tool}{' info' if tool == 'npu-smi' else ''}: the driver must answer (in a container, "
            "mount the driver and the device files)"
        )
        return [Finding(FAIL, f"{tool} does not answer: {exc}", fix)]
    seen = smi.visible(devices, host.device_type, host.environ)
    if not seen:
        listed = ", ".join(str(d.index) for d in devices)
        return [
            Finding(
                FAIL,
                f"{variable}={host.environ.get(variable)} hides every card ({tool} lists {listed})",
                f"set {variable} to cards {tool} lists",
            )
        ]
    found = [
        Finding(OK, f"card {d.index} {d.name}: {_gib(d.total_mib - d.used_mib)} free of {_gib(d.total_mib)}")
        for d in seen
    ]
    return found + _room(seen, engine or {}, tool, variable)


def _room(seen: list[smi.DeviceReading], engine: Mapping[str, Any], tool: str, variable: str) -> list[Finding]:
    """vLLM refuses to start when a card it uses has less free memory than
    ``gpu_memory_utilization`` (0.9 unset) of its total; it uses the first
    ``tensor_parallel_size`` visible cards."""
    share = _number(engine.get("gpu_memory_utilization"), 0.9)
    cards = int(_number(engine.get("tensor_parallel_size"), 1))
    if len(seen) < cards:
        return [
            Finding(FAIL, f"tensor_parallel_size {cards} needs {cards} cards, {len(seen)} visible", f"set {variable}")
        ]
    found = []
    for d in seen[:cards]:
        free, wanted = d.total_mib - d.used_mib, share * d.total_mib
        if free < wanted:
            problem = (
                f"card {d.index} has {_gib(free)} free; the engine asks for {share:g} of its {_gib(d.total_mib)} "
                f"({_gib(wanted)}, gpu_memory_utilization)"
            )
            fix = f"free it ({tool} info lists its processes), pick other cards with {variable}, or lower the share"
            found.append(Finding(FAIL, problem, fix))
    return found


def _number(value: Any, default: float) -> float:
    """A setting's value, or ``default`` where it is unset or not one number (a list, say)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"
