"""What an A/B session runs, in which order and where: checked before anything starts.

A side is what a user switches between versions of vLLM, vllm-ascend or lorabench: a
Python interpreter (a virtual environment or conda env), the folder its pytest runs in
(a checkout), and environment variables. Each turn is one pytest session of one side
that builds every engine configuration once; a pair is one turn of each side.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

BASE, NEW = "base", "new"
# ab decides these for every turn; a selection that sets them would break the pairing.
RESERVED = ("--bench-config", "--bench-output", "--bench-builds", "--bench-compare")


class ABError(Exception):
    """Input that cannot be run; ``lorabench ab`` exits with status 2."""


@dataclass(frozen=True)
class Side:
    name: str  # base or new
    python: Path
    folder: Path
    env: dict[str, str]


def alternation(pairs: int) -> list[tuple[int, str]]:
    """ABBA...: pair 0 runs base then new, pair 1 new then base, and so on, so a drift that
    is linear in time adds as much to one side as to the other over every two pairs."""
    turns = []
    for pair in range(pairs):
        first, second = (BASE, NEW) if pair % 2 == 0 else (NEW, BASE)
        turns += [(pair, first), (pair, second)]
    return turns


def parse_env(values: list[str], flag: str) -> dict[str, str]:
    env = {}
    for value in values:
        name, sep, setting = value.partition("=")
        if not sep or not name or not name.replace("_", "").isalnum():
            raise ABError(f"{flag} {value!r}: expected NAME=VALUE, such as VLLM_USE_V1=1")
        env[name] = setting
    return env


def make_side(name: str, python: str, folder: str | None, env: list[str]) -> Side:
    """One side, its interpreter and folder checked; ``folder`` defaults to the current one."""
    flag = f"--{name}-python"
    found = shutil.which(python) if os.sep not in python else python
    path = Path(found or python).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ABError(f"{flag} {python}: no executable file there; give a virtual environment's bin/python")
    where = Path(folder).expanduser() if folder else Path.cwd()
    if not where.is_dir():
        raise ABError(f"--{name}-dir {folder}: no such folder; give the checkout the side's pytest runs in")
    # A venv's python is a link to the base interpreter; keep the link, or the venv is lost.
    return Side(name, path.absolute(), where.resolve(), parse_env(env, f"--{name}-env"))


def check_selection(pytest_args: list[str], pairs: int, config: str) -> Path:
    """The pytest arguments, pair count and config, checked; the config's absolute path,
    which both sides read, so they run the same matrix."""
    for arg in pytest_args:
        if arg.split("=")[0] == "--bench-fleet":
            raise ABError(
                f"{arg}: lorabench ab runs both sides of a pair on the same device, one turn at a time; a fleet "
                "would spread them over devices and measure the devices' difference: leave --bench-fleet out"
            )
        if arg.split("=")[0] in RESERVED:
            raise ABError(
                f"{arg}: lorabench ab sets {', '.join(RESERVED)} for every turn; give the config with --config "
                "and the number of pairs with --pairs"
            )
    if pairs < 1:
        raise ABError(
            f"--pairs {pairs}: run at least 1 pair; 2 can flag only large changes, 3 or more also remove a drift "
            "(default 6)"
        )
    path = Path(config).expanduser().resolve()
    if not path.is_file():
        raise ABError(f"--config {config}: no such file; give the benchmark configuration both sides run")
    return path


def check_comparison(thresholds: list[str], alpha: float) -> None:
    """The comparison's options, checked before the first turn: a bad one found after the
    session had cost all its turns (or, in bisect, every step, each recorded as skipped)."""
    from lorabench.analysis.compare import CompareError, parse_thresholds
    from lorabench.analysis.compare.options import parse_alpha

    try:
        parse_thresholds(thresholds)
    except CompareError as exc:
        raise ABError(str(exc)) from None
    try:
        parse_alpha(str(alpha))
    except ValueError as exc:
        raise ABError(f"--alpha {alpha}: {exc}") from None


def pytest_command(side: Side, pytest_args: list[str], config: Path, output: Path) -> list[str]:
    """One turn: the selection, with each engine configuration built once, into ``output``."""
    return [
        str(side.python),
        "-m",
        "pytest",
        *pytest_args,
        "--bench-config",
        str(config),
        "--bench-builds",
        "1",
        "--bench-output",
        str(output),
        "-p",
        "no:cacheprovider",
    ]
