"""The devices a local fleet spreads engine configurations over, and how a worker is pinned
to its share of them.

An accelerator is what its management tool lists (``npu-smi``, ``nvidia-smi``, out of
process: the pytest process never touches a device runtime) or what ``--bench-devices``
names; a worker sees only its own through ``ASCEND_RT_VISIBLE_DEVICES`` or
``CUDA_VISIBLE_DEVICES``. On the CPU a device is a set of cores: a worker runs on them
alone (its affinity, which vLLM's CPU backend reads to bind its threads). Without
``--bench-devices`` each NUMA node is a device, and a machine of one node is split into
two halves, so that a fleet on the CPU is a fleet and not one engine after another. Slots
are of one size: where NUMA nodes are not (``0-15`` and ``16``), the smaller idle
(``equal_slots``), and named sets of unequal size are refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lorabench.host import smi

# Where a CPU worker learns its cores: it sets its own affinity from it before anything starts.
CPUS_ENV = "LORABENCH_FLEET_CPUS"
NODES = Path("/sys/devices/system/node")


class DeviceError(ValueError):
    """Devices that cannot be used as named; the message names the value and the fix."""


@dataclass(frozen=True)
class Slot:
    """The devices one worker runs on: one device, or ``tensor_parallel_size`` of them."""

    device_type: str
    devices: tuple[tuple[int, ...], ...]  # each device: its index, or on the CPU its cores

    @property
    def label(self) -> str:
        """How rows and progress name it: ``cpu 0-3``, ``npu 4,5``."""
        return f"{self.device_type} " + ",".join(_span(d) for d in self.devices)

    def env(self) -> dict[str, str]:
        """The environment that keeps a worker on this slot's devices."""
        if self.device_type == "cpu":
            return {CPUS_ENV: ",".join(str(c) for d in self.devices for c in d)}
        return {smi.VISIBLE_VARIABLES[self.device_type]: ",".join(str(d[0]) for d in self.devices)}

    @property
    def size(self) -> int:
        """What one engine on it has: its cores on the CPU (a row's ``device_count``), else its devices."""
        return sum(len(d) for d in self.devices)

    @property
    def shape(self) -> tuple[int, ...]:
        """Each device's size, smallest first: two slots are equal when their shapes are."""
        return tuple(sorted(len(d) for d in self.devices))


def _span(cores: tuple[int, ...]) -> str:
    """``0-3`` for consecutive cores, ``0+2`` otherwise; one index as itself."""
    if len(cores) == 1:
        return str(cores[0])
    if list(cores) == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return "+".join(map(str, cores))


def parse_devices(text: str, device_type: str) -> list[tuple[int, ...]]:
    """``--bench-devices``: ``0,1,3`` (device indices), on the CPU ``0-3,4-7`` (a device a
    range of cores) or ``0,1`` (a core each)."""
    devices = []
    for part in (p.strip() for p in text.split(",")):
        first, dash, last = part.partition("-")
        try:
            if dash and device_type != "cpu":
                raise ValueError
            span = tuple(range(int(first), int(last) + 1)) if dash else (int(first),)
        except ValueError:
            example = "0-3,4-7 (cores)" if device_type == "cpu" else "0,1,2,3"
            raise DeviceError(f"--bench-devices {text}: {part!r} is not a device; name them as {example}") from None
        if not span or min(span) < 0:
            raise DeviceError(f"--bench-devices {text}: {part!r} names no device")
        devices.append(span)
    seen = [i for d in devices for i in d]
    if len(seen) != len(set(seen)):
        raise DeviceError(f"--bench-devices {text}: a device or core is named twice; name each once")
    return devices


