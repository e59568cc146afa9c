"""Peak memory of one engine configuration.

On an accelerator the figure is device memory in use (total minus free, as the driver
reports it for the whole device) above what was in use before the engine was built, read
after the build and after every case. On the CPU it is the resident memory of the
process tree (this process and the engine processes it started), summed from each
process's own kernel-kept peak (``VmHWM``), so nothing needs to poll while timing runs.
This process's peak is reset when the engine is built, so an earlier engine's peak does
not leak into the next one's figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import psutil

MIB = 1024 * 1024


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


def _device_used_bytes(device_type: str) -> int | None:
    try:
        import torch

        module = getattr(torch, device_type)
        free, total = module.mem_get_info()
        return int(total - free)
    except Exception:  # noqa: BLE001 - no such device API here: fall back to RSS
        return None


class PeakMemory:
    """Tracks one engine configuration's peak; ``start`` before the build, ``update`` after each case."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.source = "device" if device_type in ("cuda", "npu") else "rss"
        self._baseline = 0
        self._peak = 0

    def start(self) -> None:
        if self.source == "device":
            used = _device_used_bytes(self.device_type)
            if used is None:
                self.source = "rss"
            else:
                self._baseline = used
        _reset_own_peak()
        self._peak = 0

    def update(self) -> float:
        """Read memory now and return the peak so far, in MiB."""
        if self.source == "device":
            used = _device_used_bytes(self.device_type) or 0
            self._peak = max(self._peak, used - self._baseline)
        else:
            self._peak = max(self._peak, tree_peak_rss_bytes())
        return self._peak / MIB
