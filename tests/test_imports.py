"""The package's layering, stated as import-linter contracts in pyproject.toml
([tool.importlinter]; docs/extending.md#layers draws them): checked here, so the quick loop
catches a breach, and shown to catch one on a copy of the package with breaches put in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package under ``root`` (found there first, not the installed one)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=root, env=env, capture_output=True, text=True)


def test_every_contract_is_kept():
    done = lint(ROOT)
    assert done.returncode == 0 and " 0 broken" in done.stdout, done.stdout + done.stderr


def test_the_contracts_catch_each_kind_of_breach(tmp_path):
    shutil.copytree(ROOT / "lorabench", tmp_path / "lorabench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    breaches = {
        # config reaching the machine (the vLLM-argument check once did, through vllm_args)
        "config/strict.py": "from lorabench.host import device",
        # a lower layer importing a face (ab once imported the pytest plugin's options)
        "results/stats.py": "from lorabench.pytest_plugin import options",
        # the command line imported by a module; an accelerator runtime in the process
        "load/workload.py": "def _lazy():\n    import lorabench.cli.main\n    import torch_npu",
        # a circle inside a layer, closed under TYPE_CHECKING
        "analysis/report/figures.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import lorabench.analysis.show"
        ),
    }
    for module, line in breaches.items():
        path = tmp_path / "lorabench" / module
        path.write_text(path.read_text() + "\n" + line + "\n")
    done = lint(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Contracts: 0 kept, 5 broken." in done.stdout, done.stdout
    for shown in (
        "lorabench.config.strict -> lorabench.host.device",
        "lorabench.results.stats -> lorabench.pytest_plugin.options",
        "lorabench.load.workload -> lorabench.cli.main",
        "lorabench.load.workload -> torch_npu",
        "No cycles are allowed in lorabench.analysis.",
    ):
        assert shown in done.stdout, (shown, done.stdout)
