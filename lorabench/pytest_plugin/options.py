"""lorabench's pytest options, each with its ini twin and one help text, and one resolver.

The comparison's own options (threshold, alpha) are declared once, in
``lorabench.analysis.compare.options``, and added both to ``lorabench compare`` and,
prefixed, to pytest (``--bench-compare-threshold``), so the two can never drift apart.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from lorabench.analysis.compare.options import ALPHA_HELP, NOISE_FROM_HELP, THRESHOLD_HELP, parse_alpha
from lorabench.config.target import parse_target

if TYPE_CHECKING:
    from lorabench.config import ConfigFile

GROUP = ("lorabench", "multi-LoRA benchmarks on vLLM")
BAD_INPUT = 2  # the exit status of bad input, as the lorabench command line's (pytest's usage error is 4)


def _builds(text: str) -> int:
    try:
        builds = int(text)
    except ValueError:
        raise ValueError("expected a whole number such as 2") from None
    if builds < 1:
        raise ValueError("an engine configuration is built at least once; use 1 or more")
    return builds


LOCAL = "local"


def _pairs(text: str) -> int:
    pairs = _builds(text)
    if pairs < 2:
        raise ValueError("an interval needs at least 2 pairs")
    return pairs


def parse_precision(text: str) -> float:
    """``--bench-precision``: a relative half-width in percent, ``5%`` or ``5``, above 0 and below 100."""
    try:
        pct = float(text.strip().removesuffix("%"))
    except ValueError:
        raise ValueError("expected a percentage such as 5%") from None
    if not 0 < pct < 100:  # nan too
        raise ValueError("a relative half-width lies above 0 % and below 100 %, such as 5%")
    return pct


def parse_fleet(text: str) -> str:
    """``local``, ``auto`` or ``ray://HOST:PORT``."""
    text = text.strip()
    if text in (LOCAL, "auto"):
        return text
    if text.startswith("ray://"):
        host, colon, port = text.removeprefix("ray://").rpartition(":")
        if colon and host.strip("[]") and port.isdigit() and 0 < int(port) < 65536:
            return text
        raise ValueError(f"{text!r} is not a Ray client address: expected ray://HOST:PORT, such as ray://head:10001")
    raise ValueError("expected local, auto or a Ray address such as ray://head:10001")


