"""The result schema: one declaration, everything else derived, no silent blanks."""

import dataclasses

import pytest

from lorabench.analysis.cases import REQUIRED_KEY
from lorabench.config import EngineSpec
from lorabench.results.naming import engine_name
from lorabench.results.records import SAMPLE_COLUMNS
from lorabench.results.schema import CASE_KEY, COLUMNS, ENGINE_KEY, SCENARIO_COLUMNS, ResultRow
from lorabench.results.schema_check import SchemaError, check_row
from lorabench.scenarios import SCENARIOS
from tests.helpers import make_row, make_sample


def test_columns_keys_and_ids_are_derived_from_the_declaration():
    assert COLUMNS == tuple(f.name for f in dataclasses.fields(ResultRow))
    assert set(CASE_KEY) <= set(COLUMNS) and set(ENGINE_KEY) <= set(CASE_KEY)
    assert {"model", "device_type", "scenario", "workload", "batch_size", "max_loras", "trace_rate"} <= set(CASE_KEY)
    assert "e2e_ms" not in CASE_KEY and "timestamp" not in CASE_KEY
    assert set(REQUIRED_KEY) == {"model", "device_type", "scenario", "workload", "enable_lora"}
    assert set(CASE_KEY) <= set(SAMPLE_COLUMNS), "every sample carries its case key"
    spec = EngineSpec(True, 8, 16, 8, build=1)
    assert spec.id == "loras8-rank16-cpu8-build1" == f"{engine_name(True, 8, 16, 8)}-build1"
    assert EngineSpec(False).id == "lora-off-build0"


def test_an_unknown_or_missing_field_raises():
    with pytest.raises(TypeError, match="e2e_msec"):
        make_row(e2e_msec=1.0)
    fields = dataclasses.asdict(make_row())
    del fields["engine_build_s"]
    with pytest.raises(TypeError, match="engine_build_s"):
        ResultRow(**fields)
    with pytest.raises(TypeError, match="ttft"):
        make_sample(ttft=1.0)


def test_a_row_fills_exactly_the_columns_its_scenario_declares():
    multilora = SCENARIOS["multilora"]
    declared = (multilora.columns, multilora.maybe_columns)
    check_row(make_row(), *declared)
    with pytest.raises(SchemaError, match="declared columns left blank: decode_ms_p99"):
        check_row(make_row(decode_ms_p99=None), *declared)
    with pytest.raises(SchemaError, match="columns filled but not declared: slo_attainment"):
        check_row(make_row(slo_attainment=0.9), *declared)
    # The LoRA knobs depend on the engine, not the scenario: blank on lora-off.
    check_row(make_row(enable_lora=False, max_loras=None, max_lora_rank=None, max_cpu_loras=None), *declared)


def test_every_scenario_declares_columns_of_the_schema():
    for scenario in SCENARIOS.values():
        assert scenario.columns <= SCENARIO_COLUMNS, scenario.name
        assert scenario.columns, scenario.name
