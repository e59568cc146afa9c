"""What an HTTP target hands back: its sampling parameters and each streamed delta, shaped
like vLLM's ``RequestOutput`` where the scenarios read it, with this process's own send and
arrival times in place of the engine's timestamps, which do not reach the client."""

from __future__ import annotations

from dataclasses import dataclass, field

# A token the stream counted but did not name (a server that sends no token ids).
UNKNOWN_TOKEN = -1


@dataclass(frozen=True)
class HttpParams:
    max_tokens: int
    greedy: bool


@dataclass
class Completion:
    token_ids: list[int]


@dataclass
class ClientTiming:
    """When this process sent the request and got its first and last token's bytes (``lorabench.targets.clock``)."""

    sent_ts: float
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0


@dataclass
class HttpOutput:
    """One streamed delta, or (``finished``) the request's last; ``metrics`` is None: the
    engine's timestamps do not reach the client."""

    outputs: list[Completion]
    finished: bool
    timing: ClientTiming
    prompt_token_ids: list[int] = field(default_factory=list)
    metrics: None = None
    # When its tokens' bytes arrived, before they were parsed (``lorabench.measure.replay`` stamps them so).
    received_at: float | None = None
    # The last output's: prompt tokens the server found cached, when its usage says.
    num_cached_tokens: int | None = None


def corrected(last: list[int], missing: int) -> list[int]:
    """The last chunk's tokens, with the ones the chunk count missed (``usage`` says how
    many) added, or the ones it over-counted taken off."""
    return last + [UNKNOWN_TOKEN] * missing if missing >= 0 else last[: max(0, len(last) + missing)]
