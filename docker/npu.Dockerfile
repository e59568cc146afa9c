# lorabench on an Ascend NPU node, in a container: vllm-ascend's released image (CANN, NNAL,
# torch, torch-npu, vLLM and vllm-ascend of one row of its compatibility matrix), with
# lorabench installed beside them, leaving them as they are. docs/getting-started/npu.md.
#   docker build -f docker/npu.Dockerfile -t lorabench:npu .
# Atlas A3: --build-arg BASE=quay.io/ascend/vllm-ascend:v0.23.0-a3 (openEuler: ...-openeuler).
ARG BASE=quay.io/ascend/vllm-ascend:v0.23.0
FROM ${BASE}

WORKDIR /workspace/lorabench
# What a run reads: the package, the bench modules, the configs, pytest's settings.
COPY pyproject.toml README.md conftest.py ./
COPY lorabench lorabench
COPY bench bench
COPY config config

# lorabench's own dependencies only: the image's stack is a constraint, and the build fails
# if installing lorabench changed any of it.
ARG STACK="^(vllm|vllm[-_]ascend|torch|torch[-_]npu|triton[-_]ascend|numpy)=="
RUN python3 -m pip list --format=freeze | grep -iE "$STACK" > /tmp/image-stack.txt \
    && python3 -m pip install --no-cache-dir --constraint /tmp/image-stack.txt --editable . \
    && python3 -m pip list --format=freeze | grep -iE "$STACK" | diff /tmp/image-stack.txt -

# Without CANN's and NNAL's environment, vllm-ascend's platform does not load, vLLM runs on
# the CPU and every NPU case skips (the session then fails, exit status 2).
ENTRYPOINT ["/bin/bash", "-c", "source /usr/local/Ascend/ascend-toolkit/set_env.sh && source /usr/local/Ascend/nnal/atb/set_env.sh && exec \"$@\"", "--"]
CMD ["pytest", "bench", "-k", "multilora and not online", "--bench-config", "config/npu-llama2-7b.json"]
