"""The fleet on a Ray cluster (``--bench-fleet ray://HOST:PORT`` or ``auto``): each engine
configuration x build is a Ray task asking for the accelerators one engine needs ("NPU",
which Ray knows on Ascend and hands out through ``ASCEND_RT_VISIBLE_DEVICES``, or "GPU"),
and Ray places it on a node that has them free.

The task runs the same worker as the local fleet (``lorabench.fleet.tasks``), in a folder of
its own on its node, with the session's interpreter and working directory: the nodes run
one environment (one image) with the checkout at the same path. Twice a second it sends
the folder's new results and reports to an inbox actor, which the driver empties into a
mirror of the folder in the run's logs: a node that is lost takes none of the rows it
sent. Ray is an optional extra (``pip install -e '.[fleet]'``), imported only here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lorabench.fleet.tasks import (
    LOG_FILE,
    REPORTS_FILE,
    STOP_WAIT_S,
    TASK_FILE,
    Attempt,
    Callbacks,
    Fleet,
    Task,
    worker_argv,
)
from lorabench.results.provenance import HOSTNAME_ENV

RESOURCES = {"npu": "NPU", "cuda": "GPU", "cpu": "CPU"}
SEND_EVERY_S = 0.5
CONNECT_TIMEOUT_S = 5.0
QUEUED = "(queued on the cluster)"


class RayInputError(ValueError):
    """A Ray fleet that cannot start: the message names the value and the fix."""


def import_ray(where: str) -> Any:
    try:
        import ray
    except ImportError:
        raise RayInputError(
            f"--bench-fleet {where}: Ray is not installed in this environment; install it with "
            "pip install -e '.[fleet]' on every node (docs/fleet.md#on-a-ray-cluster)"
        ) from None
    return ray


def connect(where: str) -> Any:
    """Join the cluster at ``where`` (``ray://HOST:PORT``, or ``auto``: ``RAY_ADDRESS`` or
    the cluster on this node); a cluster that does not answer is bad input."""
    ray = import_ray(where)
    if where.startswith("ray://"):
        host, _, port = where.removeprefix("ray://").rpartition(":")
        if why := _unanswered(host, port):
            raise RayInputError(
                f"--bench-fleet {where}: nothing answers there ({why}); give the head's Ray client address "
                "(ray start --head listens on port 10001)"
            )
    elif (recorded := _auto_address()) is not None and _unanswered(*recorded.rpartition(":")[::2]):
        # ray.init would retry a dead head for minutes: a cluster killed without `ray stop`
        # leaves its address in Ray's temp folder (/tmp/ray/ray_current_cluster).
        raise RayInputError(
            f"--bench-fleet {where}: the Ray cluster recorded at {recorded} (RAY_ADDRESS, or Ray's "
            "/tmp/ray/ray_current_cluster) does not answer: stopped without `ray stop`? Run ray stop, then start "
            "one (ray start --head) or name a live one: --bench-fleet ray://HEAD:10001"
        )
    try:
        ray.init(address=where, log_to_driver=False, logging_level="ERROR", namespace="lorabench")
    except Exception as exc:  # noqa: BLE001 - ray.init raises many kinds for a cluster it cannot join
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        # Ray's own advice names its command line's --address flag, which pytest has not.
        said = "no Ray cluster runs here or at RAY_ADDRESS" if "Could not find any running Ray" in first else first
        raise RayInputError(
            f"--bench-fleet {where}: {said}; start one (ray start --head) or name it: "
            "--bench-fleet ray://HEAD:10001, or RAY_ADDRESS=HEAD:6379 with auto"
        ) from None
    return ray


def _unanswered(host: str, port: str) -> str | None:
    """Why nothing accepted a connection at ``host:port`` within ``CONNECT_TIMEOUT_S``; None if something did."""
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__
    return None


def _auto_address() -> str | None:
    """The ``host:port`` that ``ray.init(address="auto")`` would join, found as Ray finds it;
    None where Ray finds none (ray.init then says so) or its way of finding it has moved."""
    try:
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address("auto")
    except Exception:  # noqa: BLE001 - Ray's private helper: any failure leaves the check to ray.init
        return None


def demand(device_type: str, per_engine: int) -> dict[str, Any]:
    """What one engine asks Ray for."""
    if device_type == "cuda":
        return {"num_gpus": per_engine}
    if device_type == "cpu":
        return {"num_cpus": per_engine}
    return {"num_cpus": 0, "resources": {RESOURCES[device_type]: per_engine}}


def check_fits(ray: Any, where: str, device_type: str, per_engine: int) -> None:
    """Bad input unless some node has ``per_engine`` of the engine's accelerator."""
    name = RESOURCES[device_type]
    most = max((n["Resources"].get(name, 0) for n in ray.nodes() if n.get("Alive")), default=0)
    if most < per_engine:
        raise RayInputError(
            f"--bench-fleet {where}: each engine needs {per_engine} {name} (engine.tensor_parallel_size x "
            f"pipeline_parallel_size) and no node of the cluster has more than {most:g}; declare them when "
            f"starting its nodes (ray start --resources '{{\"{name}\": 8}}') or lower the engine's"
        )


