"""``lorabench doctor``: would a run start on this host, and what would stop it?

The first run on an NPU node happens without us, so the preflight checks what vllm-ascend
users hit first: a stack whose versions do not pair, a CANN environment that was not
sourced, cards hidden by ``ASCEND_RT_VISIBLE_DEVICES``, a fork start method, a full
disk, a config that does not resolve. It follows the plugin's rule: no device call in
this process (device facts come from ``npu-smi`` / ``nvidia-smi``), and more: it imports
neither vllm-ascend nor torch-npu. Which accelerator the host is set up for comes from
the packages' metadata and the management tools on PATH; what vLLM's platform resolves
to is asked of a Python process of its own, which a broken CANN may crash. One line a
finding, with its fix; exit status 1 when something would stop a run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from lorabench.config.target import URL, Target, chosen_target, parse_target
from lorabench.host import smi, stack
from lorabench.host.cards import check_devices
from lorabench.host.doctor import FAIL, NOTE, OK, Finding, Host, describe_host, read_host
from lorabench.targets import vllm_api, vllm_source
from lorabench.targets.vllm_api import NEWEST_RUN, OLDEST
from lorabench.targets.vllm_source import Source

__all__ = ["Finding", "Host", "check_devices", "describe_host", "diagnose", "main", "read_host"]

START_METHOD = "VLLM_WORKER_MULTIPROC_METHOD"
SET_ENV = "source /usr/local/Ascend/ascend-toolkit/set_env.sh"
ATB_SET_ENV = "source /usr/local/Ascend/nnal/atb/set_env.sh"
# Below this much free space a model or adapter download stops the run; below the note level it may.
DISK_FAIL_GIB, DISK_NOTE_GIB = 2.0, 20.0
RANGE_FIX = f"pip install a vLLM from {OLDEST} on (docs/releases.md)"
RANGE_DOC = "docs/releases.md says what was run on each release"
# vllm-ascend's AscendC LoRA kernels (bgmv/sgmv) cover ranks up to this one (docs/npu.md).
ASCEND_KERNEL_MAX_RANK = 64


def check_stack(host: Host) -> list[Finding]:
    if "vllm" in host.packages:
        found = [Finding(OK, stack.describe(host.packages))]
    else:
        found = [Finding(FAIL, "vLLM is not installed", "pip install -e '.[cpu]' (or '.[gpu]', '.[npu]')")]
    found += check_vllm_release(host)
    found += [Finding(FAIL, problem, fix) for problem, fix in stack.mismatches(host.packages)]
    found += [Finding(NOTE, problem, fix) for problem, fix in stack.unmet_pins(host.packages)]
    if host.device_type == "npu" and "torch-npu" not in host.packages:
        found.append(Finding(FAIL, "torch-npu is not installed", "pip install the torch-npu vllm-ascend pins"))
    return found + check_platform(host)


def check_vllm_release(host: Host, source: Source | None = None) -> list[Finding]:
    """The installed vLLM against lorabench's range (``vllm_api.OLDEST`` on; run up to
    ``NEWEST_RUN``), and the names lorabench touches read from its source: a missing one stops
    a run where the engine or LoRA needs it, and is a note where it blanks or skips a feature."""
    vllm = host.packages.get("vllm")
    if vllm is None:
        return []
    got, oldest, newest = stack.release(vllm.version), stack.release(OLDEST), stack.release(NEWEST_RUN)
    if got and got < oldest:
        found = [Finding(FAIL, f"vLLM {vllm.version} is older than lorabench supports ({OLDEST} on)", RANGE_FIX)]
    elif got and got > newest:
        found = [Finding(NOTE, f"vLLM {vllm.version} is newer than any lorabench has run on ({NEWEST_RUN})", RANGE_DOC)]
    else:
        found = [Finding(OK, f"vLLM {vllm.version} is in lorabench's range ({OLDEST} to {NEWEST_RUN}, {RANGE_DOC})")]
    source = source or vllm_source.installed()
    gone = vllm_api.missing(source) if source is not None else []
    for feature in dict.fromkeys(n.feature for n in gone):
        names = ", ".join(str(n) for n in gone if n.feature == feature)
        stops = feature in (vllm_api.ENGINE, vllm_api.LORA)
        text = f"this vLLM lacks {names}: {vllm_api.FEATURES[feature]}" + ("" if stops else " stays blank or skips")
        found.append(Finding(FAIL if stops else NOTE, text, RANGE_FIX if stops else RANGE_DOC))
    return found


def check_platform(host: Host) -> list[Finding]:
    """vLLM's platform, resolved in a process of its own, is the accelerator the host is set up for."""
    vllm = host.packages.get("vllm")
    if vllm is None or not host.vllm_platform or host.vllm_platform == host.device_type:
        return []
    got = f"vLLM's platform is {host.vllm_platform}" if host.vllm_platform != "none" else "vLLM's platform fails"
    why = f" ({host.platform_note})" if host.platform_note else ""
    if host.device_type == "npu" and "vllm-ascend" not in host.packages:
        problem, fix = f"vllm-ascend is not installed: {got}", f"pip install vllm-ascend=={vllm.version}"
    elif host.device_type == "npu":
        problem, fix = f"vllm-ascend is installed but {got}{why}", f"{SET_ENV}; python -c 'import vllm_ascend'"
    elif host.device_type == "cuda":
        problem, fix = f"nvidia-smi is on PATH but {got}{why}", "install vLLM's CUDA build: pip install -e '.[gpu]'"
    else:
        problem, fix = f"{got}{why}", "python -c 'from vllm.platforms import current_platform' shows why"
    return [Finding(FAIL, problem, fix)]


