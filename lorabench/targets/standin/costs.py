"""What each thing costs the stand-in engine, and the switches a test sets on it: one value
object, handed to the engine (``llm``), its scheduler and its server alike."""

from __future__ import annotations

from dataclasses import dataclass

from lorabench.targets.standin.scheduler import KV_BLOCKS


@dataclass(frozen=True)
class Costs:
    """What each thing costs the stand-in, in milliseconds."""

    # Starting the engine: a real vLLM's largest cost in a short run (imports, weights, warm-up).
    build_ms: float = 0.0
    prefill_ms_per_token: float = 0.02
    decode_ms_per_step: float = 1.0
    lora_ms_per_adapter: float = 0.0
    disk_load_ms: float = 0.0
    slot_load_ms: float = 0.0
    # The sender blocks this long on every request it sends (a client that falls behind).
    send_block_ms: float = 0.0
    # An aborted request stays in the engine (and in its steps) this long before it is dropped.
    abort_ms: float = 0.0
    # The KV cache, in blocks of 16 tokens (lorabench.targets.standin.scheduler): not a cost, the capacity.
    kv_blocks: int = KV_BLOCKS
    # A planted bug, not a cost: with prefix caching on, blocks keyed without their adapter, so
    # one adapter's request reuses another's KV (lorabench.targets.standin.prefix_cache).
    blocks_keyed_without_adapter: bool = False
    # A vLLM that keys blocks by the adapter's weights too, which 0.32 does not: an adapter
    # reloaded in place with new weights then finds nothing its old weights cached.
    blocks_keyed_by_weights: bool = False
    # Planted multi-LoRA bugs, one a class the correctness canaries check (docs/canaries.md;
    # lorabench.targets.standin.planted says what each does): not costs either.
    plant_no_effect: bool = False
    plant_base_changed_by_lora: bool = False
    plant_batch_variance: bool = False
    plant_stale_after_eviction: bool = False
    plant_prompt_logprobs_drop_lora: bool = False
    plant_prompt_logprobs_wrong_lora: bool = False
    plant_rank_padding: bool = False
    plant_stale_rows: bool = False
    plant_spec_decode: bool = False
    plant_chunked_prefill: bool = False
