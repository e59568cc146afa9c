"""Where a row comes from: the harness commit, the host, the device, the installed stack,
and the A/B pair a session belongs to (``lorabench ab`` names it in the environment)."""

from __future__ import annotations

import os
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lorabench.host.device import Platform, commit_ids, cpu_name, driver_versions, stack_versions

PAIR_ENV = "LORABENCH_AB_PAIR"


def pair_from_env() -> int | None:
    """The A/B pair index ``lorabench ab`` gave this session, or None outside A/B mode."""
    text = os.environ.get(PAIR_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"{PAIR_ENV}={text!r}: expected a pair index such as 3 (set by lorabench ab; unset it)")
    return int(text)


def git_state(root: Path) -> tuple[str, bool]:
    """The harness checkout's commit and whether it has uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "", False
    return commit, bool(status.strip())


# The host name rows carry, where the system's is not a stable one (docs/history.md).
HOSTNAME_ENV = "LORABENCH_HOSTNAME"


def provenance(root: Path, platform: Platform, model: str) -> dict[str, Any]:
    commit, dirty = git_state(root)
    versions = stack_versions()
    return {
        # Tells one session's rows from another's in a fixed output file.
        "run_id": f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S.%fZ}-{os.getpid()}",
        "git_commit": commit,
        "git_dirty": dirty,
        # A container's name changes every run; the history keeps one series per host name.
        "hostname": os.environ.get(HOSTNAME_ENV) or socket.gethostname(),
        "device_type": platform.device_type,
        "device_name": platform.device_name,
        **versions,
        **commit_ids(versions),
        **driver_versions(platform.device_type),
        "cpu_model": cpu_name(),
        "device_count": platform.device_count,
        "model": model,
        "ab_pair": pair_from_env(),
    }


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
