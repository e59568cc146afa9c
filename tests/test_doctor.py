"""``lorabench doctor`` on fake hosts: package metadata written as dist-info folders, a
fake ``npu-smi`` on PATH, a fake CANN toolkit folder; and once on this real CPU host."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from lorabench import doctor, stack
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
    "vllm": ("0.11.0", ("torch==2.8.0",)),
    "vllm-ascend": ("0.11.0rc1", ("torch==2.7.1", "torch-npu==2.7.1.post1", "pyyaml")),
    "torch": ("2.7.1+cpu", ()),
    "torch-npu": ("2.7.1.post1", ("torch==2.7.1",)),
}


def packages(folder: Path, **changes: tuple[str, tuple[str, ...]]) -> dict[str, stack.Package]:
    """Write dist-info metadata for the stack (MATCHING with ``changes``) and read it back."""
    for name, (version, requires) in {**MATCHING, **{k.replace("_", "-"): v for k, v in changes.items()}}.items():
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
    assert "vllm-ascend 0.11.0rc1" in text and "CANN toolkit 8.2.RC1" in text
    assert "card 0 910B3: 60.0 GiB free of 63.0 GiB" in text


def test_vllm_ascend_built_for_another_vllm(npu_host):
    (line,) = failures(doctor.check_stack(npu_host(vllm=("0.12.0", ()))))
    assert "vllm-ascend 0.11.0rc1 is built for vLLM 0.11.0, but vLLM 0.12.0 is installed" in line
    assert "fix: pip install vllm==0.11.0" in line


def test_torch_npu_against_the_wrong_torch(npu_host):
    findings = doctor.check_stack(npu_host(torch=("2.8.0", ())))
    (line,) = failures(findings)
    assert "torch-npu 2.7.1.post1 runs on torch 2.7.1, but torch 2.8.0 is installed" in line
    notes = [f.text for f in findings if f.level == doctor.NOTE]
    assert any("vllm-ascend 0.11.0rc1 asks for torch==2.7.1" in note for note in notes), notes


def test_a_later_torch_npu_post_release_or_a_dev_build_is_a_note_not_a_stop(npu_host):
    findings = doctor.check_stack(npu_host(torch_npu=("2.7.1.post2", ("torch==2.7.1",))))
    assert failures(findings) == []
    assert any("asks for torch-npu==2.7.1.post1" in f.text for f in findings if f.level == doctor.NOTE)
    assert failures(doctor.check_stack(npu_host(vllm=("0.11.2.dev5", ()), vllm_ascend=("0.11.1.dev3", ())))) == []


def test_an_unsourced_cann(npu_host):
    (line,) = failures(doctor.check_cann(npu_host({"ASCEND_HOME_PATH": None})))
    assert "ASCEND_HOME_PATH is unset" in line and "set_env.sh" in line
    (line,) = failures(doctor.check_cann(npu_host({"ASCEND_OPP_PATH": None})))
    assert "set_env.sh is not sourced" in line


def test_no_npu_smi(npu_host, monkeypatch):
    host = npu_host()
    monkeypatch.setenv("PATH", "/nonexistent")
    (line,) = failures(doctor.check_devices(host))
    assert "npu-smi does not answer: npu-smi not found on PATH" in line


def test_hidden_cards_and_a_fork_start_method(npu_host):
    (line,) = failures(doctor.check_devices(npu_host({"ASCEND_RT_VISIBLE_DEVICES": "5"})))
    assert "ASCEND_RT_VISIBLE_DEVICES=5 hides every card (npu-smi lists 0)" in line
    (line,) = failures(doctor.check_start_method(npu_host({"VLLM_WORKER_MULTIPROC_METHOD": "fork"})))
    assert "cannot initialize torch_npu" in line


def test_a_rank_above_64_on_an_npu_is_a_note(npu_host, tiny_config):
    path = tiny_config(engine={"max_lora_rank": 128})
    findings, _ = doctor.check_config(path, npu_host())
    assert [f.level for f in findings] == [doctor.OK, doctor.NOTE]
    assert "rank 128 is above 64" in findings[1].text
    findings, _ = doctor.check_config(tiny_config(engine={"max_lora_rank": 64}), npu_host())
    assert [f.level for f in findings] == [doctor.OK]


def test_a_config_that_does_not_resolve_fails_with_its_problem(npu_host, tiny_config):
    path = tiny_config(engine={"max_lora_rank": 8})  # the generated adapters have rank 16
    findings, _ = doctor.check_config(path, npu_host())
    assert any(f.level == doctor.FAIL and "above engine.max_lora_rank=8" in f.text for f in findings)


def test_the_exit_status_is_1_when_something_would_stop_a_run(npu_host, monkeypatch, capsys):
    monkeypatch.setattr(doctor, "read_host", lambda: npu_host({"ASCEND_HOME_PATH": None}))
    assert doctor.main(argparse.Namespace(config=None)) == 1
    assert "problem(s) would stop a run" in capsys.readouterr().out
    assert doctor.main(argparse.Namespace(config="/nonexistent.json")) == 2


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