class RayFleet(Fleet):
    def __init__(
        self,
        ray: Any,
        asks: dict[str, Any],
        tasks: Sequence[Task],
        command: Sequence[str],
        cwd: Path,
        folder: Path,
        on: Callbacks,
    ) -> None:
        super().__init__(tasks, command, cwd, folder, on)
        self.ray = ray
        from ray.util.client import ray as client
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # On the driver's own node where it is one (not through Ray's client): it must outlive any worker node.
        here = None if client.is_connected() else ray.get_runtime_context().get_node_id()
        pinned = {"scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False)} if here else {}
        self.inbox = ray.remote(Inbox).options(num_cpus=0, **pinned).remote()
        self.remote = ray.remote(run_worker).options(max_retries=0, **asks)

    def start_what_can(self) -> None:
        """Every task at once: Ray holds each until a node has its accelerators free."""
        while self.queue:
            task = self.queue.pop(0)
            folder = task.folder(self.folder)
            folder.mkdir(parents=True, exist_ok=True)
            spec = task.spec(self.columns, "")
            ref = self.remote.remote(spec, list(self.command), str(self.cwd), folder.name, self.inbox)
            attempt = Attempt(task, QUEUED, folder, ref, time.time())
            self.attempts.append(attempt)
            self.running.append(attempt)

    def _take_mail(self) -> None:
        """Append what the workers sent to their folders' mirrors (the inbox lost with its
        node: every running worker is then as good as lost, and what came is kept)."""
        try:
            mail = self.ray.get(self.inbox.take.remote())
        except self.ray.exceptions.RayError:
            return
        by_folder = {a.folder.name: a for a in self.running}
        for name, hello, chunks in mail:
            attempt = by_folder.get(name)
            if attempt is None:
                continue
            for relative, data in chunks.items():
                path = attempt.folder / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "ab") as f:
                    f.write(data)
            if hello:
                attempt.where, attempt.node, attempt.started = hello["where"], hello["node"], hello["started"]
                self.announce(attempt)

    def poll(self) -> list[Attempt]:
        self._take_mail()
        refs = [a.handle for a in self.running]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        ended = [a for a in self.running if a.handle in ready]
        if ended:
            self._take_mail()  # what the worker sent before it returned
        for attempt in ended:
            try:
                done = self.ray.get(attempt.handle)
                attempt.code, attempt.ended = done["code"], done["ended"]  # on the node's clock, as its start
            except self.ray.exceptions.RayError:
                attempt.code, attempt.ended = None, time.time()  # the task, or its node, was lost
        return ended

    def stop_all(self) -> list[Attempt]:
        for attempt in self.running:
            self.ray.cancel(attempt.handle)  # a KeyboardInterrupt in the task, which stops its worker as Ctrl-C does
        self.ray.wait([a.handle for a in self.running], num_returns=len(self.running), timeout=STOP_WAIT_S)
        self._take_mail()
        for attempt in self.running:
            attempt.code, attempt.ended = None, time.time()
        return list(self.running)


class Inbox:
    """A Ray actor: what the workers sent, until the driver takes it."""

    def __init__(self) -> None:
        self.mail: list[tuple[str, dict | None, dict[str, bytes]]] = []

    def put(self, name: str, hello: dict | None, files: dict[str, bytes]) -> None:
        self.mail.append((name, hello, files))

    def take(self) -> list[tuple[str, dict | None, dict[str, bytes]]]:
        mail, self.mail = self.mail, []
        return mail


def _appended(folder: Path, sent: dict[Path, int], logs: bool) -> dict[str, bytes]:
    """What the folder's files gained since ``sent``: the results, records and reports up to
    their last whole line (a row being written is sent once it is whole); the logs at the end."""
    chunks = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if (path.suffix == ".log" and not logs) or "cache" in path.relative_to(folder).parts:
            continue
        with open(path, "rb") as f:
            f.seek(sent.get(path, 0))
            data = f.read()
        data = data if logs else data[: data.rfind(b"\n") + 1]
        if data:
            sent[path] = sent.get(path, 0) + len(data)
            chunks[str(path.relative_to(folder))] = data
    return chunks


def run_worker(spec: dict[str, Any], command: list[str], cwd: str, name: str, inbox: Any) -> dict[str, Any]:
    """A Ray task: one worker on the accelerators Ray gave this task, its folder sent to the inbox."""
    import ray

    context = ray.get_runtime_context()
    node = context.get_node_id()
    ids = {kind: v for kind, v in context.get_accelerator_ids().items() if v}
    devices = "; ".join(f"{kind.lower()} {','.join(v)}" for kind, v in ids.items()) or "cpu"
    # The node's name as the history keeps it (runs.NODE): the one LORABENCH_HOSTNAME gives a
    # container whose own name changes each start, as on a host of its own.
    where = f"{os.environ.get(HOSTNAME_ENV) or socket.gethostname()}:{node[:8]} {devices}"
    folder = Path(tempfile.mkdtemp(prefix=f"lorabench-{name}-"))
    (folder / TASK_FILE).write_text(json.dumps({**spec, "slot": where}), encoding="utf-8")
    (folder / REPORTS_FILE).touch()
    sent: dict[Path, int] = {}
    ray.get(inbox.put.remote(name, {"where": where, "node": node, "started": time.time()}, {}))
    with open(folder / LOG_FILE, "wb") as log:
        process = subprocess.Popen(
            worker_argv(command, folder), cwd=cwd, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        while process.poll() is None:
            time.sleep(SEND_EVERY_S)
            inbox.put.remote(name, None, _appended(folder, sent, logs=False))
    except KeyboardInterrupt:  # ray.cancel: stop the worker as Ctrl-C stops a session
        process.terminate()
        process.wait(STOP_WAIT_S)
    ray.get(inbox.put.remote(name, None, _appended(folder, sent, logs=True)))
    return {"code": process.returncode, "ended": time.time()}
