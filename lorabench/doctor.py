"""``lorabench doctor``: would a run start on this host, and what would stop it?

The first run on an NPU node happens without us, so the preflight checks what vllm-ascend
users hit first: a stack whose versions do not pair, a CANN environment that was not
sourced, cards hidden by ``ASCEND_RT_VISIBLE_DEVICES``, a fork start method, a full
disk, a config that does not resolve. It follows the plugin's rule: no device call in
this process (device facts come from ``npu-smi`` / ``nvidia-smi``). One line a finding,
with its fix; exit status 1 when something would stop a run.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lorabench import smi, stack
from lorabench.stack import Package

OK, NOTE, FAIL = "ok", "note", "FAIL"
START_METHOD = "VLLM_WORKER_MULTIPROC_METHOD"
SET_ENV = "source /usr/local/Ascend/ascend-toolkit/set_env.sh"
# Below this much free space a model or adapter download stops the run; below the note level it may.
DISK_FAIL_GIB, DISK_NOTE_GIB = 2.0, 20.0
# vllm-ascend's AscendC LoRA kernels (bgmv/sgmv) cover ranks up to this one (docs/npu.md).
ASCEND_KERNEL_MAX_RANK = 64


@dataclass(frozen=True)
class Finding:
    level: str
    text: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.level:<4}  {self.text}" + (f" -- fix: {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class Host:
    """What the checks read, gathered in one place so a test can fake any part of it."""

    packages: Mapping[str, Package]
    device_type: str
    environ: Mapping[str, str] = field(default_factory=dict)
    platform_note: str = ""


def read_host() -> Host:
    from lorabench.device import detect_platform

    platform = detect_platform()
    return Host(stack.installed(), platform.device_type, dict(os.environ), platform.note)


def check_stack(host: Host) -> list[Finding]:
    if "vllm" in host.packages:
        found = [Finding(OK, stack.describe(host.packages))]
    else:
        found = [Finding(FAIL, "vLLM is not installed", "pip install -e '.[cpu]' (or '.[gpu]', '.[npu]')")]
    found += [Finding(FAIL, problem, fix) for problem, fix in stack.mismatches(host.packages)]
    found += [Finding(NOTE, problem, fix) for problem, fix in stack.unmet_pins(host.packages)]
    if "vllm-ascend" in host.packages and host.device_type != "npu":
        why = host.platform_note or f"vLLM's platform is {host.device_type}"
        found.append(Finding(FAIL, f"vllm-ascend is installed but no NPU platform loads ({why})", SET_ENV))
    elif host.device_type == "npu" and "torch-npu" not in host.packages:
        found.append(Finding(FAIL, "torch-npu is not installed", "pip install the torch-npu vllm-ascend pins"))
    return found


def check_cann(host: Host) -> list[Finding]:
    """CANN's toolkit must be installed and its set_env.sh sourced in the shell that runs pytest."""
    home = host.environ.get("ASCEND_HOME_PATH", "")
    if not home:
        return [Finding(FAIL, "CANN's environment is not set: ASCEND_HOME_PATH is unset", SET_ENV)]
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
    return found


def check_devices(host: Host) -> list[Finding]:
    if host.device_type not in smi.VISIBLE_VARIABLES:
        return [Finding(OK, f"{host.device_type} host: no accelerator to check")]
    tool = "npu-smi" if host.device_type == "npu" else "nvidia-smi"
    variable = smi.VISIBLE_VARIABLES[host.device_type]
    try:
        devices = smi.read_devices(host.device_type)
    except smi.DeviceToolError as exc:
        return [Finding(FAIL, f"{tool} does not answer: {exc}", f"install the driver and put {tool} on PATH")]
    seen = smi.visible(devices, host.device_type, host.environ)
    if not seen:
        listed = ", ".join(str(d.index) for d in devices)
        return [
            Finding(
                FAIL,
                f"{variable}={host.environ.get(variable)} hides every card ({tool} lists {listed})",
                f"set {variable} to cards {tool} lists",
            )
        ]
    return [
        Finding(OK, f"card {d.index} {d.name}: {_gib(d.total_mib - d.used_mib)} free of {_gib(d.total_mib)}")
        for d in seen
    ]


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


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
    chosen = "spawn (set by lorabench)" if host.device_type in ("npu", "cuda") else "vLLM's choice"
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


def check_config(path: Path | None, host: Host) -> tuple[list[Finding], list[Path]]:
    """The config resolves (as the plugin would resolve it), and its ranks suit the kernels;
    also the folders whose free space matters."""
    from lorabench import builtin
    from lorabench.config import ConfigError, read_config_file, resolve_config
    from lorabench.config.expand import as_list

    folders = [builtin.cache_dir()]
    if path is None:
        return [Finding(NOTE, "no config checked", "lorabench doctor --config FILE")], folders
    try:
        config = resolve_config(path, read_config_file(path), needs_lora=True)
    except ConfigError as exc:
        return [Finding(FAIL, problem, "see docs/configuration.md") for problem in exc.problems], folders
    except Exception as exc:  # noqa: BLE001 - a broken install or a full disk is a finding, not a traceback
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return [Finding(FAIL, f"{path} does not resolve: {reason}", "fix what it names, and run again")], folders
    folders += [config.model, *(a.path.parent for a in config.adapters[:1])]
    ranks = sorted({a.rank for a in config.adapters if a.rank} | set(as_list(config.file.engine.max_lora_rank)))
    found = [Finding(OK, f"{path} resolves: {len(config.adapters)} adapters, ranks {', '.join(map(str, ranks))}")]
    if host.device_type == "npu" and ranks and ranks[-1] > ASCEND_KERNEL_MAX_RANK:
        found.append(
            Finding(
                NOTE,
                f"rank {ranks[-1]} is above {ASCEND_KERNEL_MAX_RANK}: vllm-ascend's AscendC LoRA kernels cover "
                f"ranks up to {ASCEND_KERNEL_MAX_RANK}, above that LoRA runs on torch ops",
                "compare ranks on the same side of 64, or read a change across it as a change of kernel",
            )
        )
    return found, folders


def diagnose(host: Host, config: Path | None) -> list[Finding]:
    found = check_stack(host)
    if host.device_type == "npu" or "vllm-ascend" in host.packages:
        found += check_cann(host)
    found += check_devices(host) + check_start_method(host)
    config_found, folders = check_config(config, host)
    return found + config_found + check_disk(folders)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config file to resolve (default: config/common.json when it exists)")


def main(args: argparse.Namespace) -> int:
    config = Path(args.config) if args.config else Path("config/common.json")
    if args.config and not config.is_file():
        print(f"lorabench doctor: --config {config}: no such file")
        return 2
    host = read_host()
    where = f"{host.device_type} host" + (f" ({host.platform_note})" if host.platform_note else "")
    print(f"lorabench doctor: {where}")
    findings = diagnose(host, config if config.is_file() else None)
    for finding in findings:
        print(finding.line())
    stops = sum(f.level == FAIL for f in findings)
    print(f"{stops} problem(s) would stop a run" if stops else "nothing found that would stop a run")
    return 1 if stops else 0
