"""Where a run's wall time goes: engine builds, measured work, warm-ups, and the rest (the
harness). The share of each does not depend on how fast the host is, so it says whether
lorabench spends a run measuring or around the measuring; docs/report.md defines the
categories.

One ``WallClock`` per session, in the plugin's state (``lorabench.pytest_plugin.session``); what is
timed adds its seconds to a category where it happens: the ``engine`` fixture its builds
and shutdowns, ``Context.time`` a case's timed work (its warm-up rounds apart), the case
runner the adapter loads it times, the batch scenarios the no-LoRA baselines they time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

BUILDS, MEASURED, WARMUPS, HARNESS = "engine builds", "measured", "warm-ups", "harness"
TIMED = (BUILDS, MEASURED, WARMUPS)


@dataclass
class WallClock:
    """Seconds by category since ``started`` (``time.perf_counter``); the harness is what
    the timed categories leave of the wall time."""

    started: float = field(default_factory=time.perf_counter)
    spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIMED, 0.0))

    def add(self, category: str, seconds: float) -> None:
        self.spent[category] += seconds

    @contextmanager
    def timing(self, category: str) -> Iterator[None]:
        """Adds the time inside the block to ``category``, whether the block raises or not."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(category, time.perf_counter() - start)

    def split(self) -> dict[str, float]:
        """Seconds of each category and of the harness, which sum to the wall time so far."""
        wall = time.perf_counter() - self.started
        return {**self.spent, HARNESS: max(wall - sum(self.spent.values()), 0.0)}

    def line(self, builds_as: str = BUILDS) -> str:
        """``wall time 446.0 s: engine builds 112.0 s (25 %), measured 180.0 s (40 %), ...``;
        ``builds_as`` names the builds' share where nothing is built (connections to a URL)."""
        split = self.split()
        wall = sum(split.values())
        named = {builds_as if name == BUILDS else name: s for name, s in split.items()}
        shares = ", ".join(f"{name} {s:.1f} s ({100 * s / wall:.0f} %)" for name, s in named.items()) if wall else ""
        return f"wall time {wall:.1f} s: {shares}"
