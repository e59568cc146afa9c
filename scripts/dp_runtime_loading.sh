#!/usr/bin/env bash
# The dp_runtime_loading canary class by hand (docs/canaries.md): vLLM's OpenAI server for the
# built-in tiny Llama with DP data-parallel ranks on the CPU, an adapter loaded at run time
# through /v1/load_lora_adapter, then 12 requests to it at once. Each answer is printed beside
# the base model's: a rank the load did not reach answers as the base model, or with an error.
# The per-engine log lines say which ranks served. (One front end: the api_server module, as
# lorabench's serve target starts it, runs one whatever --api-server-count says.)
#   scripts/dp_runtime_loading.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DP=${DP:-2}
PORT=${PORT:-8765}
LOG=${LOG:-/tmp/dp_runtime_loading.log}
python -c "from lorabench.load.builtin import ensure_model; ensure_model('tiny-llama')" >/dev/null
MODEL=$(python -c "from lorabench.load.builtin import ensure_model; print(ensure_model('tiny-llama'))")
ADAPTER=$(python - <<PY
import json
from lorabench.load.builtin import ensure_dummy_adapters
from pathlib import Path
a = ensure_dummy_adapters(Path("$MODEL"), ["Say hello."], count=1, ranks=[8], target_modules=["q_proj", "v_proj"], seed=0)
print(a[0].path)
PY
)
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
# A process group of its own, so that every process of the server goes with it at the end.
setsid python -m vllm.entrypoints.openai.api_server --model "$MODEL" --port "$PORT" --data-parallel-size "$DP" \
    --enable-lora --max-loras 2 --max-lora-rank 16 --max-model-len 256 --max-num-seqs 8 --enforce-eager \
    >"$LOG" 2>&1 &
pid=$!
stop() {
    kill -TERM -- "-$pid" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 -- "-$pid" 2>/dev/null || return; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null
}
trap stop EXIT
for _ in $(seq 1 600); do
    curl -sf "localhost:$PORT/health" >/dev/null && break
    kill -0 $pid 2>/dev/null || { echo "the server exited: see $LOG"; exit 1; }
    sleep 1
done
ask() {
    curl -s "localhost:$PORT/v1/completions" -H 'Content-Type: application/json' -d "{\"model\": \"$1\", \"prompt\": [5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20], \"max_tokens\": 6, \"temperature\": 0, \"return_token_ids\": true}" |
        python -c "import sys, json; d = json.load(sys.stdin); c = d.get('choices'); print('$2', c[0]['token_ids'] if c else d)"
}
ask "$MODEL" "base"
curl -s -X POST "localhost:$PORT/v1/load_lora_adapter" -H 'Content-Type: application/json' \
    -d "{\"lora_name\": \"a0\", \"lora_path\": \"$ADAPTER\"}"
echo
asks=()
for i in $(seq 1 12); do ask a0 "a0 #$i" & asks+=($!); done
wait "${asks[@]}"  # not the server's job
sleep 11  # one stats interval: each engine's line says whether it served
grep -E "Engine 00[0-9]: Avg prompt throughput: [1-9]" "$LOG" | sed 's/.*\(Engine 00[0-9]\): \(Avg prompt throughput: [0-9.]* tokens\/s\).*/\1 served (\2)/' | sort -u
