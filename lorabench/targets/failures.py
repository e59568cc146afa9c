"""How an engine fails: a build that never became ready, or a process gone afterwards. A
dead engine fails its case and every later case of its build without touching it again
(``lorabench.scenarios.case``); any other error is the case's own."""

from __future__ import annotations

import sys


class EngineBuildError(RuntimeError):
    """An engine failed to build; the message carries the reason its own processes gave."""


class EngineDied(RuntimeError):
    """A process of the engine is gone."""


def is_engine_dead(exc: BaseException) -> bool:
    """Whether ``exc`` means the engine core is gone (killed, crashed, out of memory)."""
    if isinstance(exc, EngineDied):
        return True
    # Only an imported vLLM raises its error: asking needs no import (seconds, on a stand-in).
    exceptions = sys.modules.get("vllm.v1.engine.exceptions")
    if exceptions is None:
        return False
    dead = exceptions.EngineDeadError
    return isinstance(exc, dead) or isinstance(exc.__cause__, dead)
