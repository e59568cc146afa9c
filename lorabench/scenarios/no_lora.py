"""``no_lora``: the batch with no adapter, on the LoRA-disabled engine and on every LoRA
engine, so the cost of merely enabling LoRA shows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario
from lorabench.scenarios.batch import (
    COLUMNS,
    INTERVAL_COLUMNS,
    PRECISION_COLUMNS,
    PREFIX_COLUMNS,
    batch_sizes,
    run_batch,
)

if TYPE_CHECKING:
    from lorabench.config import ConfigFile
    from lorabench.targets.engine import Engine


class NoLora(Scenario):
    name = "no_lora"
    sequential_builds = True
    with_lora_off = True
    needs_adapters = False
    needs = ("engine",)
    columns = COLUMNS
    maybe_columns = PREFIX_COLUMNS | PRECISION_COLUMNS | INTERVAL_COLUMNS

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        return [batch_sizes(file)]

    def run(self, ctx: Context, engine: Engine, *, batch_size: int) -> Outcome:  # type: ignore[override]
        return run_batch(ctx, engine, batch_size, workload=None)


SCENARIO = NoLora()
