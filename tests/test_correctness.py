"""The digest guard's logic, on a stand-in engine whose answers the test chooses."""

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from lorabench.load.adapters import Adapter
from lorabench.measure.correctness import AdapterNotApplied, DigestBook, digest

A, B = Adapter("a", Path("/a"), rank=8), Adapter("b", Path("/b"), rank=16)
PROVENANCE = {"run_id": "r", "model": "m", "device_type": "cpu"}


class Answers:
    """Answers the probe with a fixed token list per adapter (None: the base model)."""

    def __init__(self, answers, engine_id="loras1-rank16-cpu2-build0"):
        self.answers, self.id, self.vocab_size = answers, engine_id, 1000
        self.spec = SimpleNamespace(build=0)

    def generate(self, prompts, adapters, output_len, *, greedy=False):
        assert greedy and len(prompts) == 1, "the probe is one greedy request"
        tokens = self.answers[adapters[0].name if adapters[0] else None]
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens)])]


def test_the_first_build_sets_the_reference_and_later_builds_are_held_to_it():
    book = DigestBook()
    first = book.check_build(Answers({None: [0], "a": [1], "b": [2]}), [A, B], PROVENANCE)
    assert book.mismatches(first) == 0 and [r.adapter_rank for r in first] == [8, 16]
    again = book.check_build(Answers({None: [0], "a": [1], "b": [3]}), [A, B], PROVENANCE)
    assert book.mismatches(again) == 1
    assert book.matches(A, [1]) and not book.matches(B, [3])
    assert first[0].digest == digest([1]) and first[0].base_digest == digest([0])


def test_an_adapter_that_changes_nothing_is_refused():
    with pytest.raises(AdapterNotApplied, match="adapter b's greedy output equals the base model's.*same_as_base"):
        DigestBook().check_build(Answers({None: [0], "a": [1], "b": [0]}), [A, B], PROVENANCE)


def test_an_adapter_declared_same_as_base_may_answer_as_the_base_and_its_record_shows_it():
    """A lightly trained adapter, or PEFT's zero-initialised B, answers like the base model: the
    user says so in adapters.json, and the build goes on with the match on record."""
    quiet = replace(B, same_as_base=True)
    (_, record) = DigestBook().check_build(Answers({None: [0], "a": [1], "b": [0]}), [A, quiet], PROVENANCE)
    assert record.adapter == "b" and record.digest == record.base_digest
