"""``multilora``: the requests of a batch name adapters, chosen by the workload
(distinct, uniform, skewed, identical, or mixed with base-model requests). Each row
also carries its overhead against the same batch with no adapter on the same build."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from lorabench.load.workload import base_requests
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario
from lorabench.scenarios.batch import (
    COLUMNS,
    COUNTED_COLUMNS,
    INTERVAL_COLUMNS,
    LORA_COLUMNS,
    MIXED_COLUMNS,
    PRECISION_COLUMNS,
    PREFIX_COLUMNS,
    SKEWED_COLUMNS,
    run_batch,
)

if TYPE_CHECKING:
    from lorabench.config import ConfigFile
    from lorabench.targets.engine import Engine


class MultiLora(Scenario):
    name = "multilora"
    sequential_builds = True
    columns = COLUMNS | LORA_COLUMNS
    maybe_columns = (
        MIXED_COLUMNS | SKEWED_COLUMNS | PREFIX_COLUMNS | COUNTED_COLUMNS | PRECISION_COLUMNS | INTERVAL_COLUMNS
    )

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        share = file.matrix.mixed_base_share
        cases = []
        for workload in file.matrix.workloads:
            for size in file.matrix.batch_sizes:
                marks = []
                if workload == "mixed" and not base_requests(size, share):
                    reason = f"the mixed workload needs batch size 2 or more (a base and a LoRA request), got {size}"
                    marks.append(pytest.mark.skip(reason=reason))
                cases.append(pytest.param(workload, size, marks=marks, id=f"{workload}-bs{size}"))
        return [Parametrization("workload,batch_size", cases)]

    def run(self, ctx: Context, engine: Engine, *, workload: str, batch_size: int) -> Outcome:  # type: ignore[override]
        return run_batch(ctx, engine, batch_size, workload)


SCENARIO = MultiLora()
