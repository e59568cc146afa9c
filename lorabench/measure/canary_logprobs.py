"""The prompt_logprobs canary's values: each adapter's teacher-forced prompt logprobs against
the logprobs it sampled its answer with (``lorabench.measure.canary.prompt_logprobs`` sends both).

A model's log probability of a token after a context is one number, whichever path computes
it: decoding samples the token from it (and returns it where the request asks for
``logprobs``), and a prefill of the context and the token (teacher forcing: the prompt and the
answer sent back as one prompt) returns it where the request asks for ``prompt_logprobs``. The
two paths add in other orders, so they agree up to float noise (``LOGPROBS_TOLERANCE``,
measured on vLLM's CPU backend). A LoRA mapping wrong in the prompt-logprobs path only (vLLM
#16668: the logits' LoRA mapped one row a sequence where prompt logprobs have one a token;
#51594: an lm_head delta left out of them) moves the adapter's teacher-forced values off its
decoded ones, to the base model's or another adapter's: digests of the answers cannot see it.

Judged only where the values can tell. The base model's own pairs are the control: the
tolerance is at least ``NOISE_FACTOR`` times their largest gap, the engine's noise between its
two paths with no LoRA in them (so a model whose float steps are coarser than the measured
tolerance widens it), and where a base pair is missing or off past the tolerance, no adapter is
judged on that prompt (numerics, not LoRA). An adapter whose decoded
values are within the tolerance of the base model's teacher-forced values on the same tokens
cannot be told from the base model by them: not judged, and said so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lorabench.measure.canary import ALONE, BASE_FORCED, FORCED, LOGPROBS_TOLERANCE
from lorabench.measure.canary_records import BASE, CanaryRecord

# The tolerance is at least this many times the base model's own largest gap (``_base_noise``).
NOISE_FACTOR = 4
# A teacher-forced value this far off its decoded one is a finding even where it matches no other
# value: one bfloat16 step of a logit below 256 is at most 1.
FAR = 1.0


def floats(text: str) -> list[float]:
    """A record's ``logprobs`` column read back (nan where none came back)."""
    return [float(x) for x in text.split()]


def apart(one: Sequence[float], other: Sequence[float]) -> list[float]:
    """Position by position, how far two answers' logprobs are apart: inf where either is
    missing (nan, or one list shorter), so a missing value is never within a tolerance."""
    width = max(len(one), len(other))
    pairs = zip(list(one) + [math.nan] * (width - len(one)), list(other) + [math.nan] * (width - len(other)))
    return [math.inf if math.isnan(x) or math.isnan(y) else abs(x - y) for x, y in pairs]


def judge_values(
    answers: Sequence[CanaryRecord], tolerance: float = LOGPROBS_TOLERANCE
) -> tuple[int, list[str], list[str]]:
    """Each adapter's teacher-forced logprobs against its decoded ones, prompt by prompt: how
    many were judged, the findings, and what was not judged (one line each). Nothing where the
    answers have no values (another version's, or a request that raised: that is its finding)."""
    decoded = {(a.adapter, a.prompt): a for a in answers if a.step == ALONE and a.logprobs}
    forced = {(a.adapter, a.prompt): a for a in answers if a.step == FORCED}
    on_base = {a.prompt_token_ids: a for a in answers if a.step == BASE_FORCED}
    tolerance = max(tolerance, NOISE_FACTOR * _base_noise(decoded, forced))
    checked, failed, unjudged = 0, [], []
    for (name, k), mine in forced.items():
        if name == BASE or (name, k) not in decoded:
            continue
        why = _cannot_tell(decoded, forced, on_base.get(mine.prompt_token_ids), name, k, tolerance)
        if why:
            unjudged.append(f"{name}'s prompt logprobs on prompt {k}: {why}")
            continue
        positions = len(mine.prompt_token_ids.split())
        if mine.prompt_logprobs not in ("", str(positions)):
            checked += 1
            failed.append(
                f"{name} asked for the prompt logprobs of prompt {k} and its answer (teacher-forced) and got "
                f"{mine.prompt_logprobs} of its {positions} positions"
            )
            continue
        finding, signature = _off(decoded[(name, k)], mine, on_base[mine.prompt_token_ids], tolerance)
        if finding and not signature:
            unjudged.append(f"{name}'s prompt logprobs on prompt {k}: {finding}: a float step, or another bug")
            continue
        checked += 1
        if finding:
            failed.append(finding)
    return checked, failed, unjudged


