"""The stand-in's prefix cache behaves as vLLM 0.32's where lorabench's columns and canaries
depend on it: full blocks only, keyed by the adapter's name and path and a request's salt,
at least one prompt token computed, and a hit's prefill not charged."""

from __future__ import annotations

from contextlib import ExitStack

import pandas as pd
import pytest

from lorabench.config import EngineSpec, read_config_file, resolve_config
from lorabench.results.records import samples_path_for
from lorabench.targets.standin import Costs, StandIn, write_config
from lorabench.targets.standin.prefix_cache import Owner, PrefixCache
from tests.helpers import ROOT, result_files

# 40 prompt tokens: 2 full blocks of 16 and 8 more; a millisecond a prefilled token.
PROMPT = list(range(100, 140))
COSTS = Costs(prefill_ms_per_token=1.0, decode_ms_per_step=1.0)


@pytest.fixture
def standin(tmp_path):
    """A stand-in engine on a virtual clock: ``standin(caching)``, closed after the test."""
    path = write_config(tmp_path, adapters=2)
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    with ExitStack() as stack:

        def build(caching: bool = True):
            spec = EngineSpec(True, 2, 8, 4, enable_prefix_caching=caching)
            return stack.enter_context(StandIn(COSTS, virtual_clock=True).engine(config, spec, "cpu", None))

        yield build


def ttft_ms(engine, adapter, salt=None):
    (out,) = engine.generate([PROMPT], [engine.config.adapters[adapter]], 2, greedy=True, cache_salt=salt)
    return round((out.metrics.first_token_ts - out.metrics.queued_ts) * 1000), tuple(out.outputs[0].token_ids)


def test_a_cached_prefix_is_not_prefilled_again_and_answers_the_same(standin):
    engine = standin()
    cold, answer = ttft_ms(engine, 0)
    assert cold == 40 + 1, "40 tokens prefilled, one step"
    assert ttft_ms(engine, 0) == (8 + 1, answer), "2 blocks cached: 8 tokens prefilled, the same answer"
    cache = engine.llm.prefix_cache
    assert (cache.queries, cache.hits) == (80, 32)


def test_another_adapter_or_a_salt_finds_nothing_cached(standin):
    engine = standin()
    ttft_ms(engine, 0)
    assert ttft_ms(engine, 1)[0] == 41, "keyed by the adapter"
    assert ttft_ms(engine, 0, salt="s")[0] == 41, "the salt is in the first block's hash"
    assert ttft_ms(engine, 0, salt="s")[0] == 9, "the same salt shares"


def test_a_prefix_admitted_in_the_same_step_is_reused_as_vllm_caches_blocks_on_allocation(standin):
    """Two prompts sharing 2 blocks, sent together: vLLM caches a block as the scheduler
    allocates it, so the second admitted in the step finds the first's (not after its output)."""
    engine = standin()
    a0, a1 = engine.config.adapters[:2]
    together = engine.generate([PROMPT, PROMPT], [a0, a0], 2, greedy=True)
    assert [o.num_cached_tokens for o in together] == [0, 32]
    assert together[0].outputs[0].token_ids == together[1].outputs[0].token_ids
    other = engine.generate([PROMPT[::-1], PROMPT[::-1]], [a0, a1], 2, greedy=True)
    assert [o.num_cached_tokens for o in other] == [0, 0], "still keyed by the adapter"


def test_without_prefix_caching_every_prompt_is_prefilled(standin):
    engine = standin(caching=False)
    assert ttft_ms(engine, 0)[0] == ttft_ms(engine, 0)[0] == 41 and engine.llm.prefix_cache is None


def test_a_whole_block_prompt_computes_its_last_token():
    """32 tokens, 2 full blocks: vLLM reuses at most 1, so that the last token is computed."""
    cache = PrefixCache(100, 16)
    hashes = cache.hashes(list(range(32)), ("a0", "/a0"), None)
    cache.insert(hashes, Owner("a0", ""), room=100)
    assert len(cache.lookup(hashes, 32)) == 1 and len(cache.lookup(hashes + [b"x"], 33)) == 2