def _numa_nodes(allowed: set[int]) -> list[tuple[int, ...]]:
    """The cores of each NUMA node this process may run on; one group where the system does not say."""
    groups = []
    for node in sorted(NODES.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            cores = parse_devices((node / "cpulist").read_text().strip(), "cpu")
        except (OSError, DeviceError):
            continue
        mine = tuple(sorted({c for span in cores for c in span} & allowed))
        if mine:
            groups.append(mine)
    return groups or [tuple(sorted(allowed))]


def available(device_type: str) -> list[tuple[int, ...]]:
    """Every device this process may use: the tool's visible devices, or on the CPU its cores one by one."""
    if device_type == "cpu":
        return [(c,) for c in sorted(os.sched_getaffinity(0))]
    try:
        readings = smi.visible(smi.read_devices(device_type), device_type, os.environ)
    except smi.DeviceToolError as exc:
        raise DeviceError(
            f"--bench-fleet local: cannot list the {device_type} devices ({exc}); "
            "name them with --bench-devices 0,1,..."
        ) from None
    return [(d.index,) for d in readings]


def default_devices(device_type: str) -> list[tuple[int, ...]]:
    """The devices of ``--bench-fleet local`` without ``--bench-devices``."""
    if device_type != "cpu":
        return available(device_type)
    nodes = _numa_nodes(set(os.sched_getaffinity(0)))
    if len(nodes) == 1 and len(nodes[0]) > 1:
        half = len(nodes[0]) // 2  # two equal halves; an odd core is left over (slots must be equal)
        return [nodes[0][:half], nodes[0][half : 2 * half]]
    return nodes


def chosen_devices(text: str | None, device_type: str) -> list[tuple[int, ...]]:
    """``--bench-devices`` checked against what this host has, or the default devices."""
    if not text:
        return default_devices(device_type)
    devices = parse_devices(text, device_type)
    try:
        have = {i for d in available(device_type) for i in d}
    except DeviceError:
        return devices  # no npu-smi / nvidia-smi here (a container without it): the user named them
    missing = sorted({i for d in devices for i in d} - have)
    if missing:
        what = "cores this process may run on" if device_type == "cpu" else f"visible {device_type} devices"
        raise DeviceError(
            f"--bench-devices {text}: {', '.join(map(str, missing))} not among the {what} "
            f"({','.join(str(i) for i in sorted(have))}); name only those"
        )
    return devices


def slots(devices: list[tuple[int, ...]], device_type: str, per_engine: int) -> list[Slot]:
    """The devices grouped ``per_engine`` (``tensor_parallel_size`` x ``pipeline_parallel_size``)
    at a time, one group a worker; devices left over idle."""
    if per_engine > len(devices):
        raise DeviceError(
            f"engine.tensor_parallel_size x pipeline_parallel_size is {per_engine}: each engine needs "
            f"{per_engine} devices and the fleet has {len(devices)}; lower it or name more with --bench-devices"
        )
    count = len(devices) // per_engine
    return [Slot(device_type, tuple(devices[i * per_engine : (i + 1) * per_engine])) for i in range(count)]


def equal_slots(found: list[Slot]) -> tuple[list[Slot], list[Slot]]:
    """The slots of one size that have the most cores among them (on a tie the larger slots,
    each engine nearer a sequential run's), and the others, left idle. A configuration's builds
    are averaged as replicates wherever they ran, and the summary ranks configurations by their
    rows: a build on 16 cores beside one on 1 core is neither (docs/fleet.md#devices)."""
    groups: dict[tuple[int, ...], list[Slot]] = {}
    for slot in found:
        groups.setdefault(slot.shape, []).append(slot)
    kept = max(groups.values(), key=lambda g: (sum(s.size for s in g), g[0].size))
    return kept, [s for s in found if s not in kept]


def unequal(named: str, found: list[Slot]) -> str:
    """Why ``--bench-devices`` sets of unequal size are refused, and how to name them."""
    sizes = ", ".join(f"{s.label}: {s.size}" for s in found)
    return (
        f"--bench-devices {named}: sets of unequal size ({sizes} cores): a configuration's builds on them "
        "would be averaged as replicates; name sets of one size, such as 0-7,8-15 (docs/fleet.md#devices)"
    )


def idle_line(kept: list[Slot], idle: list[Slot]) -> str:
    """The run's one line on the slots ``equal_slots`` left idle."""
    unit = "core" if kept[0].device_type == "cpu" else "device"
    sizes = ", ".join(f"{s.label}: {s.size} {unit}{'s' if s.size > 1 else ''}" for s in idle)
    return (
        f"fleet: left idle {sizes}, against {kept[0].size} on each of {', '.join(s.label for s in kept)}: "
        "builds of one configuration run on slots of one size, not averaged across engines of another "
        "(name equal sets with --bench-devices)"
    )


def pin_from_env() -> None:
    """In a CPU worker: run on the cores the driver gave it, before any engine starts."""
    cores = os.environ.get(CPUS_ENV, "").strip()
    if cores:
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
