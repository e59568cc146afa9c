"""docs/getting-started/cpu.md, run as written, so that the page cannot go stale.

Every ```bash block of the page runs, in order, from a copy of the repository's root (its
config, bench modules and test data), unless the line above it says otherwise:
``<!-- not run: REASON -->`` leaves it out (the set-up, which CI runs), and
``<!-- engine -->`` marks a block that runs the real vLLM (starts an engine, or imports
vLLM, as the doctor does): the quick loop runs the other blocks, ``pytest -m engine``
runs them all. ``lorabench`` and ``pytest`` in a block are
this checkout's, run by this interpreter.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "getting-started" / "cpu.md"
# What a block reads from the repository, copied so that a run writes nothing there.
COPIED = ("bench", "config", "tests/data", "pyproject.toml", "conftest.py")
MARK = re.compile(r"<!--\s*(not run|engine)\s*(?::\s*(.*?))?\s*-->")
FENCE = "```bash"


@dataclass(frozen=True)
class Block:
    line: int  # of the fence, 1-based
    kind: str  # "quick", "engine" or "not run"
    reason: str
    text: str


def read_blocks(page: Path) -> list[Block]:
    """The page's bash blocks with what the line above each says about running it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.strip() != FENCE:
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.search(above)
        kind, reason = (mark.group(1), mark.group(2) or "") if mark else ("quick", "")
        found.append(Block(i + 1, kind, reason, "\n".join(lines[i + 1 : end])))
    return found


def _shims(folder: Path) -> Path:
    """``lorabench`` and ``pytest`` commands that run this interpreter, so a block runs the
    checkout under test, whatever else is on PATH."""
    folder.mkdir()
    for name, module in (("lorabench", "lorabench"), ("pytest", "pytest")):
        shim = folder / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n', encoding="utf-8")
        shim.chmod(0o755)
    return folder


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of what the page's commands read, and the environment they run in."""
    repo = tmp_path / "repo"
    for name in COPIED:
        source, target = ROOT / name, repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(source, target)
    (repo / "results").mkdir()
    env = dict(os.environ)
    env["PATH"] = f"{_shims(tmp_path / 'bin')}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    return repo, env


def _run(block: Block, repo: Path, env: dict[str, str], timeout_s: float) -> None:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, (
        f"{PAGE.relative_to(ROOT)}:{block.line}: exit {done.returncode}\n{block.text}\n"
        f"--- stdout (tail)\n{done.stdout[-3000:]}\n--- stderr (tail)\n{done.stderr[-3000:]}"
    )


def test_every_block_is_run_or_says_why() -> None:
    blocks = read_blocks(PAGE)
    assert blocks, f"{PAGE} has no bash block"
    assert all(b.reason for b in blocks if b.kind == "not run"), "a block left out must say why"
    assert {b.kind for b in blocks} >= {"quick", "engine"}, "the page's first run is no longer tested"


@pytest.mark.parametrize("device", ["npu", "cuda"])
def test_accelerator_pages_say_why_their_blocks_do_not_run_here(device: str) -> None:
    """Their commands need the node; each block says so, and none is left unmarked by accident."""
    blocks = read_blocks(PAGE.with_name(f"{device}.md"))
    assert blocks and all(b.kind == "not run" and b.reason for b in blocks)


def test_read_blocks_follows_marks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- not run: needs a node -->\n```bash\na\n```\n\ntext\n\n```bash\nb\n```\n"
        "<!-- engine -->\n\n```bash\nc\n```\n",
        encoding="utf-8",
    )
    assert [(b.kind, b.reason, b.text) for b in read_blocks(page)] == [
        ("not run", "needs a node", "a"),
        ("quick", "", "b"),
        ("engine", "", "c"),
    ]


def test_cpu_page_quick_blocks(checkout: tuple[Path, dict[str, str]]) -> None:
    """The blocks that need no vLLM: a comparison of kept runs."""
    repo, env = checkout
    quick = [block for block in read_blocks(PAGE) if block.kind == "quick"]
    for block in quick:
        _run(block, repo, env, timeout_s=180)
    assert any("lorabench compare" in block.text for block in quick)


@pytest.mark.engine
@pytest.mark.vllm_processes  # the page as a user runs it, in vLLM's default
def test_cpu_page_first_run(checkout: tuple[Path, dict[str, str]]) -> None:
    """Every block that can run on the CPU, in the page's order: the smoke run and its page too."""
    repo, env = checkout
    for block in read_blocks(PAGE):
        if block.kind != "not run":
            _run(block, repo, env, timeout_s=900)
    assert (repo / "config" / "my.json").is_file()
    assert (repo / "results" / "first.csv").is_file()
    assert (repo / "results" / "first-report" / "index.html").is_file()