def test_new_weights_under_the_same_name_and_path_reuse_the_old_kv_as_vllm_0_32_keys_it():
    """vLLM 0.32 keys a block by the adapter's name and path, not its weights: an adapter
    replaced in place finds the blocks its predecessor computed (the stand-in marks whose)."""
    cache = PrefixCache(100, 16)
    old = cache.hashes(PROMPT, ("a0", "/adapters/a0"), None)
    cache.insert(old, Owner("a0", "v1"), room=100)
    assert cache.hashes(PROMPT, ("a0", "/adapters/a0"), None) == old
    assert cache.lookup(old, len(PROMPT)) == [Owner("a0", "v1")] * 2
    assert cache.hashes(PROMPT, ("a0", "/adapters/a0-v2"), None) != old, "a new path is a new key"
    assert PrefixCache(100, 16, keyed_by_adapter=False).hashes(PROMPT, ("a1", "/a1"), None) == (
        PrefixCache(100, 16, keyed_by_adapter=False).hashes(PROMPT, ("a0", "/a0"), None)
    ), "the planted bug: no adapter in the key"


def test_the_least_recently_used_blocks_leave_when_the_room_runs_out():
    cache = PrefixCache(100, 16)
    first, second = (cache.hashes([n] * 17, None, None) for n in (1, 2))
    cache.insert(first, Owner(None, "base"), room=1)
    cache.insert(second, Owner(None, "base"), room=1)
    assert cache.lookup(first, 17) == [] and len(cache.lookup(second, 17)) == 1


def test_a_prompts_head_outlives_its_tail_when_the_room_runs_out():
    """vLLM frees a request's blocks tail first: with room for 2 of a 3-block prompt's blocks,
    its first 2 stay, and a prompt sharing them still finds them."""
    cache = PrefixCache(100, 16)
    hashes = cache.hashes(list(range(49)), None, None)
    cache.insert(hashes, Owner(None, "base"), room=2)
    assert len(cache.lookup(hashes, 49)) == 2


def test_a_batch_cached_by_its_warm_up_round_shows_its_hit_rate_and_the_prefill_it_saved(pytester):
    """Ground truth: 40-token prompts starting with a shared 32-token prefix, a millisecond a
    prefilled token. With caching on, the warm-up round caches the prefix's 2 full blocks for
    each request's adapter, and the measured rounds (new own tokens each) prefill 8 tokens a
    request, not 40: a hit rate of 0.8, and the step that prefills the batch's 2 requests 64 ms
    shorter."""
    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
    matrix = {"batch_sizes": [2], "workloads": ["distinct"], "input_len": 40, "output_len": 4, "warmup_rounds": 1}
    matrix["shared_prefix_len"] = 32
    engine = {"max_loras": 2, "max_lora_rank": 8, "max_cpu_loras": 4, "enable_prefix_caching": [False, True]}
    config = write_config(pytester.path / "run", matrix=matrix, engine=engine)
    costs = Costs(prefill_ms_per_token=1.0, decode_ms_per_step=1.0)
    result = pytester.runpytest(
        "--bench-config", str(config), "-p", "no:cacheprovider", plugins=[StandIn(costs, virtual_clock=True)]
    )
    result.assert_outcomes(passed=2)
    (csv,) = result_files(pytester.path / "run" / "results")
    rows = pd.read_csv(csv).set_index("enable_prefix_caching")
    assert rows.at[False, "prefix_hit_rate"] == 0.0 and rows.at[True, "prefix_hit_rate"] == 0.8
    assert rows.at[False, "prefill_ms_p50"] - rows.at[True, "prefill_ms_p50"] == pytest.approx(2 * 32.0, abs=0.5)
    samples = pd.read_csv(samples_path_for(csv))
    assert set(samples["cached_tokens"]) == {0, 32}
