"""What every section of the configuration document shares: a frozen model that refuses
keys it does not declare, and the check that a list names each value once."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

# A random seed, as numpy and vLLM take one.
SEED_MAX = 2**32 - 1
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]


class Strict(BaseModel):
    # No infinite or NaN figure anywhere: a rate or an SLO of Infinity is bad input, not a case.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def unique(value: Any, why: str = "each value makes its own cases") -> Any:
    """``value``, unless it is a list that repeats a value (``why`` says why that is wrong)."""
    if not isinstance(value, list):
        return value
    texts = [json.dumps(v, sort_keys=True) for v in value]
    repeated = sorted({t for t in texts if texts.count(t) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} listed more than once: {why}")
    return value
