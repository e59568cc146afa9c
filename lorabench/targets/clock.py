"""The one clock that everything measured around an engine reads: its event loop's.

On a real engine the loop's clock is ``time.monotonic`` (asyncio's), the clock vLLM stamps
its own request timestamps on, so sends, tokens, steps, loads and vLLM's stamps compare
directly. A test's stand-in may run on a virtual clock instead
(``lorabench.targets.standin.virtual_clock``): reading the loop's clock, and never the wall's, is what
lets the same code measure there, exactly and in no real time.
"""

from __future__ import annotations

import asyncio
import time


def now() -> float:
    """The running loop's time; outside a loop, ``time.monotonic`` (what a real loop reads)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()
