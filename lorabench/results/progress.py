"""What a long run says while it runs: how long it will take, and where a trace replay is.

The first estimate comes from the matrix alone (engine builds, or connections to a server
at a URL, cases, trace durations) and guesses generously; after each engine build the
remaining builds are estimated from the time the finished ones took, engine start-up and
cases included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# A first guess per engine build (start-up and shutdown) and per case, before any is measured.
GUESS_BUILD_S = 35.0
GUESS_CASE_S = 5.0
# A server at a URL is not built: a "build" is a connection to it, and its checks.
GUESS_CONNECTION_S = 2.0


def duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


@dataclass
class RunProgress:
    builds: int
    cases: int
    trace_s: float  # the summed real-time replays: online traces, capacity searches at their longest
    started: float = field(default_factory=time.monotonic)
    done: int = 0
    at_url: bool = False  # the target is a server at a URL: nothing is built

    @property
    def _what(self) -> str:
        return "connections" if self.at_url else "engine builds"

    def first_guess(self) -> str:
        per_build = GUESS_CONNECTION_S if self.at_url else GUESS_BUILD_S
        guess = self.builds * per_build + self.cases * GUESS_CASE_S + self.trace_s
        return (
            f"lorabench: {self.builds} {self._what}, {self.cases} cases, {self.trace_s:g} s of replays: "
            f"about {duration(guess)} (a first guess; refined after each of them)"
        )

    def build_done(self) -> str:
        self.done += 1
        elapsed = time.monotonic() - self.started
        left = elapsed / self.done * (self.builds - self.done)
        return (
            f"lorabench: {self.done} of {self.builds} {self._what} done, {duration(elapsed)} elapsed, "
            f"about {duration(left)} to go"
        )


def trace_reporter(write: Callable[[str], None], name: str, duration_s: float, requests: int) -> Callable[..., None]:
    """``report(sent, finished, elapsed_s)``: writes a line each time another tenth of the
    trace's duration has passed, and a last one (``elapsed_s=None``) when all are sent."""
    shown = [0]

    def report(sent: int, finished: int, elapsed_s: float | None) -> None:
        if elapsed_s is None:
            write(f"trace {name}: all {sent} requests sent, {finished} finished; waiting for the rest")
            return
        tenth = min(int(elapsed_s / duration_s * 10), 9)
        if tenth > shown[0]:
            shown[0] = tenth
            write(
                f"trace {name}: {tenth * 10}% ({elapsed_s:.1f} of {duration_s:g} s): {sent}/{requests} sent, "
                f"{finished} finished, about {max(duration_s - elapsed_s, 0):.1f} s of arrivals to go"
            )

    return report
