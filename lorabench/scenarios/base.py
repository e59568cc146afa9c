"""What a scenario is: the contract between a scenario module, the plugin and the case runner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lorabench.schema import Sample

if TYPE_CHECKING:
    from lorabench.case import BenchCase
    from lorabench.config import ConfigFile
    from lorabench.engine import Engine


@dataclass(frozen=True)
class Parametrization:
    """One argument of a scenario's test, with the values the config gives it."""

    argname: str
    values: Sequence[Any]
    ids: Sequence[str]
    # Set when the config gives no value: the test is collected once and skipped with this reason.
    skip_reason: str | None = None


@dataclass
class Outcome:
    """What running one case produced: the scenario's own row fields and its samples."""

    fields: dict[str, Any]
    samples: list[Sample]
    adapter_load_s: float
    extra_info: dict[str, Any] = field(default_factory=dict)
    # Outputs of this case whose digest differs from their adapter's reference (residency tiers).
    digest_mismatches: int = 0


class Scenario:
    """A kind of benchmark case. Subclasses set the class attributes and implement both methods.

    ``name`` is what ``@pytest.mark.scenario(NAME)`` names; ``with_lora_off`` adds the
    engine with LoRA disabled to the LoRA configurations it runs on; ``needs_adapters``
    says whether the config must list adapters; ``columns`` are the optional result
    columns its rows fill, ``maybe_columns`` those some of its rows fill
    (``lorabench.schema.check_row`` holds it to that).
    """

    name: str = ""
    with_lora_off: bool = False
    needs_adapters: bool = True
    columns: frozenset[str] = frozenset()
    # Optional columns only some of its cases fill (the mixed workload's base/LoRA split).
    maybe_columns: frozenset[str] = frozenset()

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        """The test arguments besides ``engine``, from the config."""
        raise NotImplementedError

    def run(self, case: BenchCase, engine: Engine, **params: Any) -> Outcome:
        """Run one case on ``engine``; timed work goes through ``case.on_engine``."""
        raise NotImplementedError
