"""lorabench over HTTP: an OpenAI-compatible server as the engine (``target``: ``serve``, or a
URL), with the same interface as the in-process ``Engine`` (see docs/serve.md)."""

from __future__ import annotations


class RequestFailed(RuntimeError):
    """One request got an error from the server, or its stream broke off; ``status`` and
    ``body`` are the server's answer where it gave one (which tells a route the server lacks,
    404 with no error object, from an error of vLLM's own). Here, not beside the client: a
    scenario catches it without importing aiohttp into every pytest session."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status, self.body = status, body
