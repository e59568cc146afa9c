"""Peak memory of one engine build, and waiting for an engine's device memory to come back.

On an accelerator the figure is device memory in use, as the driver reports it through
``npu-smi`` / ``nvidia-smi`` (out of process: see ``lorabench.host.smi``), summed over the
devices the engine uses (the first ``tensor_parallel_size x pipeline_parallel_size``
visible ones), above what was in use on them before the build; read after the build and
after every case. vLLM reserves ``gpu_memory_utilization`` of each device whatever the
LoRA settings, so this figure is about the same for every configuration there: what
``max_loras`` and ``max_lora_rank`` cost on a device shows in ``kv_cache_tokens``.

On the CPU it is the resident memory of the process tree (this process and the engine
processes it started), summed from each process's own kernel-kept peak (``VmHWM``), so
nothing needs to poll while timing runs. This process's peak is reset when the engine is
built, so an earlier engine's peak does not leak into the next one's figure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from lorabench.host import smi

MIB = 1024 * 1024
ACCELERATORS = ("cuda", "npu")
# An engine's device memory counts as released once the devices are back within this
# much of what they held before its build (drivers keep a little for themselves).
RELEASE_TOLERANCE_MIB = 512
RELEASE_TIMEOUT_S = 120.0


def _hwm_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_own_peak() -> None:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _tree_sum(measure: Callable[[psutil.Process], int]) -> int:
    """``measure`` summed over this process and its live descendants."""
    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += measure(proc)
        except psutil.Error:
            continue
    return total


def tree_peak_rss_bytes() -> int:
    """Sum of each live process's peak RSS in this process tree (current RSS where no peak is kept)."""
    return _tree_sum(lambda proc: _hwm_bytes(proc.pid) or proc.memory_info().rss)


def tree_rss_bytes() -> int:
    """Current RSS of this process and all its descendants."""
    return _tree_sum(lambda proc: proc.memory_info().rss)


class DeviceNotReleased(RuntimeError):
    """An engine was shut down but its devices did not get their memory back in time."""


class PeakMemory:
    """Tracks one engine build's peak; ``start`` before the build, ``update`` after each case."""

    def __init__(self, device_type: str, num_devices: int = 1) -> None:
        self.device_type = device_type
        self.num_devices = num_devices
        self.source = "device" if device_type in ACCELERATORS else "rss"
        # Why the figure may not be what it claims, for the results ("" when it is): the
        # device tool failed at the start (RSS instead) or on some reads (a stale peak).
        self.note = ""
        self.failed_reads = 0
        self.reads = 0
        self._devices: list[int] = []
        self._baseline = 0.0
        self._peak = 0.0

    def _read(self) -> dict[int, float]:
        """MiB in use on each of the engine's devices, by device index."""
        found = smi.visible(smi.read_devices(self.device_type), self.device_type, os.environ)
        if not self._devices:
            self._devices = [d.index for d in found[: self.num_devices]]
        return {d.index: d.used_mib for d in found if d.index in self._devices}

    def start(self) -> None:
        """Take the baseline; call with the engine's environment in place (visible devices)."""
        if self.source == "device":
            try:
                self._baseline = sum(self._read().values())
            except smi.DeviceToolError as exc:
                self.source, self.note = "rss", f"device memory unreadable ({exc}); process RSS instead"
        _reset_own_peak()
        self._peak = 0.0

    def update(self) -> float:
        """Read memory now and return the peak so far, in MiB.

        A failed device read keeps the peak seen so far (a tool hiccup is not a
        measurement), but says so in ``note``: the peak may have been missed.
        """
        if self.source == "device":
            self.reads += 1
            try:
                self._peak = max(self._peak, sum(self._read().values()) - self._baseline)
            except smi.DeviceToolError as exc:
                self.failed_reads += 1
                self.note = (
                    f"device memory unreadable in {self.failed_reads} of {self.reads} reads since the build "
                    f"(last: {exc}); the peak may be low"
                )
        else:
            self._peak = max(self._peak, tree_peak_rss_bytes() / MIB)
        return self._peak

    def wait_released(self, timeout_s: float = RELEASE_TIMEOUT_S, poll_s: float = 1.0) -> None:
        """Block until the engine's devices are back to their level before the build.

        vLLM's shutdown returns before the driver has freed everything; a build started
        meanwhile sees less free memory and gets a smaller KV cache, or fails.
        """
        if self.source != "device":
            return
        deadline = time.monotonic() + timeout_s
        used, failure = self._baseline, None
        while time.monotonic() < deadline:
            try:
                used, failure = sum(self._read().values()), None
            except smi.DeviceToolError as exc:
                failure = exc  # perhaps a hiccup: ask again until the deadline
            else:
                if used <= self._baseline + RELEASE_TOLERANCE_MIB:
                    return
            time.sleep(poll_s)
        devices = ", ".join(f"{self.device_type}:{i}" for i in self._devices)
        tool = "npu-smi info" if self.device_type == "npu" else "nvidia-smi"
        if failure is not None:
            raise DeviceNotReleased(
                f"cannot tell whether {devices} got their memory back {timeout_s:.0f} s after the engine shut down: "
                f"the device tool failed ({failure}); run {tool} to see whether the driver answers"
            )
        raise DeviceNotReleased(
            f"{used:.0f} MiB still in use on {devices} {timeout_s:.0f} s after the engine shut down, against "
            f"{self._baseline:.0f} MiB before it was built: an engine process may still be exiting, or another "
            f"process holds the device (see {tool})"
        )
