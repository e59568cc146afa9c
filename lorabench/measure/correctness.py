"""Fast but wrong? A digest of each adapter's greedy output, which must not change.

Once per engine build, before its first LoRA case and outside any timing, every adapter
(and the base model, with no adapter) answers one fixed prompt greedily (temperature 0),
alone in the engine. The digest of its output tokens must be the same on every engine
configuration, build and residency tier of a run: a differing digest means an adapter
was applied wrongly, for example after it was evicted and loaded again. An adapter whose
output equals the base model's was not applied at all, unless ``adapters.json`` says it may
(``same_as_base``: a lightly trained adapter, or PEFT's zero-initialised B); its record in the
digests file then shows the match (``digest`` = ``base_digest``). ``lorabench compare`` reports
adapters whose digests differ between two runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lorabench.load.adapters import Adapter
from lorabench.load.workload import synthetic_prompt
from lorabench.results.records import DigestRecord

if TYPE_CHECKING:
    from lorabench.targets.engine import Engine

PROMPT_LEN = 16
OUTPUT_LEN = 8
PROMPT_SEED = 20261122


class AdapterNotApplied(RuntimeError):
    """An adapter's greedy output is the base model's: the LoRA had no effect."""


def digest(token_ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


def probe_prompt(engine: Engine) -> list[int]:
    return synthetic_prompt(0, PROMPT_LEN, engine.vocab_size, PROMPT_SEED)


def greedy_digest(engine: Engine, adapter: Adapter | None) -> str:
    (output,) = engine.generate([probe_prompt(engine)], [adapter], OUTPUT_LEN, greedy=True)
    return digest(output.outputs[0].token_ids)


@dataclass
class DigestBook:
    """The run's reference digest of each adapter (the first build's), and every build's records."""

    reference: dict[str, str] = field(default_factory=dict)

    def check_build(self, engine: Engine, adapters: Sequence[Adapter], provenance: dict) -> list[DigestRecord]:
        """Digest every adapter on this build; raise ``AdapterNotApplied`` when one changes nothing
        and was not declared ``same_as_base``."""
        base = greedy_digest(engine, None)
        records = []
        for adapter in adapters:
            value = greedy_digest(engine, adapter)
            if value == base and not adapter.same_as_base:
                raise AdapterNotApplied(
                    f"adapter {adapter.name}'s greedy output equals the base model's on {engine.id}: "
                    "the LoRA was not applied (or its weights are zero; if that is expected, give it "
                    '"same_as_base": true in adapters.json)'
                )
            self.reference.setdefault(adapter.name, value)
            records.append(
                DigestRecord(
                    run_id=provenance["run_id"],
                    model=provenance["model"],
                    device_type=provenance["device_type"],
                    engine_id=engine.id,
                    build=engine.spec.build,
                    adapter=adapter.name,
                    adapter_rank=adapter.rank,
                    digest=value,
                    base_digest=base,
                )
            )
        return records

    def mismatches(self, records: Sequence[DigestRecord]) -> int:
        return sum(r.digest != self.reference[r.adapter] for r in records)

    def matches(self, adapter: Adapter, token_ids: Sequence[int]) -> bool:
        """Whether a greedy answer to the probe prompt is the adapter's reference answer."""
        return self.reference.get(adapter.name) in (None, digest(token_ids))
