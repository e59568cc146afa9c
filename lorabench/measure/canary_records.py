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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
        logprobs: int | None = None,
    ) -> list[CanaryRecord]:
        """``requests`` (adapter, prompt index) sent at once and gathered; their answers, with
        their sampled tokens' log probabilities where ``logprobs`` asks for them."""
        outputs = self.engine.generate(
            [self.prompts[k] for _, k in requests],
            [adapter for adapter, _ in requests],
            output_len,
            greedy=True,
            cache_salt=self.engine.cold_salt(),
            prompt_logprobs=prompt_logprobs,
            **({} if logprobs is None else {"logprobs": logprobs}),  # an HTTP target takes no such argument
        )
        counted = prompt_logprobs is not None and self.engine.target == INPROCESS
        listing = " ".join(f"{a.name if a else 'base'}:{k}" for a, k in requests) if len(requests) > 1 else ""
        records = []
        for (adapter, k), out in zip(requests, outputs):
            tokens = list(out.outputs[0].token_ids)
            values = written(out.outputs[0].logprobs, tokens, range(len(tokens))) if logprobs is not None else ""
            records.append(self._record(step, adapter, k, listing, out, self.prompts[k], counted, values))
        self.answers += records
        return records

    def alone(
        self,
        adapter: Adapter | None,
        k: int,
        step: str,
        prompt_logprobs: int | None = None,
        logprobs: int | None = None,
    ) -> CanaryRecord:
        """One request, alone in the engine."""
        return self.batch([(adapter, k)], step, prompt_logprobs=prompt_logprobs, logprobs=logprobs)[0]

    def forced(self, adapter: Adapter | None, k: int, answer: CanaryRecord, step: str, top: int) -> CanaryRecord:
        """``adapter`` teacher-forced on ``answer``: prompt ``k`` and the answer's tokens sent
        as one prompt for one token, asking for its prompt logprobs (the top ``top`` and the
        prompt's own). The record's ``logprobs``: those of the answer's tokens, where the
        prefill computes the distributions that decoding sampled them from."""
        prompt = self.prompts[k] + [int(t) for t in answer.token_ids.split()]
        (out,) = self.engine.generate(
            [prompt], [adapter], 1, greedy=True, cache_salt=self.engine.cold_salt(), prompt_logprobs=top
        )
        values = written(out.prompt_logprobs, prompt, range(len(self.prompts[k]), len(prompt)))
        record = self._record(step, adapter, k, "", out, prompt, self.engine.target == INPROCESS, values)
        self.answers.append(record)
        return record

    @staticmethod
    def _record(
        step: str,
        adapter: Adapter | None,
        k: int,
        listing: str,
        out: Any,
        prompt: list[int],
        counted: bool,
        values: str,
    ) -> CanaryRecord:
        """One answer as kept: what was sent (``prompt``, the prompt's index ``k``), what came
        back, and ``values``, its log probabilities as ``written`` (blank if it asked for none)."""
        tokens = list(out.outputs[0].token_ids)
        return CanaryRecord(
            step=step,
            adapter=adapter.name if adapter else BASE,
            prompt=k,
            batch=listing,
            digest=digest(tokens),
            token_ids=" ".join(map(str, tokens)),
            prompt_token_ids=" ".join(map(str, prompt)),
            prompt_logprobs=str(len(out.prompt_logprobs or [])) if counted else "",
            logprobs=values,
        )


def written(entries: Sequence[Mapping[int, Any] | None] | None, tokens: Sequence[int], positions: range) -> str:
    """The log probability of ``tokens[j]`` at each position ``j`` of ``positions``, as vLLM
    returns them (an entry a position, a dict of token id to ``Logprob``), space-separated and
    exact (Python's float repr, which reads back to the same float); nan where none came back."""

    def one(j: int) -> str:
        entry = entries[j] if entries is not None and j < len(entries) else None
        got = entry.get(tokens[j]) if entry else None
        return "nan" if got is None else repr(float(got.logprob))

    return " ".join(one(j) for j in positions)


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
