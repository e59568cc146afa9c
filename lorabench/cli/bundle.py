"""``lorabench bundle RUN --out FILE.tar.gz``: one run, in one file a user can attach to an issue.

The first runs on an NPU node happen without us; when one goes wrong, the bundle is
what we read. It holds the run's results, samples and digests, its engine logs and the
config it ran (kept in the logs folder when the run starts), what ``lorabench doctor``
says now, and the environment variables of the software stack that runs. It keeps every
setting and hides credentials, told by their names and shapes (lorabench/host/redact.py), in
the environment, the config and the logs alike.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tarfile
from datetime import datetime, timezone
from pathlib import Path
from typing import cast

from lorabench.host.redact import redact_tree, scrub_text, secret_values
from lorabench.results.files import CONFIG_COPY, CONFIG_SOURCE
from lorabench.results.records import digests_path_for, replays_path_for, samples_path_for

# The families of variables that change how the stack runs (vLLM, vllm-ascend, CANN and
# its collectives, torch, CUDA, Hugging Face's libraries, OpenMP, the loader, lorabench):
# every one of them goes into a bundle, credentials hidden. The rest of a shell (HOME,
# PATH, SSH_*, proxies) says nothing about a run.
STACK_PREFIXES = (
    "VLLM_", "ASCEND_", "ATB_", "HCCL_", "NPU_", "CUDA_", "NCCL_", "NVIDIA_", "TORCH_", "PYTORCH_",
    "TRITON_", "GLOO_", "MASTER_", "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "TOKENIZERS_", "SAFETENSORS_",
    "OMP_", "KMP_", "MKL_", "LD_", "LORABENCH_",
)  # fmt: skip
# Columns every lorabench result file has had.
IDENTIFYING = ("run_id", "scenario", "engine_id")


class BundleError(ValueError):
    """Input a bundle cannot be made from."""


def run_files(run: Path, logs: Path | None = None) -> tuple[list[Path], Path | None]:
    """The run's files that exist, and its logs folder: from its result CSV (``<run>.csv``,
    logs in ``<run>.logs``) or, for a run that finished no case, from the logs folder itself."""
    if run.is_dir():
        if not run.name.endswith(".logs"):
            raise BundleError(f"{run}: a folder, but not a run's logs folder (<run>.logs)")
        return [], run
    if not run.is_file():
        raise BundleError(f"{run}: no such file; give a result file (results/<run>.csv) or its <run>.logs folder")
    for kind in ("samples", "digests"):
        if run.name.endswith(f".{kind}.csv"):
            result = run.with_name(run.name.removesuffix(f".{kind}.csv") + ".csv")
            raise BundleError(f"{run}: a run's {kind} file; give its result file, {result}")
    with open(run, encoding="utf-8", errors="replace") as f:
        header = f.readline().strip().split(",")
    if not set(IDENTIFYING).issubset(header):
        raise BundleError(f"{run}: not a lorabench result file (no {', '.join(IDENTIFYING)} columns)")
    if logs is not None and not logs.is_dir():
        raise BundleError(f"--logs {logs}: no such folder")
    replays = replays_path_for(run, "timeline").parent
    files = [p for p in (run, samples_path_for(run), digests_path_for(run)) if p.is_file()]
    files += sorted(p for p in replays.rglob("*") if p.is_file()) if replays.is_dir() else []
    folder = logs if logs is not None else run.with_suffix(".logs")
    return files, folder if folder.is_dir() else None


def environment() -> dict[str, str]:
    """This shell's variables of the stack's families, credentials hidden."""
    stack = {name: value for name, value in sorted(os.environ.items()) if name.startswith(STACK_PREFIXES)}
    return cast(dict[str, str], redact_tree(stack))


def doctor_text(log_dir: Path | None) -> str:
    """What ``lorabench doctor`` says on this host now, for the config the run read (as that file is now)."""
    from lorabench.cli import doctor

    source = log_dir / CONFIG_SOURCE if log_dir is not None else None
    config = Path(source.read_text(encoding="utf-8").strip()) if source and source.is_file() else None
    config = config if config is not None and config.is_file() else None
    try:
        host = doctor.read_host()
        findings = doctor.diagnose(host, config)
    except Exception as exc:  # noqa: BLE001 - a bundle without the doctor's view is still a bundle
        return f"lorabench doctor failed: {type(exc).__name__}: {exc}\n"
    head = f"lorabench doctor: {doctor.describe_host(host)}\nconfig: {config or 'none found'}\n"
    return scrub_text(head + "".join(f.line() + "\n" for f in findings))


def _add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode("utf-8")
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(datetime.now(timezone.utc).timestamp()), 0o644
    tar.addfile(info, io.BytesIO(data))


def redacted_config(path: Path) -> str:
    """The config the run read, every setting kept, credentials hidden."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "(the config copy does not read as JSON: left out)\n"
    return json.dumps(redact_tree(data), indent=2) + "\n"