def _base_noise(decoded: dict[tuple[str, int], CanaryRecord], forced: dict[tuple[str, int], CanaryRecord]) -> float:
    """The largest gap between the base model's own decoded and teacher-forced logprobs over the
    check's prompts: the engine's float noise between its two paths with no LoRA in them (a
    bfloat16 model with large logits has steps above ``LOGPROBS_TOLERANCE``)."""
    gaps = [
        d
        for (name, k), mine in forced.items()
        if name == BASE and (name, k) in decoded
        for d in apart(floats(decoded[(name, k)].logprobs), floats(mine.logprobs))
        if math.isfinite(d)
    ]
    return max(gaps, default=0.0)


def _cannot_tell(
    decoded: dict[tuple[str, int], CanaryRecord],
    forced: dict[tuple[str, int], CanaryRecord],
    base_on_mine: CanaryRecord | None,
    name: str,
    k: int,
    tolerance: float,
) -> str | None:
    """Why ``name``'s values on prompt ``k`` cannot be judged; None where they can."""
    base, base_forced = decoded.get((BASE, k)), forced.get((BASE, k))
    if base is None or base_forced is None or base_on_mine is None:
        return "the base model's teacher-forced request is missing (it raised: that is the finding)"
    control = apart(floats(base.logprobs), floats(base_forced.logprobs))
    if max(control, default=0.0) > tolerance:
        i = next(i for i, d in enumerate(control) if d > tolerance)
        return (
            f"the base model's own teacher-forced logprob at answer position {i} is {control[i]:.3g} off its "
            f"decoded one (tolerance {tolerance:.3g}): the engine's prefill and decode disagree with no LoRA, not "
            "an adapter's doing"
        )
    told = apart(floats(decoded[(name, k)].logprobs), floats(base_on_mine.logprobs))
    if max(told, default=0.0) <= tolerance:
        return (
            f"its decoded logprobs are within {tolerance} of the base model's on the same tokens (at most "
            f"{max(told, default=0.0):.3g} apart): the values cannot tell it from the base model"
        )
    return None


def _off(decoded: CanaryRecord, mine: CanaryRecord, base: CanaryRecord, tolerance: float) -> tuple[str | None, bool]:
    """Where ``mine`` (teacher-forced) is off ``decoded`` past ``tolerance``: the line, at the
    first such answer position, with the base model's value there (``base``, on the same tokens),
    and whether it has the class's signature: the base model's value instead, or a value more
    than ``FAR`` off, which no float step of a logit gives. (None, False) where nothing is off."""
    d, f, b = floats(decoded.logprobs), floats(mine.logprobs), floats(base.logprobs)
    off = apart(d, f)
    i = next((i for i, x in enumerate(off) if x > tolerance), None)
    if i is None:
        return None, False
    tokens = decoded.token_ids.split()

    def at(values: list[float]) -> str:
        return f"{values[i]:.6g}" if i < len(values) else "none"

    as_base = apart(f, b)[i] <= tolerance
    line = (
        f"{mine.adapter} on prompt {mine.prompt}, answer position {i} (token {tokens[i] if i < len(tokens) else '?'}): "
        f"teacher-forced prompt logprob {at(f)}, decoded {at(d)} (tolerance {tolerance:.3g}); the base model's on the "
        f"same tokens: {at(b)}, " + ("which it matches instead" if as_base else "which it does not match either")
    )
    return line, as_base or off[i] > FAR