def check_cann(host: Host) -> list[Finding]:
    """CANN's toolkit must be installed and its set_env.sh sourced in the shell that runs pytest;
    vllm-ascend's recent releases also need NNAL's ATB library (its own set_env.sh)."""
    home = host.environ.get("ASCEND_HOME_PATH", "")
    if not home:
        installed = (smi.ASCEND_ROOT / "ascend-toolkit" / "set_env.sh").is_file()
        fix = SET_ENV if installed else f"install CANN's toolkit (vllm-ascend's install guide names it), then {SET_ENV}"
        return [Finding(FAIL, "CANN's environment is not set: ASCEND_HOME_PATH is unset", fix)]
    version = smi.toolkit_version(Path(home))
    found = [
        Finding(OK, f"CANN toolkit {version} at {home}")
        if version
        else Finding(FAIL, f"no CANN toolkit version readable under ASCEND_HOME_PATH={home}", "install CANN there")
    ]
    library_path = host.environ.get("LD_LIBRARY_PATH", "")
    if not host.environ.get("ASCEND_OPP_PATH") or home.rstrip("/") not in library_path:
        found.append(
            Finding(FAIL, "CANN's set_env.sh is not sourced (ASCEND_OPP_PATH or LD_LIBRARY_PATH lacks it)", SET_ENV)
        )
    if "vllm-ascend" in host.packages and not host.environ.get("ATB_HOME_PATH"):
        found.append(
            Finding(
                NOTE,
                "NNAL's ATB is not set up (ATB_HOME_PATH is unset): recent vllm-ascend needs libatb.so",
                ATB_SET_ENV,
            )
        )
    return found


def check_start_method(host: Host) -> list[Finding]:
    value = host.environ.get(START_METHOD, "")
    if host.device_type == "npu" and value == "fork":
        return [
            Finding(
                FAIL,
                f"{START_METHOD}=fork: a forked engine core cannot initialize torch_npu (vllm-ascend issue 4502)",
                f"unset {START_METHOD}: lorabench starts engines with spawn",
            )
        ]
    if value:
        return [Finding(OK, f"engine processes start with {value} ({START_METHOD})")]
    chosen = "spawn (set by lorabench)" if host.device_type in ("npu", "cuda") else "spawn (set by vLLM's CPU platform)"
    return [Finding(OK, f"engine processes start with {chosen}")]


def check_disk(folders: list[Path]) -> list[Finding]:
    """Free space once per filesystem that holds one of ``folders`` (the cache, the model, the adapters)."""
    by_device: dict[int, list[Path]] = {}
    for folder in dict.fromkeys(folders):
        by_device.setdefault(_existing(folder).stat().st_dev, []).append(folder)
    found = []
    for paths in by_device.values():
        free_gib = shutil.disk_usage(_existing(paths[0])).free / 2**30
        level = FAIL if free_gib < DISK_FAIL_GIB else NOTE if free_gib < DISK_NOTE_GIB else OK
        fix = "free space there, or point LORABENCH_CACHE_DIR elsewhere" if level != OK else ""
        found.append(Finding(level, f"{free_gib:.1f} GiB free for {', '.join(map(str, paths))}", fix))
    return found


def _existing(folder: Path) -> Path:
    """The folder, or its nearest parent that exists (a cache not made yet)."""
    return next((p for p in (folder, *folder.parents) if p.exists()), Path("/"))


def check_config_device(device: str | None, host: Host) -> list[Finding]:
    """A config for one device on a host whose vLLM runs another: every case of the run would
    be skipped ("needs vLLM's cuda platform"), and the run would exit 0 having measured nothing."""
    platform = host.vllm_platform
    if device is None or not platform or platform == "none" or platform == device:
        return []
    return [
        Finding(
            FAIL,
            f"the config's device is {device}, and this host's vLLM runs on {platform}: every case would be skipped",
            f"install vLLM's {device} build here, or set the config's device to {platform}",
        )
    ]


