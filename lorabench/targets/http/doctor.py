"""``lorabench doctor`` with a server at a URL as the target (``--target URL`` or the
config's ``target``, as a run takes them).

Such a run builds no engine on this host: the server holds the device, which may well be
this host's, full to ``gpu_memory_utilization``. So the device-memory and engine-build
checks (vLLM's platform and stack, CANN, the start method) say nothing about it, and are
left out with a line that says why. What does stop such a run is checked instead, the way
the run itself checks it before its first case: the server answers ``/health``, and for
each engine configuration of the config, the build a run would make of it
(``lorabench.targets.http.engine.HttpEngine``): its ``/v1/models`` serves the config's adapters,
one of them answers a token, and its LoRA settings, where it says them, are the
configuration's.
"""

from __future__ import annotations

import asyncio

from lorabench.config import BenchConfig, engine_specs
from lorabench.config.target import Target
from lorabench.host.doctor import FAIL, NOTE, OK, Finding


def at_url(config: BenchConfig | None, target: Target) -> list[Finding]:
    """The line saying which checks are left out, then what stops a run at ``target``."""
    skipped = Finding(
        OK,
        f"target {target.url}: the server builds the engine, not this process, so this host's device memory, "
        "vLLM's platform and stack, CANN and the start method are not checked (the server's are its own)",
    )
    if not asyncio.run(_healthy(target.url or "")):
        fix = "start the server (lorabench serve-command --engine NAME prints its command), or give its URL"
        return [skipped, Finding(FAIL, f"{target.url} does not answer /health", fix)]
    if config is None:
        return [skipped, Finding(OK, f"{target.url} answers /health; no config: its adapters are not checked")]
    return [skipped, *_configurations(config, target)]


async def _healthy(url: str) -> bool:
    from lorabench.targets.http.client import Client  # aiohttp: imported only when a server is the target

    client = Client(url)
    try:
        return await client.healthy()
    finally:
        await client.close()


def _configurations(config: BenchConfig, target: Target) -> list[Finding]:
    """Each engine configuration built against the server as a run builds it; a server is
    one of them (a run picks it with ``-k``), so one that matches is enough."""
    from lorabench.targets.http.backend import HttpBackend

    backend = HttpBackend(target, config.file.device)
    device_type = backend.platform().device_type
    matched: list[str] = []
    trusted = False
    refused: dict[str, str] = {}
    for spec in engine_specs(config.file, with_lora_off=False):
        try:
            with backend.engine(config, spec, device_type, None) as engine:
                matched.append(spec.name)
                trusted = trusted or engine.server_lora is None
        except Exception as exc:  # noqa: BLE001 - whatever stops the build is a finding, not a traceback
            refused[spec.name] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if not matched:
        fix = "start the server as one of the config's configurations (lorabench serve-command --engine NAME)"
        return [Finding(FAIL, f"{name}: {why}", fix) for name, why in refused.items()]
    served = f"{target.url} serves the config's {len(config.adapters)} adapters and runs {' or '.join(matched)}"
    found = [Finding(OK, served + (f" (select it with -k {matched[0]})" if refused else ""))]
    if trusted:
        found.append(
            Finding(
                NOTE,
                f"{target.url} does not say its max_lora_rank and max_cpu_loras (/server_info): taken on trust",
                "start it with VLLM_SERVER_DEV_MODE=1 to have them checked",
            )
        )
    return found
