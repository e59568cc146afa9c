"""``lorabench bundle RUN --out FILE.tar.gz``: one run, in one file a user can attach to an issue.

The first runs on an NPU node happen without us; when one goes wrong, the bundle is
what we read. It holds the run's results, samples and digests, its engine logs and the
config it ran (kept in the logs folder when the run starts), what ``lorabench doctor``
says now, and the environment variables that change how vLLM runs. Only variables from
a list of known names are written, so no token or key leaves the machine; the config's
possible secrets are redacted, and the values of secret-named variables and arguments
are replaced wherever a log printed them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import tarfile
from datetime import datetime, timezone
from pathlib import Path

from lorabench.records import digests_path_for, replays_path_for, samples_path_for
from lorabench.results import CONFIG_COPY, CONFIG_SOURCE

# What a bundle may say about the environment: settings of vLLM, CANN, the devices and lorabench.
KNOWN_VARIABLES = (
    "ASCEND_HOME_PATH",
    "ASCEND_TOOLKIT_HOME",
    "ASCEND_OPP_PATH",
    "ASCEND_RT_VISIBLE_DEVICES",
    "ASCEND_LAUNCH_BLOCKING",
    "ASCEND_GLOBAL_LOG_LEVEL",
    "ATB_HOME_PATH",
    "CUDA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "PYTORCH_NPU_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
    "OMP_NUM_THREADS",
    "VLLM_WORKER_MULTIPROC_METHOD",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    "VLLM_LOGGING_LEVEL",
    "VLLM_PLUGINS",
    "HF_HUB_OFFLINE",
    "LORABENCH_CACHE_DIR",
    "LORABENCH_CPU_BINDING",
    "LORABENCH_TIMELINE",
)
REDACTED = "(redacted)"
SECRET_MIN_CHARS = 6
_SECRET = re.compile(r"token|key|secret|password", re.IGNORECASE)
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
    return {name: os.environ[name] for name in KNOWN_VARIABLES if name in os.environ}


def doctor_text(log_dir: Path | None) -> str:
    """What ``lorabench doctor`` says on this host now, for the config the run read (as that file is now)."""
    from lorabench import doctor

    source = log_dir / CONFIG_SOURCE if log_dir is not None else None
    config = Path(source.read_text(encoding="utf-8").strip()) if source and source.is_file() else None
    config = config if config is not None and config.is_file() else None
    try:
        host = doctor.read_host()
        findings = doctor.diagnose(host, config)
    except Exception as exc:  # noqa: BLE001 - a bundle without the doctor's view is still a bundle
        return f"lorabench doctor failed: {type(exc).__name__}: {exc}\n"
    head = f"lorabench doctor: {doctor.describe_host(host)}\nconfig: {config or 'none found'}\n"
    return head + "".join(f.line() + "\n" for f in findings)


def _add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode("utf-8")
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(datetime.now(timezone.utc).timestamp()), 0o644
    tar.addfile(info, io.BytesIO(data))


def redacted_config(path: Path) -> str:
    """The config the run read, with what could be a secret left out: ``env`` values not on
    the known list, and engine arguments named like a token, key, secret or password."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "(the config copy does not read as JSON: left out)\n"
    env = data.get("env") if isinstance(data, dict) else None
    if isinstance(env, dict):
        data["env"] = {k: (v if k in KNOWN_VARIABLES or k.startswith("//") else REDACTED) for k, v in env.items()}
    engine = data.get("engine") if isinstance(data, dict) else None
    if isinstance(engine, dict):
        data["engine"] = {k: (REDACTED if _SECRET.search(k) else v) for k, v in engine.items()}
    return json.dumps(data, indent=2) + "\n"


def secret_values(config_copy: Path | None) -> list[str]:
    """Values that would be secrets if a log printed them: this environment's variables named
    like a token, key, secret or password, and the config's ``env`` values and engine arguments
    named so (an ``api_key`` a serve target passes, which vLLM logs among its arguments).
    Short values are left alone: "1" is no secret, and replacing it would garble the logs."""
    named: list[object] = [v for k, v in os.environ.items() if _SECRET.search(k) and k not in KNOWN_VARIABLES]
    try:
        data = json.loads(config_copy.read_text(encoding="utf-8")) if config_copy is not None else {}
    except (OSError, ValueError):
        data = {}
    for section in ("env", "engine"):
        part = data.get(section) if isinstance(data, dict) else None
        named += [v for k, v in part.items() if _SECRET.search(k)] if isinstance(part, dict) else []
    flat = [x for v in named for x in (v if isinstance(v, list) else [v]) if isinstance(x, (str, int))]
    values = {str(x) for x in flat if len(str(x)) >= SECRET_MIN_CHARS}
    return sorted(values, key=len, reverse=True)


def _scrubbed(path: Path, secrets: list[str]) -> str:
    """A log's text with every secret value replaced."""
    text = path.read_text(encoding="utf-8", errors="replace")
    for value in secrets:
        text = text.replace(value, REDACTED)
    return text


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
    secrets = secret_values(log_dir / CONFIG_COPY if log_dir is not None else None)
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
        print(f"lorabench bundle: {exc}")
        with contextlib.suppress(OSError):
            Path(args.out + ".tmp").unlink()
        return 2
    print(f"wrote {args.out}:")
    print("".join(f"  {name}\n" for name in names), end="")
    print("".join(f"lorabench bundle: {line}\n" for line in missing), end="")
    return 0
