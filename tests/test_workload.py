from pathlib import Path

import pytest

from lorabench.load.adapters import Adapter
from lorabench.load.workload import (
    Shape,
    SyntheticPrompts,
    assign_adapters,
    build_batch,
    carries_prefix,
    ceil_sqrt,
    pool_size,
    zipf_group_sizes,
)


def synthetic_prompts(batch_size: int, input_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    return SyntheticPrompts(batch_size, input_len, vocab_size, seed).round(0)


ADAPTERS = [Adapter(f"a{i}", Path(f"/a{i}"), prompt=f"prompt {i}") for i in range(16)]


@pytest.mark.parametrize(("n", "expected"), [(1, 1), (2, 2), (4, 2), (5, 3), (8, 3), (9, 3), (10, 4), (16, 4)])
def test_ceil_sqrt(n, expected):
    assert ceil_sqrt(n) == expected


@pytest.mark.parametrize("batch_size", [1, 2, 5, 8, 16])
def test_uniform_draws_from_ceil_sqrt_adapters(batch_size):
    chosen = assign_adapters("uniform", batch_size, ADAPTERS, seed=0)
    assert len(chosen) == batch_size
    assert set(chosen) <= set(ADAPTERS[: ceil_sqrt(batch_size)])


def test_uniform_is_deterministic_by_seed_and_uses_the_pool():
    first = assign_adapters("uniform", 16, ADAPTERS, seed=7)
    assert first == assign_adapters("uniform", 16, ADAPTERS, seed=7)
    draws = {tuple(a.name for a in assign_adapters("uniform", 16, ADAPTERS, seed=s)) for s in range(10)}
    assert len(draws) > 1, "the seed must change the draw"
    assert len({a for s in range(10) for a in assign_adapters("uniform", 16, ADAPTERS, seed=s)}) == 4


def test_distinct_and_identical():
    assert assign_adapters("distinct", 5, ADAPTERS, seed=0) == ADAPTERS[:5]
    assert assign_adapters("identical", 5, ADAPTERS, seed=0) == [ADAPTERS[0]] * 5
    assert pool_size("identical", 5) == 1


def test_too_few_adapters_and_unknown_workload():
    with pytest.raises(ValueError, match="needs 8 adapters, got 3"):
        assign_adapters("distinct", 8, ADAPTERS[:3], seed=0)
    with pytest.raises(ValueError, match="unknown workload 'random'"):
        pool_size("random", 4)


def test_synthetic_prompts_have_exact_length_and_are_seeded():
    prompts = synthetic_prompts(4, 33, vocab_size=500, seed=1)
    assert [len(p) for p in prompts] == [33] * 4
    assert all(0 <= t < 500 for p in prompts for t in p)
    assert prompts == synthetic_prompts(4, 33, vocab_size=500, seed=1)
    assert prompts != synthetic_prompts(4, 33, vocab_size=500, seed=2)


@pytest.mark.parametrize(
    ("share", "carriers"), [(1.0, [0, 1, 2, 3, 4, 5]), (0.5, [0, 2, 4]), (1 / 3, [0, 3]), (0.2, [0, 5])]
)
def test_the_shared_prefix_goes_to_its_share_of_requests_spread_evenly(share, carriers):
    assert [i for i in range(6) if carries_prefix(i, share)] == carriers


@pytest.mark.parametrize(("share", "batch"), [(0.07, 100), (0.28, 25), (0.1, 30), (0.3, 10)])
def test_a_share_that_is_a_whole_number_of_requests_gets_exactly_that_many(share, batch):
    assert sum(carries_prefix(i, share) for i in range(batch)) == round(share * batch)


def test_a_shared_prefix_starts_its_carriers_and_later_rounds_bring_new_own_tokens():
    made = SyntheticPrompts(4, 40, vocab_size=500, seed=1, prefix_len=24, prefix_share=0.5)
    first, second = made.round(0), made.round(1)
    assert [len(p) for p in first + second] == [40] * 8
    assert first[0][:24] == first[2][:24] == second[0][:24] != first[1][:24]
    assert first[0][24:] != second[0][24:] and first[1] != second[1], "each round's own tokens are new"
    assert first[1] == synthetic_prompts(4, 40, 500, 1)[1], "a request without the prefix is as before"
    batch = build_batch(
        "distinct", 4, adapters=ADAPTERS, prompts=[], input_len=40, vocab_size=500, seed=1, shape=Shape(prefix_len=24)
    )
    assert batch.round_prompts(0) == [r.prompt for r in batch.requests]
    assert all(p[:24] == batch.round_prompts(3)[0][:24] for p in batch.round_prompts(3))


def test_build_batch_text_prompts_follow_adapters_and_baseline_has_none():
    lora = build_batch("distinct", 3, adapters=ADAPTERS, prompts=["p"], input_len=None, vocab_size=100, seed=0)
    assert [r.prompt for r in lora.requests] == ["prompt 0", "prompt 1", "prompt 2"]
    assert lora.adapters == ADAPTERS[:3]
    base = build_batch(None, 3, adapters=ADAPTERS, prompts=["x", "y"], input_len=None, vocab_size=100, seed=0)
    assert [r.prompt for r in base.requests] == ["x", "y", "x"]
    assert base.adapters == [] and base.pool == ()


def test_build_batch_uniform_pool_and_same_synthetic_prompts_for_baseline():
    batch = build_batch("uniform", 9, adapters=ADAPTERS, prompts=["p"], input_len=8, vocab_size=1000, seed=3)
    assert len(batch.pool) == 3
    base = build_batch(None, 9, adapters=ADAPTERS, prompts=["p"], input_len=8, vocab_size=1000, seed=3)
    assert [r.prompt for r in batch.requests] == [r.prompt for r in base.requests]


@pytest.mark.parametrize(
    ("batch_size", "alpha", "sizes"),
    [(8, 1.5, [4, 2, 1, 1]), (4, 1.5, [2, 1, 1]), (1, 1.5, [1]), (16, 1.5, [8, 3, 2, 1, 1, 1]), (8, 0.01, [1] * 8)],
)
def test_skewed_groups_fall_off_by_zipf_and_fill_the_batch(batch_size, alpha, sizes):
    assert zipf_group_sizes(batch_size, alpha) == sizes
    chosen = assign_adapters("skewed", batch_size, ADAPTERS, seed=0, shape=Shape(skew_alpha=alpha))
    assert [chosen.count(a) for a in dict.fromkeys(chosen)] == sizes
    assert pool_size("skewed", batch_size, Shape(skew_alpha=alpha)) == len(sizes)


@pytest.mark.parametrize(
    ("batch_size", "share", "base"), [(8, 0.5, 4), (8, 0.25, 2), (4, 0.1, 1), (4, 0.9, 3), (1, 0.5, 0)]
)
def test_mixed_batches_put_base_requests_first_then_distinct_adapters(batch_size, share, base):
    chosen = assign_adapters("mixed", batch_size, ADAPTERS, seed=0, shape=Shape(base_share=share))
    assert chosen[:base] == [None] * base
    assert chosen[base:] == ADAPTERS[: batch_size - base]
