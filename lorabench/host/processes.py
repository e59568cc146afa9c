"""The processes an engine starts: which they are, where their output goes, where they
run on the CPU, and who kills them if this process dies.

vLLM starts the engine core (and on some platforms a worker) as processes of their own,
and with the spawn start method Python's multiprocessing also starts a resource tracker
as a child of this process. That tracker serves the whole session, not one engine, and
Python relaunches it with a warning ("resource_tracker: process died unexpectedly") when
it is killed; so it is never counted among an engine's processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil

_TRACKER_MARK = "multiprocessing.resource_tracker"


def is_resource_tracker(proc: psutil.Process) -> bool:
    try:
        return any(_TRACKER_MARK in part for part in proc.cmdline())
    except psutil.Error:
        return False


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def started_since(before: set[int]) -> list[psutil.Process]:
    """This process's descendants that were not there in ``before``, the resource tracker aside."""
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in before and not is_resource_tracker(p)]


@contextlib.contextmanager
def output_to(path: Path | None) -> Iterator[None]:
    """Send what processes started in this block print (stdout and stderr) to ``path``.

    The engine's processes inherit file descriptors 1 and 2 when they start, so they keep
    writing to the file for their whole life; this process gets its own back at the end
    of the block. vLLM logs a failed build's real reason in those processes only.
    """
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)


# An exception line as Python prints it, possibly behind a log prefix:
# "(EngineCore_DP0 pid=42) ERROR 11-22 [core.py:1] RuntimeError: Cannot find any model weights with ..."
_EXCEPTION = re.compile(r"(?:^|\s)((?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit)):(.*?)\s*$")
# Wrappers that point elsewhere for the real reason.
_GENERIC = ("root cause", "failed to start", "initialization failed", "see stack trace", "see the log")


def root_cause(text: str) -> str:
    """The first specific exception in an engine's output: what vLLM, torch or safetensors
    actually said, rather than the wrapper that only says "see root cause above"."""
    lines = text.splitlines()
    found = []
    for i, match in enumerate(map(_EXCEPTION.search, lines)):
        if match:
            name, message = match.group(1), match.group(2).strip()
            # A message that starts on the next line (multiprocessing's, for one).
            message = message or next((line.strip() for line in lines[i + 1 :] if line.strip()), "")
            found.append((name, message))
    specific = [f"{name}: {message}" for name, message in found if not any(g in message.lower() for g in _GENERIC)]
    if specific:
        return specific[0]
    return f"{found[-1][0]}: {found[-1][1]}" if found else ""


def _set_affinity(process: psutil.Process, cpus: set[int]) -> None:
    """Every thread of ``process``: a process-wide call would move its main thread only."""
    for thread in process.threads():
        try:
            os.sched_setaffinity(thread.id, cpus)
        except OSError:  # the thread ended meanwhile
            pass


# Set to "off" (or 0, false, no) to leave every process where the OS puts it.
CPU_BINDING = "LORABENCH_CPU_BINDING"


def cpu_binding_on() -> bool:
    """Whether ``keep_off_worker_cpus`` binds: yes unless LORABENCH_CPU_BINDING is off."""
    return os.environ.get(CPU_BINDING, "on").strip().lower() not in ("off", "0", "false", "no")


def keep_off_worker_cpus(engine_processes: Sequence[psutil.Process]) -> Callable[[], None] | None:
    """Keep this process and the engine core off the cores vLLM bound its CPU workers to.

    vLLM's CPU backend binds each worker's OpenMP threads to cores and reserves the rest
    for the engine core and the front end, but it does not bind those two there (vLLM
    0.32). Left free, the engine core's busy loop sometimes lands on a worker's core and
    the build runs slower for as long as it stays there. Returns what undoes it for this
    process, so the next build starts from the full set of cores.

    With ``LORABENCH_CPU_BINDING=off`` in the environment it binds nothing and returns
    None, so a run can be compared with one that leaves the processes where the OS puts
    them (scripts/crosscheck_vllm_latency.py ``--binding off``, ``--compare-binding``).
    """
    if not cpu_binding_on():
        return None
    me = psutil.Process()
    allowed = set(os.sched_getaffinity(0))
    worker_cpus: set[int] = set()
    others = [me]
    for proc in engine_processes:
        try:
            cpus = set(proc.cpu_affinity())
        except psutil.Error:
            continue
        if cpus < allowed:
            worker_cpus |= cpus
        else:
            others.append(proc)
    rest = allowed - worker_cpus
    if not worker_cpus or not rest:
        return None
    for proc in others:
        try:
            _set_affinity(proc, rest)
        except psutil.Error:
            pass
    return lambda: _set_affinity(me, allowed)


# Blocks until its stdin closes (the engine was closed, or this process died, even by
# kill -9), then kills the engine's processes that are still running.
_REAPER = """
import sys, psutil
procs = []
for pid in sys.argv[1:]:
    try:
        procs.append(psutil.Process(int(pid)))
    except psutil.Error:
        pass
sys.stdin.read()
for proc in procs:
    try:
        proc.kill()
    except psutil.Error:
        pass
"""


def start_reaper(processes: Sequence[psutil.Process]) -> subprocess.Popen | None:
    if not processes:
        return None
    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, *(str(p.pid) for p in processes)],
        stdin=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C meant for pytest must not reach it first
    )


def first_gone(processes: Sequence[psutil.Process]) -> psutil.Process | None:
    """The first of ``processes`` that has exited (or is a zombie), if any."""
    for proc in processes:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return proc
        except psutil.NoSuchProcess:
            return proc
    return None
