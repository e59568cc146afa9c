"""Adapter isolation under prefix caching: greedy canaries, and their verdict.

vLLM keys each cached KV block by the adapter that computed it (vLLM 0.32: the adapter's name
and path, ``v1/core/kv_cache_utils.py``), so that one adapter never reuses another's blocks. A
key that misses a difference is wrong answers at full speed, which no latency column shows.
Each prompt is a full KV block and ``TAIL`` tokens more (a block is what the cache shares);
the requests go one at a time, greedily:

1. **reference**: each adapter alone on each prompt with a ``cache_salt`` of its own. vLLM
   hashes the salt into the first block, so the request finds nothing cached and computes
   its whole prompt, as with caching off;
2. **owner, victims**: prompt 0 in adapter order, prompt 1 in reverse. The first adapter to
   send a prompt owns its cached blocks; every other one then finds them: its answer must
   be its reference, and (where the engine says) it must have found nothing cached;
3. **control**: the owner again, finding its own blocks. If caching changes the owner's
   own answer, caching changes outputs whatever the adapter, and a victim's different answer
   cannot be blamed on the key; if the owner found nothing cached, the canaries proved nothing;
4. **reload**: one name and folder serving one adapter's weights, then another's loaded in
   place over them (vLLM's ``load_inplace``: the same name, id and path, so the same key),
   prompt 2 sent before and after. The reloaded adapter must answer as it does uncached.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lorabench.load.adapters import Adapter
from lorabench.load.workload import synthetic_prompt
from lorabench.measure.correctness import OUTPUT_LEN, digest
from lorabench.results.records import IsolationRecord

if TYPE_CHECKING:
    from lorabench.targets.engine import Engine

# Prompt tokens past the first block: what each request computes whatever is cached.
TAIL = 8
PROMPT_SEED = 20261127
REFERENCE, OWNER, VICTIM, CONTROL, RELOADED = "reference", "owner", "victim", "control", "reloaded"
# The name the reload canary serves two adapters' weights under, one after the other.
RELOAD_NAME = "lorabench-reloaded"


def canary_prompts(engine: Engine, seed: int) -> list[list[int]]:
    """Three prompts, a full KV block and ``TAIL`` tokens each, from the run's seed."""
    length = engine.block_size + TAIL
    return [synthetic_prompt(i, length, engine.vocab_size, PROMPT_SEED + seed) for i in (0, 1, 2)]


def canaries(engine: Engine, adapters: list[Adapter], prompts: list[list[int]]) -> list[IsolationRecord]:
    """Every answer of the canaries, in the order sent (the module's docstring)."""
    answers: list[IsolationRecord] = []
    ask = _Asker(engine, prompts, answers)
    for k in (0, 1):
        for adapter in adapters:
            ask(k, adapter, REFERENCE, salted=True)
    for k in (0, 1):
        order = adapters if k == 0 else adapters[::-1]
        ask(k, order[0], OWNER)
        for adapter in order[1:]:
            ask(k, adapter, VICTIM)
        ask(k, order[0], CONTROL)
    _reload(engine, adapters[0], adapters[1], ask)
    return answers


def _reload(engine: Engine, old: Adapter, new: Adapter, ask: _Asker) -> None:
    """``old``'s weights under ``RELOAD_NAME``, then ``new``'s loaded in place over them, in a
    folder of the canary's own: the adapters' folders are never written."""
    with tempfile.TemporaryDirectory(prefix="lorabench-reload-") as folder:
        slot = Adapter(RELOAD_NAME, Path(folder) / "adapter", rank=old.rank)
        shutil.copytree(old.path, slot.path)
        engine.register(slot)
        before = f"{RELOAD_NAME}[{old.name}]"
        ask(2, slot, REFERENCE, salted=True, label=before)
        ask(2, slot, OWNER, label=before)
        shutil.rmtree(slot.path)
        shutil.copytree(new.path, slot.path)
        engine.reload_in_place(slot)
        after = f"{RELOAD_NAME}[{new.name}, in place]"
        ask(2, slot, REFERENCE, salted=True, label=after)
        ask(2, slot, RELOADED, label=after)
        engine.remove_adapter(slot)


class _Asker:
    """Sends one prompt greedily for one adapter and records the answer, under ``label`` if given."""

    def __init__(self, engine: Engine, prompts: list[list[int]], answers: list[IsolationRecord]) -> None:
        self.engine, self.prompts, self.answers = engine, prompts, answers

    def __call__(self, k: int, adapter: Adapter, step: str, *, salted: bool = False, label: str = "") -> None:
        salt = f"lorabench-reference-{uuid.uuid4().hex}" if salted else None
        (out,) = self.engine.generate([self.prompts[k]], [adapter], OUTPUT_LEN, greedy=True, cache_salt=salt)
        tokens = list(out.outputs[0].token_ids)
        self.answers.append(
            IsolationRecord(
                prompt=k,
                adapter=label or adapter.name,
                step=step,
                digest=digest(tokens),
                cached_tokens=getattr(out, "num_cached_tokens", None),
                token_ids=" ".join(map(str, tokens)),
                prompt_token_ids=" ".join(map(str, self.prompts[k])),
            )
        )


@dataclass(frozen=True)
class Verdict:
    checked: int
    broken: list[str]
    control_changed: list[str]
    # The prompt tokens the controls found cached, summed; None where the engine does not say.
    control_cached_tokens: int | None
    # The reload canary's breach, if any (empty where it held or was not run).
    reload_broken: list[str]

    @property
    def failure(self) -> str | None:
        if self.control_changed:
            return (
                "PREFIX CACHING CHANGED OUTPUTS: " + "; ".join(self.control_changed) + ". An adapter answers "
                "otherwise from its own cached blocks, so isolation between adapters cannot be judged on this engine"
            )
        if self.broken or self.reload_broken:
            return "ADAPTER ISOLATION BROKEN: " + "; ".join(self.broken + self.reload_broken)
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
    broken, changed, reloaded = [], [], []
    for a in answers:
        same = a.digest == reference[(a.prompt, a.adapter)]
        found = f"{a.cached_tokens} cached tokens" if a.cached_tokens else "cached blocks"
        if a.step == VICTIM and not same:
            broken.append(f"{a.adapter} answered prompt {a.prompt} with {owners[a.prompt]}'s cached blocks")
        elif a.step == VICTIM and a.cached_tokens:
            broken.append(
                f"{a.adapter} reused {a.cached_tokens} cached tokens of prompt {a.prompt}, which "
                f"{owners[a.prompt]} had sent (its answer happened to match)"
            )
        elif a.step == RELOADED and (not same or a.cached_tokens):
            reloaded.append(
                f"{a.adapter} answered prompt {a.prompt} with the replaced weights' {found} "
                f"({owners[a.prompt]}): the KV key is the adapter's name and path, which a reload in place keeps"
            )
        elif a.step in (OWNER, CONTROL) and not same:
            changed.append(f"{a.adapter}'s {a.step} answer to prompt {a.prompt} differs from its uncached one")
    controls = [a.cached_tokens for a in answers if a.step == CONTROL]
    cached = None if None in controls else sum(controls)
    return Verdict(sum(a.step == VICTIM for a in answers), broken, changed, cached, reloaded)