def check_config(path: Path | None, host: Host, target: Target | None = None) -> tuple[list[Finding], list[Path], Any]:
    """The config resolves (as the plugin would resolve it for ``target``), and its ranks suit the kernels;
    also the folders whose free space matters, and the config as resolved (None when it did not resolve)."""
    from lorabench.config import ConfigError, read_config_file, resolve_config
    from lorabench.load import builtin
    from lorabench.targets.vllm_args import engine_arg_names

    folders = [builtin.cache_dir()]
    if path is None:
        return [Finding(NOTE, "no config checked", "lorabench doctor --config FILE")], folders, None
    try:
        file = read_config_file(path)
        # A URL's server was started with engine arguments the local vLLM need not know (as in a run).
        local = chosen_target(target, file.target).kind != URL
        config = resolve_config(path, file, needs_lora=True, engine_args=engine_arg_names if local else None)
    except ConfigError as exc:
        return [Finding(FAIL, problem, "see docs/configuration.md") for problem in exc.problems], folders, None
    except Exception as exc:  # noqa: BLE001 - a broken install or a full disk is a finding, not a traceback
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return [Finding(FAIL, f"{path} does not resolve: {reason}", "fix what it names, and run again")], folders, None
    folders += [config.model, *(a.path.parent for a in config.adapters[:1])]
    return _ranks(path, config, host), folders, config


def _ranks(path: Path, config, host: Host) -> list[Finding]:
    from lorabench.config.expand import as_list

    ranks = sorted({a.rank for a in config.adapters if a.rank} | set(as_list(config.file.engine.max_lora_rank)))
    found = [Finding(OK, f"{path} resolves: {len(config.adapters)} adapters, ranks {', '.join(map(str, ranks))}")]
    if host.device_type == "npu" and ranks and ranks[-1] > ASCEND_KERNEL_MAX_RANK:
        found.append(
            Finding(
                NOTE,
                f"rank {ranks[-1]} is above {ASCEND_KERNEL_MAX_RANK}: with max_lora_rank 128 or more, vllm-ascend "
                "runs LoRA on torch ops instead of its AscendC kernels (bgmv/sgmv)",
                f"compare ranks on the same side of {ASCEND_KERNEL_MAX_RANK}, or read a change across it as a "
                "change of kernel",
            )
        )
    return found


def diagnose(host: Host, config: Path | None, target: Target | None = None) -> list[Finding]:
    """Every finding, in the order they are printed. The devices and the start method are
    checked with the config's ``env`` over the shell's, as its engines will see them; with a
    server at a URL as the target (``target``, else the config's), the server instead."""
    config_found, folders, resolved = check_config(config, host, target)
    file = resolved.file if resolved is not None else None
    target = chosen_target(target, file.target if file is not None else None)
    if target.kind == URL:
        from lorabench.targets.http import doctor as doctor_target

        return doctor_target.at_url(resolved, target) + config_found + check_disk(folders)
    found = check_stack(host) + (check_cann(host) if host.device_type == "npu" else [])
    found += check_config_device(file.device if file is not None else None, host)
    env = {k: str(v) for k, v in file.env.items()} if file is not None else {}
    engine = (file.engine.model_extra or {}) if file is not None else {}
    engines = replace(host, environ={**host.environ, **env})
    found += check_devices(engines, engine) + check_start_method(engines)
    return found + config_found + check_disk(folders)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config file to resolve (default: config/common.json when it exists)")
    parser.add_argument("--target", help="where a run's requests go, as --bench-target: inprocess, serve or a URL")


def main(args: argparse.Namespace) -> int:
    config = Path(args.config) if args.config else Path("config/common.json")
    if args.config and not config.is_file():
        print(f"lorabench doctor: --config {config}: no such file; give the config a run would use", file=sys.stderr)
        return 2
    try:
        target = parse_target(args.target) if getattr(args, "target", None) else None
    except ValueError as exc:
        print(f"lorabench doctor: --target {args.target}: {exc}", file=sys.stderr)
        return 2
    host = read_host()
    if not torch_imported():
        # torch >= 2.5 imports torch-npu with itself unless told not to; this process needs neither.
        os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    print(f"lorabench doctor: {describe_host(host)}")
    findings = diagnose(host, config if config.is_file() else None, target)
    for finding in findings:
        print(finding.line())
    stops = sum(f.level == FAIL for f in findings)
    print(f"{stops} problem(s) would stop a run" if stops else "nothing found that would stop a run")
    return 1 if stops else 0


def torch_imported() -> bool:
    return "torch" in sys.modules
