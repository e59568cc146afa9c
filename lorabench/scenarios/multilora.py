"""``multilora``: the requests of a batch name adapters, chosen by the workload
(distinct, uniform, skewed, identical, or mixed with base-model requests). Each row
also carries its overhead against the same batch with no adapter on the same build."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorabench.scenarios.base import Outcome, Parametrization, Scenario
from lorabench.scenarios.batch import COLUMNS, MIXED_COLUMNS, OVERHEAD_COLUMNS, batch_sizes, run_batch

if TYPE_CHECKING:
    from lorabench.case import BenchCase
    from lorabench.config import ConfigFile
    from lorabench.engine import Engine


class MultiLora(Scenario):
    name = "multilora"
    columns = COLUMNS | OVERHEAD_COLUMNS
    maybe_columns = MIXED_COLUMNS

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        workloads = file.matrix.workloads
        return [Parametrization("workload", workloads, workloads), batch_sizes(file)]

    def run(self, case: BenchCase, engine: Engine, *, workload: str, batch_size: int) -> Outcome:  # type: ignore[override]
        return run_batch(case, engine, batch_size, workload)


SCENARIO = MultiLora()
