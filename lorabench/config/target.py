"""Where the benchmark's requests go: an in-process engine (the default), a ``vllm serve``
lorabench starts itself, or a server that already runs at a URL.

The config's ``target`` field and ``--bench-target`` (which wins) say the same thing:
``inprocess``, ``serve``, or ``{"url": "http://host:port"}`` (on the command line, the URL
itself).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

INPROCESS, SERVE, URL = "inprocess", "serve", "url"
KINDS = (INPROCESS, SERVE, URL)


@dataclass(frozen=True)
class Target:
    kind: str = INPROCESS
    url: str | None = None

    @property
    def over_http(self) -> bool:
        return self.kind != INPROCESS

    @property
    def on_this_machine(self) -> bool:
        """In process, a server lorabench starts, or a URL on a loopback address: a server that
        reads this machine's disk (folders lorabench writes for it)."""
        if self.kind != URL:
            return True
        host = urlparse(self.url or "").hostname or ""
        try:
            return host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:  # a name other than localhost: a machine of its own
            return False


def check_url(url: str) -> str:
    """``url`` without a trailing slash; ``ValueError`` saying what a URL target looks like."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{url!r} is not a server's URL: write it as http://host:port")
    try:
        port = parsed.port  # urllib checks the port when it is read
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"{url!r} has no valid port: write it as http://host:port, the port 1-65535")
    if parsed.path.rstrip("/"):
        raise ValueError(f"{url!r} has a path: give the server's root, http://host:port (lorabench adds /v1/...)")
    return url.rstrip("/")


def parse_target(text: str) -> Target:
    """``--bench-target``'s value: inprocess, serve, or a URL."""
    if text in (INPROCESS, SERVE):
        return Target(text)
    if "://" in text:
        return Target(URL, check_url(text))
    raise ValueError(f"expected inprocess, serve or a server's URL such as http://127.0.0.1:8000, got {text!r}")


def target_of(value: Any) -> Target:
    """The config field's value (a validated ``target``) as a ``Target``."""
    if isinstance(value, str):
        return Target(value)
    return Target(URL, check_url(value.url))


def chosen_target(option: Target | None, configured: Any | None) -> Target:
    """Where a run's requests go: ``--bench-target`` (``lorabench doctor --target``) over the
    config's ``target`` field, else in process."""
    if option is not None:
        return option
    return target_of(configured) if configured is not None else Target()