@dataclass(frozen=True)
class Option:
    """One option: ``--bench-x`` on the command line, ``bench_x`` in the ini file."""

    name: str
    help: str
    metavar: str | None = None
    convert: Callable[[str], Any] | None = None
    path: bool = False  # a path: relative to the working directory on the command line, to the rootdir in the ini
    flag: bool = False
    repeat: bool = False
    ini_default: str = ""

    @property
    def flag_name(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS = {
    o.name: o
    for o in (
        Option("bench_config", "benchmark configuration (JSON)", "PATH", path=True, ini_default="config/common.json"),
        Option(
            "bench_output",
            "append results to this CSV instead of a new file per run under the config's results_dir",
            "PATH",
            path=True,
        ),
        Option(
            "bench_builds",
            "build each engine configuration N times, overriding the config's matrix.builds; "
            "lorabench compare needs 2 or more a side to test a change",
            "N",
            convert=_builds,
        ),
        Option(
            "bench_precision",
            "run each batch case's rounds, past matrix.rounds, until the 95-percent interval of its e2e_ms, "
            "ttft_ms and decode_ms is within PCT (such as 5) of each, or matrix.max_rounds ran; "
            "overrides matrix.precision_pct",
            "PCT",
            convert=parse_precision,
        ),
        Option(
            "bench_compare",
            "at the end, compare this run's results with BASE (a result CSV, or A.csv,B.csv)",
            "BASE",
            path=True,
        ),
        Option("bench_compare_fail", "fail the session when --bench-compare finds a regression", flag=True),
        Option("bench_compare_threshold", THRESHOLD_HELP, "[METRIC=]PCT", repeat=True),
        Option("bench_compare_alpha", ALPHA_HELP, "ALPHA", convert=parse_alpha),
        Option("bench_compare_noise_from", NOISE_FROM_HELP, "RUNS", path=True),
        Option(
            "bench_target",
            "where requests go: inprocess (vLLM in this process, the default), serve (lorabench starts "
            "vllm serve) or a running server's URL such as http://127.0.0.1:8000; overrides the config's target",
            "TARGET",
            convert=parse_target,
        ),
        Option(
            "bench_history",
            "at the end, add this run to the history database FILE (lorabench history; made if missing)",
            "FILE",
            path=True,
        ),
        Option(
            "bench_report",
            "at the end, draw this run's results as a page of figures in DIR/index.html",
            "DIR",
            path=True,
        ),
        Option(
            "bench_fleet",
            "run the engine configurations in parallel: local (one worker per device of this node) "
            "or a Ray cluster's address (ray://HOST:PORT, or auto); docs/fleet.md",
            "FLEET",
            convert=parse_fleet,
        ),
        Option(
            "bench_devices",
            "the devices of --bench-fleet local: 0,1,2 (indices), on the CPU 0-3,4-7 (a set of cores each); "
            "default: every visible device, on the CPU each NUMA node (one node: two halves of its cores)",
            "LIST",
        ),
        Option(
            "bench_fleet_check",
            "with --bench-fleet local: measure one configuration alone and beside its neighbours, "
            "alternated, and say whether a parallel run's rows compare with sequential ones",
            flag=True,
        ),
        Option(
            "bench_fleet_check_pairs",
            "the alone/beside pairs of --bench-fleet-check; each builds the configuration 1 + workers times",
            "N",
            convert=_pairs,
            ini_default="3",
        ),
        Option(
            "bench_fleet_worker", "internal: the folder of the fleet task this session runs (set by the driver)", "DIR"
        ),
    )
}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup(*GROUP)
    for o in OPTIONS.values():
        if o.flag:
            group.addoption(o.flag_name, action="store_true", default=None, help=o.help)
            parser.addini(o.name, o.help, type="bool", default=False)
        elif o.repeat:
            group.addoption(o.flag_name, action="append", metavar=o.metavar, help=o.help)
            parser.addini(o.name, o.help, type="linelist", default=[])
        else:
            shown = f"{o.help} (default: {o.ini_default})" if o.ini_default else o.help
            group.addoption(o.flag_name, metavar=o.metavar, help=shown)
            parser.addini(o.name, shown, default=o.ini_default)


class BadOption(ValueError):
    """An option's value that cannot be used; its message names where it came from and the fix."""


def value(config: pytest.Config, name: str) -> Any:
    """The command-line value, else the ini value, else None; converted, or BadOption
    naming where the bad value came from."""
    o = OPTIONS[name]
    raw = config.getoption(name)
    source = f"{o.flag_name} {raw}"
    if raw is None or raw == []:
        raw = config.getini(name)
        source = f"{config.inipath}: ini option {name} = {raw}"
        if raw in ("", []):
            return None
        if o.path:  # each of A.csv,B.csv from the rootdir, as the ini file is read from anywhere below it
            raw = ",".join(str(config.rootpath / part) for part in raw.split(","))
    if o.flag or o.repeat or o.convert is None:
        return raw
    try:
        return o.convert(raw)
    except ValueError as exc:
        raise BadOption(f"{source}: {exc}") from None


def checked(config: pytest.Config, name: str, problems: list[str]) -> Any:
    """``value``, with a bad one kept in ``problems`` (refused once collection ends) and None."""
    try:
        return value(config, name)
    except BadOption as exc:
        problems.append(str(exc))
        return None


def refuse(problems: list[str]) -> NoReturn:
    """Stop the session before any engine starts: each problem one line on stderr (it names
    the file, field, value and fix), exit status 2, as every bad input of lorabench. Called
    from a collection hook, not from pytest_configure, where pytester's in-process runs
    cannot take an exit status of 2 (pytest's own for an interrupted session)."""
    for problem in problems:
        print(f"lorabench: {problem}", file=sys.stderr)
    pytest.exit(f"lorabench: bad input: nothing ran (exit status {BAD_INPUT})", returncode=BAD_INPUT)


def with_precision(config: pytest.Config, file: ConfigFile) -> ConfigFile:
    """The config with ``--bench-precision`` (else its ini twin) as ``matrix.precision_pct``:
    the option wins over the file, as ``--bench-builds`` over ``matrix.builds``. Its value was
    checked when the session was configured (``checked``)."""
    pct = value(config, "bench_precision")
    if pct is None:
        return file
    return file.model_copy(update={"matrix": file.matrix.model_copy(update={"precision_pct": pct})})


def lone_fleet_options(config: pytest.Config) -> list[str]:
    """The fleet's options where they would be ignored, each refused: without a fleet; the
    local fleet's devices with a Ray one (whose check ``fleet_driver`` refuses); the check's
    pairs without the check. A fleet worker's session is the driver's, checked there: it
    reads the user's ini file (a ``bench_devices`` there) without the fleet's flags."""
    if config.getoption("bench_fleet_worker"):
        return []
    fleet = config.getoption("bench_fleet") or config.getini("bench_fleet")
    if not fleet:
        alone = [OPTIONS[n].flag_name for n in ("bench_devices", "bench_fleet_check") if value(config, n)]
        found = [f"{flag}: only a fleet takes it; add --bench-fleet local (docs/fleet.md)" for flag in alone]
    elif fleet != LOCAL and value(config, "bench_devices"):
        found = [f"--bench-devices: only --bench-fleet local takes it, not {fleet}; Ray places the workers"]
    else:
        found = []
    if config.getoption("bench_fleet_check_pairs") and not value(config, "bench_fleet_check"):
        found.append("--bench-fleet-check-pairs: only --bench-fleet-check takes it; add that, or drop the pairs")
    return found
