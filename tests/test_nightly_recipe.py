"""The nightly recipes of docs/nightly.md, read as their runners read them, so that they
cannot go stale: the example workflow is valid YAML on a self-hosted NPU runner and not this
repository's CI, every ``lorabench`` command in it and in examples/nightly/nightly.sh parses
with lorabench's own parser, every ``--bench-*`` option they give pytest exists, and the
script is valid bash."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from lorabench.pytest_plugin.options import OPTIONS
from tests.helpers import ROOT
from tests.test_cli_convention import subcommands

EXAMPLES = ROOT / "examples" / "nightly"
WORKFLOW = EXAMPLES / "github-actions.yml"
SCRIPT = EXAMPLES / "nightly.sh"
OPERATORS = {"||", "&&", "|", ";", "&", ">", ">>", "2>&1"}


def _shell_lines(text: str) -> list[str]:
    """Shell lines with their continuations joined, comments left out."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def _commands(text: str, program: str) -> list[list[str]]:
    """Each call of ``program`` in the shell text: its words up to a shell operator."""
    found = []
    for line in _shell_lines(text):
        if not re.search(rf"(^|\s){program}\s", line):
            continue
        words = shlex.split(line, comments=True)
        for start in (i for i, word in enumerate(words) if word == program):
            rest = words[start + 1 :]
            end = next((i for i, word in enumerate(rest) if word in OPERATORS), len(rest))
            found.append(rest[:end])
    return found


def _workflow() -> dict:
    yaml = pytest.importorskip("yaml")  # PyYAML comes with vLLM
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def _workflow_shell() -> str:
    return "\n".join(step["run"] for job in _workflow()["jobs"].values() for step in job["steps"] if "run" in step)


def _parses(words: list[str]) -> None:
    parsers = subcommands()
    path = next((p for p in sorted(parsers, key=len, reverse=True) if tuple(words[: len(p)]) == p), None)
    assert path is not None, f"lorabench {shlex.join(words)}: no such subcommand"
    try:
        parsers[path].parse_args(words[len(path) :])
    except SystemExit as exc:
        pytest.fail(f"lorabench {shlex.join(words)}: its parser refused it (exit {exc.code})")


def test_the_workflow_runs_on_a_self_hosted_npu_runner_and_is_not_this_repositorys_ci():
    workflow = _workflow()
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "schedule" in triggers
    nightly = workflow["jobs"]["nightly"]
    assert {"self-hosted", "ascend-npu"} <= set(nightly["runs-on"])
    uses = [step.get("uses", "") for job in workflow["jobs"].values() for step in job["steps"]]
    assert any(u.startswith("actions/upload-pages-artifact@") for u in uses)
    assert any(u.startswith("actions/deploy-pages@") for u in uses)
    assert not (ROOT / ".github" / "workflows" / WORKFLOW.name).exists()


@pytest.mark.parametrize("source", ["workflow", "script"])
def test_every_lorabench_command_parses(source):
    text = _workflow_shell() if source == "workflow" else SCRIPT.read_text(encoding="utf-8")
    commands = _commands(text, "lorabench")
    assert {tuple(c[:2]) for c in commands} >= {("history", "add"), ("history", "check"), ("history", "report")}
    for words in commands:
        _parses(words)
    check = next(c for c in commands if c[:2] == ["history", "check"])
    assert "--max-age" in check and "--config" in check


@pytest.mark.parametrize("source", ["workflow", "script"])
def test_the_benchmark_is_run_with_options_the_plugin_has(source):
    text = _workflow_shell() if source == "workflow" else SCRIPT.read_text(encoding="utf-8")
    runs = [words for words in _commands(text, "pytest") if words[:1] == ["bench"]]
    assert runs, f"no pytest bench in the {source}"
    flags = {o.flag_name for o in OPTIONS.values()}
    for words in runs:
        given = {w.split("=")[0] for w in words if w.startswith("--bench")}
        assert given <= flags, given - flags
        assert "--bench-config" in given and "--bench-output" in given


def test_the_script_is_valid_bash_and_takes_a_lock_around_the_store():
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = SCRIPT.read_text(encoding="utf-8")
    assert re.search(r"^\s*flock\b", text, flags=re.M)
    assert SCRIPT.stat().st_mode & 0o111, "cron runs it as a program"