def known_secrets(config_copy: Path | None) -> list[str]:
    """Values that would be secrets if a log printed them, even where no name or shape
    says so there: this shell's credential-named variables, and the config's ``env``
    values and engine arguments named so (an ``api_key`` a serve target passes, which vLLM
    logs among its arguments)."""
    named: list[tuple[str, object]] = list(os.environ.items())
    try:
        data = json.loads(config_copy.read_text(encoding="utf-8")) if config_copy is not None else {}
    except (OSError, ValueError):
        data = {}
    for section in ("env", "engine"):
        part = data.get(section) if isinstance(data, dict) else None
        named += list(part.items()) if isinstance(part, dict) else []
    return secret_values(named)


def _scrubbed(path: Path, secrets: list[str]) -> str:
    """A log's text with every credential hidden."""
    return scrub_text(path.read_text(encoding="utf-8", errors="replace"), secrets)


def _refuse_clobbering(out: Path, files: list[Path], log_dir: Path | None) -> None:
    out = out.resolve()
    if any(out == f.resolve() for f in files) or (log_dir is not None and log_dir.resolve() in out.parents):
        raise BundleError(f"--out {out}: that is one of the run's own files or folders; write the bundle elsewhere")


def write_bundle(run: Path, out: Path, logs: Path | None = None) -> tuple[list[str], list[str]]:
    """Write the bundle (to a temporary name, then in place); return its member names and
    what it could not find."""
    files, log_dir = run_files(run, logs)
    _refuse_clobbering(out, files, log_dir)
    missing = [] if log_dir is not None else ["no engine logs or config: no <run>.logs folder beside it (--logs DIR)"]
    stem = run.name.removesuffix(".logs").removesuffix(".csv")
    secrets = known_secrets(log_dir / CONFIG_COPY if log_dir is not None else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for path in files:
            tar.add(path, arcname=f"{stem}/{path.relative_to(run.parent)}")
        for path in sorted(p for p in log_dir.rglob("*") if p.is_file()) if log_dir is not None else ():
            name = f"{stem}/logs/{path.relative_to(log_dir)}"
            if path.name == CONFIG_COPY:
                _add_text(tar, name, redacted_config(path))
            else:
                _add_text(tar, name, _scrubbed(path, secrets))
        _add_text(tar, f"{stem}/doctor.txt", doctor_text(log_dir))
        _add_text(tar, f"{stem}/environment.json", json.dumps(environment(), indent=2) + "\n")
        names = tar.getnames()
    os.replace(tmp, out)
    return names, missing


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run's result file (results/<run>.csv), or its <run>.logs folder")
    parser.add_argument("--out", required=True, help="the bundle to write, e.g. run.tar.gz")
    parser.add_argument("--logs", help="the run's logs folder, when it is not <run>.logs beside the result file")


def main(args: argparse.Namespace) -> int:
    try:
        names, missing = write_bundle(Path(args.run), Path(args.out), Path(args.logs) if args.logs else None)
    except (BundleError, OSError) as exc:
        print(f"lorabench bundle: {exc}", file=sys.stderr)
        with contextlib.suppress(OSError):
            Path(args.out + ".tmp").unlink()
        return 2
    print(f"wrote {args.out}:")
    print("".join(f"  {name}\n" for name in names), end="")
    print("".join(f"lorabench bundle: {line}\n" for line in missing), end="")
    return 0
