"""A turn's pytest process as ``lorabench ab`` runs it: waited for (and shut down with it on
Ctrl-C), its last line read, and whether a turn that exited 1 finished with findings only."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path


def findings_only(rc: int, result: Path, log: Path) -> bool:
    """A turn whose failed cases wrote their rows (a breach an isolation canary found: pytest
    exit 1) finished: the comparison judges its findings (as ``bisect --kind isolation`` asks).
    Not where a case crashed (one row fewer than pytest's passed and failed) or any error."""
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|errors?)\b", last_line(log)))
    if rc != 1 or not result.is_file() or "error" in counts or "errors" in counts or not counts.get("failed"):
        return False
    with result.open(encoding="utf-8") as rows:
        written = sum(1 for _ in rows) - 1
    return written == counts.get("passed", 0) + counts["failed"]


def wait(process: subprocess.Popen) -> int:
    """The turn's exit status. On Ctrl-C the turn gets SIGINT too (or is sent it) and is
    given time to shut its engine down, so no engine process outlives the session."""
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
        raise


def last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else "no output"
