"""What the correctness canaries keep: every answer they got, with its prompt's token ids, in
the run's ``<run>.replays/canary.csv``, keyed as the samples are (so each answer carries its
row's engine settings). That file is the reproducer of a finding, and the place where a later
case reads an earlier case's answers: the base_changed check compares two builds' answers,
and only the one that runs second can (``kept_answers``).

The record is declared with the others (``lorabench.results.records.CanaryRecord``), so a
fleet's merge, which imports no scenario, keeps its file too.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lorabench.config.target import INPROCESS
from lorabench.measure.correctness import OUTPUT_LEN, digest
from lorabench.results.records import CanaryRecord

if TYPE_CHECKING:
    from lorabench.load.adapters import Adapter
    from lorabench.targets.engine import Engine

KIND = "canary"
# The adapter column of a request with no adapter.
BASE = ""


def shown(adapter: str) -> str:
    """An adapter column as a finding names it."""
    return adapter or "the base model"


@dataclass
class Asker:
    """Sends the canaries' requests greedily and keeps every answer. Each send carries a
    ``cache_salt`` of its own where prefix caching is on (``Engine.cold_salt``), so that no
    answer is served from KV another request computed: every request computes its prompt."""

    engine: Engine
    prompts: list[list[int]]
    answers: list[CanaryRecord] = field(default_factory=list)

    def batch(
        self,
        requests: Sequence[tuple[Adapter | None, int]],
        step: str,
        output_len: int = OUTPUT_LEN,
        prompt_logprobs: int | None = None,
    ) -> list[CanaryRecord]:
        """``requests`` (adapter, prompt index) sent at once and gathered; their answers."""
        outputs = self.engine.generate(
            [self.prompts[k] for _, k in requests],
            [adapter for adapter, _ in requests],
            output_len,
            greedy=True,
            cache_salt=self.engine.cold_salt(),
            prompt_logprobs=prompt_logprobs,
        )
        counted = prompt_logprobs is not None and self.engine.target == INPROCESS
        listing = " ".join(f"{a.name if a else 'base'}:{k}" for a, k in requests) if len(requests) > 1 else ""
        records = []
        for (adapter, k), out in zip(requests, outputs):
            tokens = list(out.outputs[0].token_ids)
            records.append(
                CanaryRecord(
                    step=step,
                    adapter=adapter.name if adapter else BASE,
                    prompt=k,
                    batch=listing,
                    digest=digest(tokens),
                    token_ids=" ".join(map(str, tokens)),
                    prompt_token_ids=" ".join(map(str, self.prompts[k])),
                    prompt_logprobs=str(len(out.prompt_logprobs or [])) if counted else "",
                )
            )
        self.answers += records
        return records

    def alone(self, adapter: Adapter | None, k: int, step: str, prompt_logprobs: int | None = None) -> CanaryRecord:
        """One request, alone in the engine."""
        return self.batch([(adapter, k)], step, prompt_logprobs=prompt_logprobs)[0]


def kept_answers(path: Path, workload: str, engine_id: str) -> list[dict[str, str]]:
    """The answers of the check ``workload`` that this run has kept in ``path`` so far, this
    case's among them: the run is the one whose answers of ``engine_id`` were kept last (a
    fixed output file may hold other runs' too)."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["workload"] == workload]
    mine = [r for r in rows if r["engine_id"] == engine_id]
    if not mine:
        return []
    return [r for r in rows if r["run_id"] == mine[-1]["run_id"]]
