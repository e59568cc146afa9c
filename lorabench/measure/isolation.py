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
   send a prompt owns its cached blocks; every other one then sends it: it must find nothing
   cached (where the engine counts cached tokens) and answer as its reference. Where the
   engine does not count them its answer alone tells, and only where its reference differs
   from the owner's: one that answers a reference the owner's shares is not judged (the
   owner's KV could have given that answer too);
3. **control**: the owner again, which must find its own blocks cached and answer as its
   reference. If it found nothing, the canaries could not have seen a breach;
4. **reload**: one name and folder serving one adapter's weights, then another's loaded in
   place over them (vLLM's ``load_inplace``: the same name, id and path), prompt 2 sent
   before and after, each with a salted reference. The reloaded adapter must find nothing
   its old weights cached and answer as its new reference, which must differ from the old.
   Then the same name at another folder, under a new id: a victim like the others, which
   a key without the adapter's path would fail.

Every step but the references carries one ``cache_salt`` of the session's (a run of the
canaries): they find each other's blocks as unsalted requests would, and nothing an earlier
session cached on a long-lived server, whose blocks would otherwise greet this session's
owners and victims (their own, from last time) and read as a breach.

A salted request or a first owner that found something cached, a victim whose answer alone
could not differ, or a reload that changed no answer, leaves the canaries unable to judge; an
answer that differs with nothing cached is an engine whose outputs change for another reason.
Each is said apart from a breach.
"""

from __future__ import annotations

import contextlib
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
RELOAD_PROMPT = 2
# The name the reload canary serves two adapters' weights under, one after the other.
RELOAD_NAME = "lorabench-reloaded"


def canary_prompts(engine: Engine, seed: int) -> list[list[int]]:
    """Three prompts, a full KV block and ``TAIL`` tokens each, from the run's seed."""
    length = engine.block_size + TAIL
    return [synthetic_prompt(i, length, engine.vocab_size, PROMPT_SEED + seed) for i in (0, 1, 2)]


def canaries(engine: Engine, adapters: list[Adapter], prompts: list[list[int]]) -> list[IsolationRecord]:
    """Every answer of the canaries, in the order sent (the module's docstring)."""
    answers: list[IsolationRecord] = []
    ask = _Asker(engine, prompts, answers, f"lorabench-canary-{uuid.uuid4().hex}")
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
    """``old``'s weights under ``RELOAD_NAME``, then ``new``'s loaded in place over them, then
    ``new``'s at another folder under a new id, in folders of the canary's own: the adapters'
    folders are never written."""
    serving: list[Adapter] = []
    with tempfile.TemporaryDirectory(prefix="lorabench-reload-") as folder:
        try:
            slot = _served(engine, old, Path(folder) / "adapter", serving)
            ask.pair(slot, OWNER, f"{RELOAD_NAME}[{old.name}]")
            shutil.rmtree(slot.path)
            shutil.copytree(new.path, slot.path)
            engine.reload_in_place(slot)
            ask.pair(slot, RELOADED, f"{RELOAD_NAME}[{new.name}, in place]")
            engine.remove_adapter(serving.pop())
            # The same name at another path, under a new id: the key's path must tell it apart.
            moved = _served(engine, new, Path(folder) / "moved", serving)
            ask.pair(moved, VICTIM, f"{RELOAD_NAME}[{new.name}, new path]")
            engine.remove_adapter(serving.pop())
        finally:
            # A long-lived server keeps what was not unloaded, and refuses the name next run.
            for adapter in serving:
                with contextlib.suppress(Exception):  # the failure that got here is the one to see
                    engine.remove_adapter(adapter)


def _served(engine: Engine, weights: Adapter, folder: Path, serving: list[Adapter]) -> Adapter:
    """``weights`` copied to ``folder`` and given a LoRA id under ``RELOAD_NAME``; added to
    ``serving`` once the engine serves it."""
    served = Adapter(RELOAD_NAME, folder, rank=weights.rank)
    shutil.copytree(weights.path, served.path)
    engine.register(served)
    serving.append(served)
    return served


class _Asker:
    """Sends one prompt greedily for one adapter and records the answer, under ``label`` if
    given: a reference with a salt of its own, any other step with the session's ``session``."""

    def __init__(self, engine: Engine, prompts: list[list[int]], answers: list[IsolationRecord], session: str) -> None:
        self.engine, self.prompts, self.answers, self.session = engine, prompts, answers, session

    def __call__(self, k: int, adapter: Adapter, step: str, *, salted: bool = False, label: str = "") -> None:
        salt = f"lorabench-reference-{uuid.uuid4().hex}" if salted else self.session
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

    def pair(self, adapter: Adapter, step: str, label: str) -> None:
        """The reload prompt sent salted (the reference), then as ``step``, under ``label``."""
        self(RELOAD_PROMPT, adapter, REFERENCE, salted=True, label=label)
        self(RELOAD_PROMPT, adapter, step, label=label)


@dataclass(frozen=True)
class Verdict:
    """What the answers show. ``broken``: answers of another adapter's (or replaced weights')
    cached KV, definite where the engine counted cached tokens; ``changed``: answers that
    differ from their uncached one for another reason; ``unjudged``: why the canaries
    cannot tell (a salted request that found something cached, a victim judged on an answer its
    owner's reference shares, a reload that changed nothing);
    ``uncached``: controls that found nothing cached."""

    checked: int
    broken: list[str]
    reload_broken: list[str]
    changed: list[str]
    unjudged: list[str]
    uncached: list[str]
    # The fewest prompt tokens a control found cached; None where the engine does not say.
    control_cached_tokens: int | None

    @property
    def failure(self) -> str | None:
        also = self.unjudged + self.changed
        if self.broken or self.reload_broken:
            tail = f"; also: {'; '.join(also)}" if also else ""
            return "ADAPTER ISOLATION BROKEN: " + "; ".join(self.broken + self.reload_broken) + tail
        if self.unjudged:
            return "ISOLATION NOT JUDGED: " + "; ".join(also)
        if self.changed:
            return "PREFIX CACHING CHANGED OUTPUTS: " + "; ".join(self.changed)
        if self.uncached:
            return "PREFIX CACHING NOT IN EFFECT: " + "; ".join(self.uncached) + ": the canaries could not see a breach"
        return None


def judge(answers: list[IsolationRecord]) -> Verdict:
    """Each answer against its adapter's uncached reference to the same prompt, and the
    cached tokens the engine counted (the module's docstring)."""
    reference = {(a.prompt, a.adapter): a.digest for a in answers if a.step == REFERENCE}
    owners = {a.prompt: a.adapter for a in answers if a.step == OWNER}
    found: dict[str, list[str]] = {"broken": [], "reload": [], "changed": [], "unjudged": [], "uncached": []}
    checked = 0
    for a in answers:
        own, owner = reference[(a.prompt, a.adapter)], owners.get(a.prompt, "")
        kind, line = _finding(a, a.digest == own, owner, own == reference.get((a.prompt, owner)))
        if kind:
            found[kind].append(line)
        checked += a.step == VICTIM and kind != "unjudged"
    reloaded = [a.adapter for a in answers if a.step == RELOADED]
    if reloaded and reference[(RELOAD_PROMPT, owners[RELOAD_PROMPT])] == reference[(RELOAD_PROMPT, reloaded[0])]:
        found["unjudged"].append("the reload in place changed no uncached answer: stale KV could not show")
    controls = [a.cached_tokens for a in answers if a.step == CONTROL]
    fewest = None if not controls or None in controls else min(controls)
    return Verdict(
        checked, found["broken"], found["reload"], found["changed"], found["unjudged"], found["uncached"], fewest
    )


def _finding(a: IsolationRecord, same: bool, owner: str, alike: bool) -> tuple[str, str]:
    """What one answer shows, as (kind, line); ("", "") where it is as it should be. ``alike``:
    the answer's reference is its prompt's owner's too."""
    where = f"prompt {a.prompt}"
    if a.step in (REFERENCE, OWNER) and a.cached_tokens:
        return "unjudged", f"{a.adapter}'s {a.step} request for {where} found {a.cached_tokens} tokens cached"
    if a.step == VICTIM and a.cached_tokens is None and same and alike:
        # Its answer alone cannot tell: the owner's KV could have given it too.
        return "unjudged", (
            f"{a.adapter}'s victim answer to {where} is not judged: its reference is {owner}'s too, "
            "and the engine does not count cached tokens"
        )
    if a.step == VICTIM and (a.cached_tokens or (not same and a.cached_tokens is None)):
        seen = f"found {a.cached_tokens} tokens of {where} cached" if a.cached_tokens else f"answered {where} otherwise"
        return "broken", f"{a.adapter} {seen} after {owner} sent it" + ("" if not same else " (its answer matched)")
    if a.step == RELOADED and (a.cached_tokens or (not same and a.cached_tokens is None)):
        seen = f"found {a.cached_tokens} tokens of {where} cached" if a.cached_tokens else f"answered {where} otherwise"
        return "reload", f"{a.adapter} {seen} by the weights it replaced ({owner})" + (
            "" if not same else " (its answer matched)"
        )
    if not same:
        return "changed", f"{a.adapter}'s {a.step} answer to {where} differs from its uncached one, nothing else cached"
    if a.step == CONTROL and a.cached_tokens == 0:
        return "uncached", f"{a.adapter}'s control found nothing of {where} cached"
    return "", ""
