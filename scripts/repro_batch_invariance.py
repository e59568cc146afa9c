"""Reduces lorabench's batch_invariance canary finding (docs/canaries.md) to vLLM alone: in one
greedy batch ``base:0 A:0 B:1 base:1`` on the CPU backend, does a base request answer otherwise
than alone (as its neighbour's adapter)? Imports vLLM only, so the output can go upstream.

    VLLM_CPU_KVCACHE_SPACE=1 PYTHONHASHSEED=0 python scripts/repro_batch_invariance.py \\
        --model ~/.cache/lorabench/models/tiny-llama-<hash> \\
        --adapter A=<adapters>/dummy-lora-rank-8-0 --adapter B=<adapters>/dummy-lora-rank-16-0 \\
        [--batch "base:0 A:0 B:1 base:1"]... [--max-loras 2] [--enforce-eager]

The engine's arguments are lorabench's for its 2-slot configuration (config/common.json). Each
request of every batch is answered alone first; then each batch (default: the canary's mixed
batch and its base-only control) is sent in one ``LLM.generate``. For a request that answers
otherwise, it prints the first position that differs with the top-2 logprob margin alone and
batched (a near-tie flip or a large change), and which alone answer, if any, it equals.
Exits 1 when any batched request answers otherwise than alone. VLLM_ENABLE_V1_MULTIPROCESSING=0
(engine core in this process) makes every batch one step from its first token; with the default
separate engine core, the first request may start a step alone before the rest arrive.

What it found (0.23.0 and 0.32.0, CPU): a base request batched beside any adapter answers token
for token as the adapter in the LAST LoRA slot (here B, even when B is not in the batch): the
CPU torch ops (vllm/lora/ops/torch_ops/lora_ops.py) index the stacked weights with the no-LoRA
sentinel -1, i.e. slot max_loras-1. With --max-loras 4 (last slot empty) every request passes.
Upstream fixes: vLLM PRs #48421 and #49656 (open).
"""

from __future__ import annotations

import argparse
import os
import sys

# The canary's two prompts (docs/lab/reproducers/canary-batch-invariance.csv, prompt_token_ids).
PROMPT_TEXT = (
    "7751 1668 6842 3234 4050 4622 4089 6215 6434 4409 9803 2100 7886 7419 3762 69"
    " 8384 3016 6431 4690 5600 897 4896 368 1606 1899 31 8881 5156 8239 458 6119",
    "9124 1646 7062 2667 6945 2832 7653 4125 9802 3960 5768 6151 5904 3076 7054 3438"
    " 3650 6925 5069 3983 6628 4839 2454 2576 4693 7021 4095 2901 1063 6308 8819 6896",
)
PROMPTS = [[int(t) for t in text.split()] for text in PROMPT_TEXT]
DEFAULT_BATCHES = ["base:0 A:0 B:1 base:1", "base:0 base:0 base:1 base:1"]
OUTPUT_LEN = 8  # lorabench.measure.correctness.OUTPUT_LEN


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH", help="repeatable; LoRA ids 1, 2, ...")
    p.add_argument("--batch", action="append", metavar="SPEC", help='"base:0 A:0 B:1 base:1"; repeatable')
    p.add_argument("--max-loras", type=int, default=2)
    p.add_argument("--max-lora-rank", type=int, default=16)
    p.add_argument("--max-cpu-loras", type=int, default=12)
    p.add_argument("--enforce-eager", action="store_true", help="default: vLLM's own (unset, as lorabench)")
    return p.parse_args()


def build(args: argparse.Namespace):
    from vllm import LLM

    extra = {"enforce_eager": True} if args.enforce_eager else {}
    return LLM(
        model=os.path.expanduser(args.model),
        seed=0,
        max_model_len=256,
        max_num_seqs=16,
        enable_prefix_caching=False,
        enable_lora=True,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        max_cpu_loras=args.max_cpu_loras,
        **extra,
    )


def send(llm, requests, loras):
    """``requests`` [(adapter name or "base", prompt index)] in one generate call: (tokens, logprobs) each."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=OUTPUT_LEN, ignore_eos=True, logprobs=2)
    prompts = [TokensPrompt(prompt_token_ids=PROMPTS[k]) for _, k in requests]
    outs = llm.generate(prompts, params, lora_request=[loras.get(n) for n, _ in requests], use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].logprobs) for o in outs]


def margin(logprobs, pos: int) -> str:
    """The top-2 logprob margin at ``pos``, and the top token."""
    top = sorted(logprobs[pos].items(), key=lambda kv: kv[1].logprob, reverse=True)[:2]
    gap = top[0][1].logprob - top[1][1].logprob if len(top) > 1 else float("nan")
    return f"top {top[0][0]} margin {gap:.4f}"


def report(name: str, k: int, got, want, alone_answers) -> bool:
    """One batched request against its alone answer; True when it answers as alone."""
    (tokens, lps), (ref, ref_lps) = got, want
    if tokens == ref:
        print(f"  {name}:{k}  same as alone  {tokens}")
        return True
    pos = next(i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b)
    print(f"  {name}:{k}  DIFFERS  batched {tokens}  alone {ref}")
    print(f"      first diff at token {pos}: alone {margin(ref_lps, pos)} | batched {margin(lps, pos)}")
    same = [f"{n}:{j}" for (n, j), (t, _) in alone_answers.items() if t == tokens and (n, j) != (name, k)]
    print(f"      equals alone answer of: {', '.join(same) or 'none'}")
    return False


def main() -> int:
    args = parse_args()
    import vllm
    from vllm.lora.request import LoRARequest

    loras = {}
    for i, spec in enumerate(args.adapter, start=1):
        name, path = spec.split("=", 1)
        loras[name] = LoRARequest(name, i, os.path.expanduser(path))
    batches = [[(n, int(k)) for n, k in (r.split(":") for r in s.split())] for s in args.batch or DEFAULT_BATCHES]
    llm = build(args)
    print(
        f"vLLM {vllm.__version__}  max_loras={args.max_loras} enforce_eager={args.enforce_eager or 'default'}"
        f"  VLLM_ENABLE_V1_MULTIPROCESSING={os.environ.get('VLLM_ENABLE_V1_MULTIPROCESSING', 'unset')}"
    )
    # Alone first in the batches' order (as lorabench: it decides which LoRA slot each adapter
    # takes), then every other (model, prompt) pair, to name whose answer a changed one is.
    order = [*dict.fromkeys(r for b in batches for r in b)]
    order += [(n, k) for n in ["base", *loras] for k in range(len(PROMPTS)) if (n, k) not in order]
    alone = {req: send(llm, [req], loras)[0] for req in order}
    for (n, k), (t, _) in alone.items():
        print(f"alone {n}:{k}  {t}")
    ok = True
    for batch in batches:
        print("batch " + " ".join(f"{n}:{k}" for n, k in batch))
        for (n, k), got in zip(batch, send(llm, batch, loras)):
            ok &= report(n, k, got, alone[(n, k)], alone)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
