#!/usr/bin/env bash
# A nightly lorabench run on an NPU node, for cron or a Jenkins job (docs/nightly.md): the
# benchmark, the run added to the history store, the store's page, then the gate.
#   crontab -e:  0 2 * * * /srv/lorabench/examples/nightly/nightly.sh >> /var/lib/lorabench/cron.log 2>&1
# Settings, from the environment:
#   NIGHTLY_DIR          the store, the runs and the page, on this node's local disk (/var/lib/lorabench)
#   LORABENCH_CONFIG     the benchmark config (config/my-npu.json)
#   LORABENCH_SELECTION  the cases, as pytest -k ("multilora and not online")
#   LORABENCH_VENV       an environment to activate (none: lorabench is on PATH, as in the image)
# Exit status: 0 measured and the gate passed; 1 the gate failed, or cases failed; 2 nothing
# measured (every case skipped, bad input, interrupted) or a store that cannot be read;
# 3 to 5 pytest's own.
set -euo pipefail
cd "$(dirname "$0")/../.."

DIR=${NIGHTLY_DIR:-/var/lib/lorabench}
CONFIG=${LORABENCH_CONFIG:-config/my-npu.json}
SELECTION=${LORABENCH_SELECTION:-multilora and not online}
STORE=$DIR/nightly.db
RUN=$DIR/runs/run-$(date -u +%Y%m%dT%H%M%SZ).csv
export LORABENCH_HOSTNAME=${LORABENCH_HOSTNAME:-$(hostname)}

# cron starts with almost no environment: CANN's and NNAL's, then lorabench's. Without the
# first two every NPU case skips, and pytest exits 2 saying so.
set +u
for script in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/nnal/atb/set_env.sh \
    ${LORABENCH_VENV:+"$LORABENCH_VENV/bin/activate"}; do
    # shellcheck disable=SC1090
    if [ -f "$script" ]; then source "$script"; fi
done
set -u
mkdir -p "$DIR/runs"

bench=0
pytest bench -k "$SELECTION" --bench-config "$CONFIG" --bench-output "$RUN" -p no:cacheprovider || bench=$?
if [ "$bench" -gt 1 ]; then
    echo "nightly: pytest exit $bench: nothing to add to $STORE (its lines above say why)" >&2
    exit "$bench"
fi

# The store is one SQLite file on this node's local disk: add, draw and judge under one
# lock, so a manual run or a second job waits instead of reading a store half added to.
gate=0
{
    flock 9
    lorabench history add --db "$STORE" "$RUN"
    lorabench history report --db "$STORE" --out "$DIR/page"
    lorabench history check --db "$STORE" --config "$CONFIG" --max-age 30h || gate=$?
} 9>"$DIR/nightly.lock"

if [ "$gate" -ne 0 ]; then
    exit "$gate"
fi
exit "$bench"
