"""lorabench over HTTP: an OpenAI-compatible server as the engine (``target``: ``serve``, or a
URL), with the same interface as the in-process ``Engine`` (see docs/serve.md)."""
