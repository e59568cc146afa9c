"""``isolation``: with prefix caching on, does one adapter's request reuse another adapter's
cached KV? vLLM keys each KV block by the adapter (its name and path) so that it never does;
a key that misses it is wrong answers at full speed, which no latency column shows.

On every LoRA configuration, with ``enable_prefix_caching`` turned on for this scenario's
engines, ``CANARY_ADAPTERS`` adapters answer two prompts greedily, each prompt a full KV
block and ``TAIL`` tokens more (a block is what the cache shares):

1. each adapter alone, with a ``cache_salt`` of its own: the salt is hashed into the first
   block, so the request finds nothing cached and computes its whole prompt, as with
   caching off. That answer is the adapter's reference;
2. one request after another, the first prompt in adapter order and the second in reverse,
   so that every adapter but one per prompt (the prompt's *owner*, the first to send it)
   finds the prompt cached by another adapter: its answer must be its reference;
3. the owner again, now finding its own cached blocks: the control. If caching changes the
   owner's own answer, caching changes outputs on this engine whatever the adapter, and the
   victims' answers cannot tell isolation apart: the case fails saying so, not "broken".

A victim whose answer differs from its reference fails the case with ``ADAPTER ISOLATION
BROKEN``, naming the adapter and the owner whose cached blocks it found; the prompts,
adapters, engine settings and digests go into the run's files (a reproducer) first.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from lorabench.config.target import INPROCESS
from lorabench.config.traces import length_limit
from lorabench.load.workload import synthetic_prompt
from lorabench.measure.correctness import OUTPUT_LEN, digest
from lorabench.results.records import IsolationRecord
from lorabench.scenarios.base import Context, Outcome, Parametrization, Scenario

if TYPE_CHECKING:
    from lorabench.config import ConfigFile
    from lorabench.load.adapters import Adapter
    from lorabench.targets.engine import Engine

CANARY_ADAPTERS = 4
# Prompt tokens past the first block: what each request computes whatever is cached.
TAIL = 8
PROMPT_SEED = 20261127
COLUMNS = frozenset({"isolation_checked", "isolation_broken", "isolation_control_changed"})
# Blank where the engine does not say how many prompt tokens it found cached.
MAYBE_COLUMNS = frozenset({"isolation_cached_tokens"})
REFERENCE, OWNER, VICTIM, CONTROL = "reference", "owner", "victim", "control"


class Isolation(Scenario):
    name = "isolation"
    columns = COLUMNS | {"input_len", "output_len"}
    maybe_columns = MAYBE_COLUMNS
    # Caching on whatever the config says: the scenario is about the cache.
    prefix_caching = True

    def parametrize(self, file: ConfigFile) -> list[Parametrization]:
        return []

    def builds(self, file: ConfigFile) -> int | None:
        return 1  # a correctness canary: a second build checks nothing a first did not

    def run(self, ctx: Context, engine: Engine) -> Outcome:  # type: ignore[override]
        if engine.target != INPROCESS:
            pytest.skip("the isolation canaries run in process for now; over HTTP they are not written yet")
        adapters = list(ctx.config.adapters[:CANARY_ADAPTERS])
        if len(adapters) < 2:
            pytest.skip(f"{ctx.config.path}: the isolation canaries need 2 adapters at least, the config has 1")
        length = engine.block_size + TAIL
        limit, where = length_limit(ctx.config.file, ctx.config.model)
        if limit is not None and length + OUTPUT_LEN > limit:
            pytest.skip(
                f"the isolation canaries send prompts of a full KV block and {TAIL} tokens ({length}) and answers "
                f"of {OUTPUT_LEN}: {where} is {limit}; raise it to {length + OUTPUT_LEN} or more"
            )
        prompts = canary_prompts(engine, ctx.config.matrix.seed)
        answers = canaries(engine, adapters, prompts)
        verdict = judge(answers)
        fields = {
            "workload": "isolation",
            "num_adapters": len(adapters),
            "input_len": length,
            "output_len": OUTPUT_LEN,
            "rounds": 1,
            "warmup_rounds": 0,
            "isolation_checked": verdict.checked,
            "isolation_broken": len(verdict.broken),
            "isolation_control_changed": len(verdict.control_changed),
            "isolation_cached_tokens": verdict.control_cached_tokens,
        }
        return Outcome(fields, [], records={"isolation": answers}, failure=verdict.failure)


def canary_prompts(engine: Engine, seed: int) -> list[list[int]]:
    """The two prompts, a full KV block and ``TAIL`` tokens each, from the run's seed."""
    return [synthetic_prompt(i, engine.block_size + TAIL, engine.vocab_size, PROMPT_SEED + seed) for i in (0, 1)]


