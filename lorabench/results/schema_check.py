"""Rows held to the result schema: each scenario declares the optional columns it fills
(``Scenario.columns``), and a row that leaves one of them blank, or fills one it did not
declare, is refused."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from lorabench.results.schema import ENGINE_ONLY, SCENARIO_COLUMNS, ResultRow


class SchemaError(ValueError):
    """A row that does not fill exactly the columns its scenario declares."""


def check_declared(scenario: str, columns: Iterable[str]) -> None:
    """Refuse a scenario that declares a column that is not an optional one of ``ResultRow``:
    checked when the session starts, before any engine is built."""
    unknown = set(columns) - SCENARIO_COLUMNS
    if unknown:
        raise SchemaError(f"scenario {scenario} declares columns ResultRow does not have: {', '.join(sorted(unknown))}")


def check_row(row: ResultRow, declared: Iterable[str], maybe: Iterable[str] = ()) -> None:
    """Refuse a blank in a declared column and a value in an optional one neither declared
    nor ``maybe`` (filled by some cases of the scenario only, such as mixed batches).

    The LoRA knobs are left out: they are blank on the LoRA-disabled engine, whatever the
    scenario; so are the ``ENGINE_ONLY`` columns on an HTTP target.
    """
    declared, maybe = set(declared), set(maybe)
    if row.target not in (None, "inprocess"):
        declared, maybe = declared - ENGINE_ONLY, maybe - ENGINE_ONLY
    check_declared(row.scenario, declared | maybe)
    values = asdict(row)
    blank = sorted(c for c in declared if _blank(values[c]))
    extra = sorted(c for c in SCENARIO_COLUMNS - declared - maybe if not _blank(values[c]))
    parts = [
        f"{what}: {', '.join(cols)}"
        for what, cols in (("declared columns left blank", blank), ("columns filled but not declared", extra))
        if cols
    ]
    if parts:
        raise SchemaError(f"{row.scenario} row {row.test_id}: " + "; ".join(parts))


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value == "")
