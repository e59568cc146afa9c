"""A client of an OpenAI-compatible server (``vllm serve``): streaming completions, the
adapters it serves, its health, version and Prometheus metrics.

One ``aiohttp.ClientSession`` per engine, so connections are reused across requests (a new
TCP connection per request would add its handshake to every TTFT). It must be made and
used on the engine's own event loop.

Tokens are counted from the stream itself: each completion chunk carries the ids of the
tokens new in it (``return_token_ids``, vLLM 0.10.2 and later), and a chunk without ids
counts as one token (a server streams one token per chunk). When the server also sends
``usage`` at the end, its ``completion_tokens`` is the count, and the difference goes on
the last chunk; so ``token_times`` has exactly as many entries as tokens were generated.

Each chunk is stamped when its bytes arrive, before it is parsed: with ``return_token_ids``
vLLM puts the whole prompt's ids in the first chunk (a 32k-token prompt's parse took 4.7 ms,
which was in TTFT). Those ids are counted in the raw line, never parsed, and lines are split
here, with no length limit: aiohttp's line reader refuses lines over 512 KiB (a prompt of
about 80k tokens), and its error aborted the whole replay.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from lorabench.targets import clock
from lorabench.targets.engine_requests import NEUTRAL_SAMPLING
from lorabench.targets.http import RequestFailed


@dataclass
class Chunk:
    """What one server-sent event of a completion stream says."""

    token_ids: list[int] = field(default_factory=list)
    count: int = 0  # tokens generated in this chunk (token_ids may be empty)
    finished: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # from the final usage event, when the server sends it
    # Prompt tokens found in the prefix cache: the usage's prompt_tokens_details, which vLLM
    # sends only when started with --enable-prompt-tokens-details.
    cached_tokens: int | None = None
    # When its bytes reached this process, on the replay's clock (``lorabench.targets.clock``), before any parsing.
    arrived: float = 0.0


# The prompt's ids in a chunk: a flat list of integers, counted where it stands and left out of the parse.
PROMPT_IDS = re.compile(rb'"prompt_token_ids"\s*:\s*\[([^\]]*)\]')


def parse_event(line: bytes) -> dict[str, Any] | None:
    """The JSON of one ``data:`` line; None for comments, blank lines and ``[DONE]``. A list of
    prompt ids is replaced by its length, under ``prompt_token_count``."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    payload = line[len(b"data:") :].strip()
    if payload == b"[DONE]" or not payload:
        return None
    found = PROMPT_IDS.search(payload)
    if found is None:
        return json.loads(payload)
    ids = found.group(1).strip()
    count = ids.count(b",") + 1 if ids else 0
    payload = payload[: found.start()] + b'"prompt_token_count": %d' % count + payload[found.end() :]
    return json.loads(payload)


async def sse_lines(content: aiohttp.StreamReader) -> AsyncIterator[tuple[bytes, float]]:
    """The stream's lines, each with the time its last bytes arrived: split here, so that a line
    of any length is read (aiohttp's own line reader stops at 512 KiB)."""
    pending = b""
    async for data in content.iter_any():
        arrived = clock.now()
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line, arrived
    if pending:
        yield pending, clock.now()


def chunk_of(event: dict[str, Any]) -> Chunk:
    """A completion event as a ``Chunk``: its choice's tokens, whether it finished, usage."""
    chunk = Chunk()
    if "error" in event:
        raise RequestFailed(f"the server sent an error mid-stream: {event['error']}")
    choices = event.get("choices") or []
    if choices:
        choice = choices[0]
        chunk.token_ids = list(choice.get("token_ids") or [])
        chunk.count = len(chunk.token_ids) if "token_ids" in choice else 1
        chunk.finished = choice.get("finish_reason") is not None
        if choice.get("prompt_token_ids") is not None:
            chunk.prompt_tokens = len(choice["prompt_token_ids"])
        elif "prompt_token_count" in choice:
            chunk.prompt_tokens = choice["prompt_token_count"]
    usage = event.get("usage")
    if usage:
        chunk.completion_tokens = usage.get("completion_tokens")
        chunk.prompt_tokens = usage.get("prompt_tokens", chunk.prompt_tokens)
        chunk.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return chunk


def completion_body(
    model: str, prompt: list[int] | str, max_tokens: int, temperature: float, cache_salt: str | None = None
) -> dict[str, Any]:
    """A streamed completion of exactly ``max_tokens`` tokens, sampled as in process: every
    setting a server would otherwise take from the model's generation config is given."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": temperature,
        **NEUTRAL_SAMPLING,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


class Client:
    """One server's API, on one connection pool."""

    def __init__(self, url: str, silent_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        # No bound on a whole stream: a request queued or streaming long under overload is
        # the engine's answer, and a replay's drain bounds it as it does in process (a total
        # bound failed it, and a capacity search stopped as if the server were broken).
        # A server silent for ``silent_s`` on an open stream, or not accepting, has failed it.
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=60.0, sock_read=silent_s)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No limit on connections: an online replay keeps one stream open per request in flight.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=self.timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, path: str, timeout_s: float = 10.0) -> tuple[int, str]:
        """Status and body of ``GET path``."""
        async with self.session.get(self.url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return resp.status, await resp.text()

    async def post(self, path: str, body: dict[str, Any], timeout_s: float = 300.0) -> str:
        """``POST path`` with a JSON body; ``RequestFailed`` unless the server answers 200."""
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with self.session.post(self.url + path, json=body, timeout=timeout) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RequestFailed(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        if resp.status != 200:
            raise RequestFailed(f"POST {path} answered {resp.status}: {text[:300]}", resp.status, text)
        return text

    async def models(self) -> list[dict[str, Any]]:
        """What ``/v1/models`` lists: the base model, and each adapter (with its ``parent``)."""
        status, body = await self.get("/v1/models")
        if status != 200:
            raise RequestFailed(f"GET {self.url}/v1/models answered {status}: {body[:200]}")
        return list(json.loads(body).get("data", []))

    async def version(self) -> str:
        """The server's version from ``/version``; "" where it has none."""
        try:
            status, body = await self.get("/version")
            return str(json.loads(body).get("version", "")) if status == 200 else ""
        except (aiohttp.ClientError, ValueError, TimeoutError):
            return ""

    async def healthy(self) -> bool:
        try:
            status, _ = await self.get("/health", timeout_s=5.0)
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False
        return status == 200

    async def complete(
        self, model: str, prompt: list[int] | str, max_tokens: int, temperature: float, cache_salt: str | None = None
    ) -> AsyncIterator[Chunk]:
        """Stream one completion of exactly ``max_tokens`` tokens; ``RequestFailed`` on an
        error status, an error event, or a stream that ends before it finished. A
        ``cache_salt`` keeps it off every cached prefix not salted alike (vLLM's API field)."""
        body = completion_body(model, prompt, max_tokens, temperature, cache_salt)
        try:
            async with self.session.post(self.url + "/v1/completions", json=body) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    raise RequestFailed(f"POST /v1/completions for {model!r} answered {resp.status}: {text}")
                finished = False
                async for line, arrived in sse_lines(resp.content):
                    event = parse_event(line)
                    if event is not None:
                        chunk = chunk_of(event)
                        chunk.arrived = arrived
                        finished = finished or chunk.finished
                        yield chunk
                if not finished:
                    raise RequestFailed(f"the stream for {model!r} ended before the completion finished")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise RequestFailed(f"POST /v1/completions for {model!r}: {type(exc).__name__}: {exc}") from exc
