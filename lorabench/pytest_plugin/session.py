"""What the plugin keeps for one pytest session, in ``config.stash``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lorabench.config import BenchConfig, ConfigError, ConfigFile, read_config_file
from lorabench.config.target import Target, chosen_target
from lorabench.host.device import Platform
from lorabench.measure.correctness import DigestBook
from lorabench.measure.wallclock import WallClock
from lorabench.results.files import ResultWriter
from lorabench.results.progress import RunProgress


@dataclass
class BenchState:
    config_path: Path
    output: str | None
    builds: int | None  # --bench-builds: overrides the config's matrix.builds
    target_option: Target | None = None  # --bench-target: overrides the config's target
    file: ConfigFile | None = None
    config: BenchConfig | None = None
    problems: list[str] = field(default_factory=list)
    platform: Platform | None = None
    backend: Any = None  # what builds the engines (lorabench.targets.engine.VllmBackend unless a hook says otherwise)
    skip_reason: str | None = None
    refused: bool = False  # the benchmark cases were refused (under pytest-xdist): a usage error
    provenance: dict[str, Any] = field(default_factory=dict)
    writer: ResultWriter | None = None
    built: list[tuple[str, float]] = field(default_factory=list)
    rss_after_teardown: list[tuple[str, float]] = field(default_factory=list)
    # Builds whose peak memory figure may be off (a device tool that failed to answer), and why.
    memory_notes: list[str] = field(default_factory=list)
    previous_sigterm: Any = None
    comparison: list[str] = field(default_factory=list)
    # Set when an engine's device memory did not come back after shutdown: later builds
    # would run on a partly held device, so they fail with this reason instead.
    unreleased: str | None = None
    digests: DigestBook = field(default_factory=DigestBook)
    report: Path | None = None  # the page --bench-report wrote
    report_error: str | None = None  # why --bench-report wrote no page: one line of the summary
    history: list[str] = field(default_factory=list)  # what --bench-history did: the summary's lines
    progress: RunProgress | None = None
    # Where the session's wall time goes (builds, measured work, warm-ups, the harness), from its start.
    clock: WallClock = field(default_factory=WallClock)
    # A fleet worker's columns for every row (its run id, its devices; lorabench.pytest_plugin.fleet_worker).
    fleet_columns: dict[str, Any] = field(default_factory=dict)
    # The cases skipped on optional builds, their earlier builds precise enough (build_stops): (test, build id).
    build_stops: list[tuple[str, str]] = field(default_factory=list)
    failed_builds: list[str] = field(default_factory=list)  # the engine builds that failed
    # A fleet driver's lines of the summary (lorabench.pytest_plugin.fleet_driver); empty in any other session.
    fleet: list[str] = field(default_factory=list)

    def read_file(self) -> ConfigFile | None:
        """The parsed config file, read once; problems are kept for the usage error."""
        if self.file is None and not self.problems:
            try:
                self.file = read_config_file(self.config_path)
            except ConfigError as exc:
                self.problems.extend(exc.problems)
        return self.file

    @property
    def target(self) -> Target:
        """Where this session's requests go: --bench-target, else the config's ``target``."""
        return chosen_target(self.target_option, self.file.target if self.file is not None else None)


STATE = pytest.StashKey[BenchState]()
