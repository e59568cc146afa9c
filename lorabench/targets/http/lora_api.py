"""vLLM's runtime LoRA API over HTTP (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``):
how a client loads an adapter from disk and times it, where nothing lists the engine's caches.

vLLM 0.32's server gives a name it has not registered a new LoRA id and calls the engine's
``add_lora`` before it answers: a real read from disk into the CPU cache. An unload only drops
the name from the server's registry (no ``remove_lora``): the id stays in the CPU cache until
its LRU evicts it. So lorabench loads a fresh *alias* of an adapter (``NAME@lb<pid>-<n>``, the
adapter's own path, a new id) to time a load from disk, sends requests with the alias, and
unloads the alias after: ``load_alias`` and ``unload_alias`` touch no other name, nor do the
churn scenario's ``load_lora`` and ``unload_lora``, which load and drop aliases too.

The routes exist only on a server started with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` (the
serve target sets it): a 404 or 405 that is not vLLM's own error object says they are absent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lorabench.load.adapters import Adapter
from lorabench.targets.http.client import Client, RequestFailed

LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
FIX = "start the server with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 in its environment (the serve target sets it)"
# A name no server registers: unloading it asks whether the routes exist, and changes nothing.
PROBE_NAME = "lorabench-probe-no-such-adapter"


class RuntimeApiMissing(RuntimeError):
    """The server has no runtime LoRA API; the message names the fix."""


def missing_route(exc: RequestFailed) -> bool:
    """A 404 or 405 without vLLM's error object (``{"error": ...}``): the web framework's answer
    for a route the server lacks, not vLLM's for an adapter it lacks."""
    if exc.status not in (404, 405):
        return False
    try:
        return "error" not in json.loads(exc.body)
    except (ValueError, TypeError):
        return True


def served_adapters(models: Sequence[dict[str, Any]]) -> tuple[str | None, set[str]]:
    """The base model's served name and the adapters' names, from ``/v1/models``: vLLM lists
    an adapter with its base model as ``parent``."""
    base = next((m["id"] for m in models if not m.get("parent")), None)
    return base, {m["id"] for m in models if m.get("parent")}


def server_paths(models: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Each served adapter's path on the server (``/v1/models``' ``root``): what a load must
    name, since the client's own path may not exist where the server runs."""
    return {m["id"]: m["root"] for m in models if m.get("parent") and m.get("root")}


class RuntimeLoras:
    """A part of ``lorabench.targets.http.engine.HttpEngine``, which gives ``client``, ``run`` (a
    coroutine on its loop), ``endpoint`` and ``paths`` (``server_paths`` of its server)."""

    client: Client | None
    run: Callable[[Any], Any]
    endpoint: str | None
    paths: dict[str, str]
    _churned: dict[str, str]  # adapter name -> the alias load_lora registered for it
    _aliases = itertools.count(1)

    def server_path(self, adapter: Adapter) -> str:
        """Where the server reads ``adapter`` from: its ``root``, else the config's path."""
        return self.paths.get(adapter.name) or str(adapter.path)

    async def _post(self, route: str, body: dict[str, Any]) -> None:
        try:
            await self.client.post(route, body)
        except RequestFailed as exc:
            if missing_route(exc):
                raise RuntimeApiMissing(
                    f"the server at {self.endpoint} has no runtime LoRA API (POST {route} answered {exc.status}): "
                    + FIX
                ) from exc
            raise

    def runtime_api_missing(self) -> str | None:
        """Why the runtime API cannot be used, or None: an unload of a name no server has
        answers vLLM's 404 where the routes exist, the framework's 404 where they do not."""

        async def probe() -> None:
            try:
                await self._post(UNLOAD, {"lora_name": PROBE_NAME})
            except RequestFailed:
                pass  # vLLM's own "cannot be found": the route is there

        try:
            self.run(probe())
        except RuntimeApiMissing as exc:
            return str(exc)
        return None

    def alias_of(self, adapter: Adapter) -> Adapter:
        """``adapter`` under a name no server has registered: a new LoRA id, so a real load."""
        name = f"{adapter.name}@lb{os.getpid()}-{next(self._aliases)}"
        return dataclasses.replace(adapter, name=name, path=Path(self.server_path(adapter)))

    def load_alias(self, adapter: Adapter) -> tuple[Adapter, float]:
        """A fresh alias of ``adapter`` loaded from disk through the API, and the seconds the
        call took as this client sees it (one local round trip more than the engine's load)."""
        alias = self.alias_of(adapter)

        async def load() -> float:
            start = time.perf_counter()
            await self._post(LOAD, {"lora_name": alias.name, "lora_path": str(alias.path)})
            return time.perf_counter() - start

        return alias, self.run(load())

    def unload_alias(self, alias: Adapter) -> None:
        """Drop an alias from the server's registry (its id stays in the CPU cache until evicted)."""
        self.run(self._post(UNLOAD, {"lora_name": alias.name}))

    def time_alias_loads(self, adapters: Sequence[Adapter]) -> list[float]:
        """Seconds of each adapter's alias load, each timed alone and unloaded after."""
        times = []
        for adapter in adapters:
            alias, seconds = self.load_alias(adapter)
            self.unload_alias(alias)
            times.append(seconds)
        return times

    def register(self, adapter: Adapter) -> None:
        """Serve an adapter from its folder on this machine under its name (the isolation
        canaries' own folders: the server must share this machine's disk); one the server
        still serves under that name (a run stopped midway) is unloaded first."""

        async def load() -> None:
            with contextlib.suppress(RequestFailed):  # vLLM's 404: nothing served by that name
                await self._post(UNLOAD, {"lora_name": adapter.name})
            await self._post(LOAD, {"lora_name": adapter.name, "lora_path": str(adapter.path)})

        self.run(load())

    def reload_in_place(self, adapter: Adapter) -> None:
        """Load ``adapter`` again from its folder under its name and LoRA id (vLLM's
        ``load_inplace``), replacing the weights the server holds."""
        body = {"lora_name": adapter.name, "lora_path": str(adapter.path), "load_inplace": True}
        self.run(self._post(LOAD, body))

    def remove_adapter(self, adapter: Adapter) -> None:
        """Stop serving an adapter ``register`` added (vLLM 0.32 keeps its id in the CPU cache)."""
        self.run(self._post(UNLOAD, {"lora_name": adapter.name}))

    async def load_lora(self, adapter: Adapter) -> None:
        """A fresh alias of ``adapter`` loaded from disk while requests are served (the churn
        scenario times it), remembered until ``unload_lora`` drops it."""
        alias = self.alias_of(adapter)
        await self._post(LOAD, {"lora_name": alias.name, "lora_path": str(alias.path)})
        self._churned[adapter.name] = alias.name

    async def unload_lora(self, adapter: Adapter) -> None:
        """Drop the alias ``load_lora`` registered for ``adapter``; without one, nothing: the
        server's own registration of the name is never touched."""
        name = self._churned.pop(adapter.name, None)
        if name is not None:
            await self._post(UNLOAD, {"lora_name": name})
