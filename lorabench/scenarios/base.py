"""What a scenario is: the contract between a scenario module, the plugin and the case runner.

A scenario gets a small ``Context`` (the resolved config, the timer, the run's digests, a
way to keep records durable before its row, and a progress line) and the engine; it never
sees the case runner, which owns the row, the per-build preparation and what happens when
the engine dies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lorabench.measure.wallclock import MEASURED, WARMUPS, WallClock
from lorabench.results.records import Sample

if TYPE_CHECKING:
    from pathlib import Path

    from lorabench.config import BenchConfig, ConfigFile, EngineSpec
    from lorabench.measure.correctness import DigestBook
    from lorabench.targets.engine import Engine


@dataclass(frozen=True)
class Parametrization:
    """One argument of a scenario's test (or several, comma-separated, as pytest takes them),
    with the values the config gives it; a value may be a ``pytest.param`` with its own marks."""

    argname: str
    values: Sequence[Any]
    ids: Sequence[str] | None = None
    # Set when the config gives no value: the test is collected once and skipped with this reason.
    skip_reason: str | None = None


@dataclass
class Context:
    """What a scenario may use besides the engine."""

    config: BenchConfig
    # pytest-benchmark's fixture: the scenario's timed work goes through ``time``.
    benchmark: Any
    digests: DigestBook
    # Makes records durable as they come, before the case's row: ``keep(kind, records, fields)``,
    # ``fields`` the row's own fields known so far (its key among them); returns their file.
    # For records a case that fails midway must not lose (a capacity search's probes).
    keep: Callable[[str, Sequence[Any], Mapping[str, Any]], Path]
    # Writes a line to the terminal while the case runs (progress of a long replay).
    progress: Callable[[str], None] | None = None
    # The session's split of its wall time (lorabench.measure.wallclock).
    clock: WallClock = field(default_factory=WallClock)

    def time(self, work: Callable[[], None], *, rounds: int = 1, warmup_rounds: int = 0) -> None:
        """Run ``work`` as pytest-benchmark's pedantic mode does: warm-up rounds first. The
        last ``rounds`` calls are the session's measured work, the calls before them its
        warm-ups (with ``--benchmark-disable`` pedantic calls it once, unwarmed)."""
        took: list[float] = []

        def timed() -> None:
            start = time.perf_counter()
            try:
                work()
            finally:
                took.append(time.perf_counter() - start)

        try:
            self.benchmark.pedantic(timed, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1)
        finally:
            # By position: a warm-up that raised is a warm-up, not the measured round.
            warm = 0 if getattr(self.benchmark, "disabled", False) else warmup_rounds
            self.clock.add(WARMUPS, sum(took[:warm]))
            self.clock.add(MEASURED, sum(took[warm:]))


@dataclass
class Outcome:
    """What running one case produced: the scenario's own row fields and its samples."""

    fields: dict[str, Any]
    samples: list[Sample]
    extra_info: dict[str, Any] = field(default_factory=dict)
    # Outputs of this case whose digest differs from their adapter's reference (residency tiers).
    digest_mismatches: int = 0
    # Records kept in files of their own beside the samples, by kind (lorabench.results.files.REPLAY_FILES):
    # an online replay's engine timeline and per-adapter usage.
    records: dict[str, list[Any]] = field(default_factory=dict)
    # A finding (a broken isolation): the case's row and records are written, then it fails so.
    failure: str | None = None


class Scenario:
    """A kind of benchmark case. Subclasses set the class attributes and implement both methods.

    ``name`` is what ``@pytest.mark.scenario(NAME)`` names; ``with_lora_off`` adds the
    engine with LoRA disabled to the LoRA configurations it runs on; ``prefix_caching``, where
    set, turns vLLM's prefix caching on or off in every configuration it runs on, whatever the
    config says (the isolation scenario's engines cache); ``local_only`` skips its cases,
    saying so, on a URL target whose server is not on this machine (the scenario hands the
    server folders it writes here); ``needs_adapters`` says whether the config must list
    adapters; ``needs`` the vLLM features its cases use; ``columns`` are the optional result
    columns its rows fill, ``maybe_columns`` those some of its rows fill
    (``lorabench.results.schema_check.check_row`` holds it to that).
    """

    name: str = ""
    with_lora_off: bool = False
    prefix_caching: bool | None = None
    local_only: bool = False
    needs_adapters: bool = True
    # The vLLM features its cases need (``lorabench.targets.vllm_api.FEATURES``): an in-process
    # or served vLLM without one skips them before any build, saying which names it lacks.
    needs: tuple[str, ...] = ("engine", "lora")
    columns: frozenset[str] = frozenset()
    maybe_columns: frozenset[str] = frozenset()
    # Whether its cases stop early across builds with a precision target (pytest_plugin.build_stops).
    sequential_builds: bool = False

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        """The test arguments besides ``engine``, from the config."""
        raise NotImplementedError

    def builds(self, file: ConfigFile) -> int | None:
        """How many builds of each engine configuration its cases run on; None: ``matrix.builds``."""
        return None

    def variants_for(self, file: ConfigFile) -> tuple[str, ...]:
        """Variant builds its cases need beside the configurations' own (``lorabench.config.variants``)."""
        return ()

    def runs_on(self, spec: EngineSpec, params: dict[str, Any]) -> bool:
        """Whether the case with test arguments ``params`` runs on the build ``spec``: the
        plugin leaves the others out (deselected), as a variant build runs only its own checks."""
        return True

    def replay_s(self, file: ConfigFile, **params: Any) -> float:
        """The seconds of real-time replay one case spends, at most: the run's first time guess."""
        return 0.0

    def run(self, ctx: Context, engine: Engine, **params: Any) -> Outcome:
        """Run one case on ``engine``. A dead engine is the case runner's business."""
        raise NotImplementedError
