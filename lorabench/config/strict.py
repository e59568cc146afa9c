"""What every section of the configuration document shares: a frozen model that refuses
keys it does not declare, and the check that a list names each value once."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def unique(value: Any) -> Any:
    """``value``, unless it is a list that repeats a value: each value makes its own cases."""
    if not isinstance(value, list):
        return value
    texts = [json.dumps(v, sort_keys=True) for v in value]
    repeated = sorted({t for t in texts if texts.count(t) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} listed more than once: each value makes its own cases")
    return value