def canaries(engine: Engine, adapters: list[Adapter], prompts: list[list[int]]) -> list[IsolationRecord]:
    """Every request of the canaries, in the order sent, one at a time."""
    answers = []

    def ask(k: int, adapter: Adapter, step: str, salt: str | None = None) -> None:
        (out,) = engine.generate([prompts[k]], [adapter], OUTPUT_LEN, greedy=True, cache_salt=salt)
        tokens = list(out.outputs[0].token_ids)
        answers.append(
            IsolationRecord(
                prompt=k,
                adapter=adapter.name,
                step=step,
                digest=digest(tokens),
                cached_tokens=getattr(out, "num_cached_tokens", None),
                token_ids=" ".join(map(str, tokens)),
                prompt_token_ids=" ".join(map(str, prompts[k])),
            )
        )

    for k in range(len(prompts)):
        for adapter in adapters:
            ask(k, adapter, REFERENCE, f"lorabench-reference-{uuid.uuid4().hex}")
    for k in range(len(prompts)):
        order = adapters if k % 2 == 0 else adapters[::-1]
        ask(k, order[0], OWNER)
        for adapter in order[1:]:
            ask(k, adapter, VICTIM)
        ask(k, order[0], CONTROL)
    return answers


@dataclass(frozen=True)
class Verdict:
    checked: int
    broken: list[str]
    control_changed: list[str]
    # The prompt tokens the controls found cached, summed; None where the engine does not say.
    control_cached_tokens: int | None

    @property
    def failure(self) -> str | None:
        if self.control_changed:
            return (
                "PREFIX CACHING CHANGED OUTPUTS: " + "; ".join(self.control_changed) + ". An adapter answers "
                "otherwise from its own cached blocks, so isolation between adapters cannot be judged on this engine"
            )
        if self.broken:
            return "ADAPTER ISOLATION BROKEN: " + "; ".join(self.broken)
        if self.control_cached_tokens == 0:
            return (
                "PREFIX CACHING NOT IN EFFECT: no adapter found its own prompt cached on its second request, so "
                "the canaries could not see one adapter reuse another's blocks (prefix caching with LoRA is off)"
            )
        return None


def judge(answers: list[IsolationRecord]) -> Verdict:
    """Each answer against its adapter's reference to the same prompt (the module's docstring)."""
    reference = {(a.prompt, a.adapter): a.digest for a in answers if a.step == REFERENCE}
    owners = {a.prompt: a.adapter for a in answers if a.step == OWNER}
    broken, changed = [], []
    for a in answers:
        same = a.digest == reference[(a.prompt, a.adapter)]
        if a.step == VICTIM and not same:
            broken.append(f"{a.adapter} answered prompt {a.prompt} with {owners[a.prompt]}'s cached blocks")
        elif a.step == VICTIM and a.cached_tokens:
            broken.append(
                f"{a.adapter} reused {a.cached_tokens} cached tokens of prompt {a.prompt}, which "
                f"{owners[a.prompt]} had sent (its answer happened to match)"
            )
        elif a.step in (OWNER, CONTROL) and not same:
            changed.append(f"{a.adapter}'s {a.step} answer to prompt {a.prompt} differs from its uncached one")
    controls = [a.cached_tokens for a in answers if a.step == CONTROL]
    cached = None if None in controls else sum(controls)
    return Verdict(sum(a.step == VICTIM for a in answers), broken, changed, cached)


SCENARIO = Isolation()
