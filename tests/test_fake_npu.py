"""An Ascend host as the pytest process sees it, with every device call a tripwire.

vLLM's platform becomes an NPU platform whose device calls (the ones that initialize
torch_npu on a real node) are recorded, ``torch.npu`` and ``torch_npu`` are recorders
too, and ``npu-smi`` is a script on PATH that prints recorded output. Platform
detection, provenance, memory, the wait between builds and the plugin's collection run
against them; the test fails if any of them reached for the device in this process,
which on a real node breaks every engine started afterwards (vllm-ascend issue 4502).
"""

from __future__ import annotations

import os
import sys
import threading
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from lorabench.host import device, smi
from lorabench.host.memory import DeviceNotReleased, PeakMemory
from lorabench.results.provenance import provenance
from lorabench.targets.vllm_args import engine_arg_names

ROOT = Path(__file__).resolve().parent.parent

# Device calls of vLLM's Platform: each initializes the runtime on vllm-ascend.
DEVICE_CALLS = (
    "get_device_name",
    "get_device_uuid",
    "get_device_total_memory",
    "get_device_capability",
    "has_device_capability",
    "get_current_memory_usage",
    "set_device",
    "mem_get_info",
    "synchronize",
    "get_all_gpu_pci_bus_ids",
    "is_integrated_gpu",
)

NPU_SMI = """\
| npu-smi 24.1.rc2.1               Version: 24.1.rc2.1                                           |
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
| 0     910B3               | OK            | 96.5        36                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          {0} / 65536         |
| 1     910B3               | OK            | 96.5        36                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          {1} / 65536         |
"""


# Queries that count devices without initializing the runtime (as torch.cuda's do);
# transformers asks is_available() when vLLM imports it. Answered "no", so that
# transformers does not go on to import torch_npu's kernels, which this fake lacks.
QUERIES = {"is_available": lambda: False, "device_count": lambda: 0}


class Tripwire(ModuleType):
    """Stands for a device runtime: any use is recorded, then refused. Module metadata
    (``__spec__`` and the like, which "is it installed?" checks read) and the device
    count queries above are not a use."""

    def __init__(self, name: str, calls: list[str]) -> None:
        super().__init__(name)
        self.__spec__ = ModuleSpec(name, None)
        self._name, self._calls = name, calls

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr in QUERIES:
            return QUERIES[attr]
        self._calls.append(f"{self._name}.{attr}")
        raise AssertionError(f"{self._name}.{attr} touched the device from the pytest process")


def fake_npu_platform(calls: list[str]):
    from vllm.platforms.interface import Platform, PlatformEnum

    def trip(name):
        def call(*args, **kwargs):
            calls.append(f"current_platform.{name}")
            raise AssertionError(f"current_platform.{name} touched the device from the pytest process")

        return classmethod(lambda cls, *a, **k: call(*a, **k))

    attrs = {"_enum": PlatformEnum.OOT, "device_name": "npu", "device_type": "npu", "dispatch_key": "PrivateUse1"}
    attrs.update({name: trip(name) for name in DEVICE_CALLS})
    return type("FakeNPUPlatform", (Platform,), attrs)()


@pytest.fixture
def npu_smi(monkeypatch, tmp_path):
    """An NPU host's management tool: returns (calls, set_hbm) where set_hbm(used0, used1)
    changes what npu-smi reports; torch_npu is a tripwire."""
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "torch_npu", Tripwire("torch_npu", calls))
    monkeypatch.setattr(smi, "ASCEND_HOME", tmp_path / "no-cann")
    monkeypatch.setattr(smi, "ASCEND_ROOT", tmp_path / "no-ascend")
    output = tmp_path / "npu-smi.txt"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npu-smi").write_text(f'#!/bin/sh\n[ "$1" = info ] || exit 2\ncat "{output}"\n')
    (bin_dir / "npu-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)

    def set_hbm(used0: int, used1: int) -> None:
        output.write_text(NPU_SMI.format(used0, used1))

    set_hbm(3300, 3100)
    yield calls, set_hbm
    assert calls == [], f"device touched from the pytest process: {calls}"


@pytest.fixture
def fake_npu(npu_smi, monkeypatch):
    """An NPU host as vLLM sees it too: its platform is npu, and every device call of it, and
    torch.npu, a tripwire. vLLM's own platform classes, so tests using it import vLLM (the
    engine tier: ``pytest -m engine``)."""
    import torch
    import vllm.platforms

    calls, _ = npu_smi
    monkeypatch.setattr(vllm.platforms, "_current_platform", fake_npu_platform(calls))
    monkeypatch.setattr(torch, "npu", Tripwire("torch.npu", calls), raising=False)
    device.detect_platform.cache_clear()
    yield npu_smi
    device.detect_platform.cache_clear()


@pytest.mark.engine  # vLLM's platform classes, imported in this process
def test_detection_and_provenance_read_the_device_from_outside(fake_npu):
    calls, _ = fake_npu
    platform = device.detect_platform()
    assert (platform.device_type, platform.device_name, platform.note) == ("npu", "Ascend 910B3", "")
    row = provenance(Path(ROOT), platform, "m")
    assert row["device_type"] == "npu" and row["device_name"] == "Ascend 910B3"
    assert row["driver_version"] == "24.1.rc2.1"
    assert calls == []


def test_memory_is_summed_over_the_engines_devices_and_waited_for(npu_smi, monkeypatch):
    calls, set_hbm = npu_smi
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "1,0")
    memory = PeakMemory("npu", num_devices=2)  # tensor parallel over both cards
    memory.start()
    set_hbm(50_000, 52_000)
    assert memory.update() == pytest.approx(50_000 + 52_000 - 3300 - 3100)
    assert memory.source == "device"
    set_hbm(3400, 3200)  # shut down: back within the tolerance
    memory.wait_released(timeout_s=2, poll_s=0.05)
    set_hbm(20_000, 3100)  # a process still holds card 0
    with pytest.raises(DeviceNotReleased, match=r"still in use on npu:1, npu:0 .*npu-smi info"):
        memory.wait_released(timeout_s=0.15, poll_s=0.05)
    assert calls == []


@pytest.mark.engine  # vLLM's platform classes, imported in this process
def test_an_engine_on_npu_spawns_its_processes_and_waits_for_release(fake_npu, tiny_config, monkeypatch):
    """The build itself is replaced (there is no NPU here); everything around it is real."""
    from lorabench.config import EngineSpec, read_config_file, resolve_config
    from lorabench.targets.engine import Engine
    from lorabench.targets.engine_env import SPAWN

    calls, set_hbm = fake_npu
    monkeypatch.delenv(SPAWN, raising=False)
    path = tiny_config()
    config = resolve_config(path, read_config_file(path), needs_lora=False, engine_args=engine_arg_names)
    seen = {}

    async def build(self):
        seen["method"] = os.environ.get(SPAWN)
        set_hbm(60_000, 3100)
        cache = SimpleNamespace(num_gpu_blocks=1000, block_size=128)
        return SimpleNamespace(vllm_config=SimpleNamespace(cache_config=cache), shutdown=lambda: set_hbm(3300, 3100))

    monkeypatch.setattr(Engine, "_build", build)
    with Engine(config, EngineSpec(enable_lora=False), "npu") as engine:
        assert engine.kv_cache_tokens == 128_000
        assert engine.memory.update() == pytest.approx(60_000 - 3300)
    assert seen["method"] == "spawn" and SPAWN not in os.environ
    assert calls == []


@pytest.mark.engine  # vLLM's platform classes, imported in this process
def test_collection_on_an_npu_host_touches_no_device(fake_npu, pytester, tiny_config):
    calls, _ = fake_npu
    for name in ("test_no_lora.py", "test_multilora.py"):
        pytester.makepyfile(**{name[:-3]: (ROOT / "bench" / name).read_text()})
    path = tiny_config(device="npu")
    result = pytester.runpytest("--bench-config", str(path), "--collect-only", "-q")
    assert result.ret == 0, result.stdout.str()
    assert "needs vLLM's npu platform" not in result.stdout.str()
    assert sum("::" in line for line in result.stdout.lines) == 7
    assert calls == []


def test_a_failed_device_read_keeps_the_peak_and_says_it_may_be_low(npu_smi, tmp_path):
    calls, set_hbm = npu_smi
    memory = PeakMemory("npu")
    memory.start()
    set_hbm(40_000, 3100)
    assert memory.update() == pytest.approx(40_000 - 3300) and memory.note == ""
    (tmp_path / "npu-smi.txt").write_text("dcmi module initialize failed\n")  # the tool answers nonsense
    assert memory.update() == pytest.approx(40_000 - 3300), "the peak seen so far stays"
    assert memory.failed_reads == 1
    assert memory.note == (
        "device memory unreadable in 1 of 2 reads since the build (last: npu-smi info printed no device rows); "
        "the peak may be low"
    )
    assert calls == []


def test_a_device_tool_failing_at_release_is_an_error_and_a_hiccup_is_not(npu_smi, tmp_path):
    calls, set_hbm = npu_smi
    memory = PeakMemory("npu")
    memory.start()
    set_hbm(40_000, 3100)
    (tmp_path / "npu-smi.txt").write_text("dcmi module initialize failed\n")
    with pytest.raises(
        DeviceNotReleased,
        match=r"cannot tell whether npu:0 got their memory back 0 s after the engine shut down: the device tool "
        r"failed \(npu-smi info printed no device rows\); run npu-smi info to see whether the driver answers",
    ):
        memory.wait_released(timeout_s=0.15, poll_s=0.05)
    # The tool fails a few times, then answers that the memory is back: that is a release.
    threading.Timer(0.1, set_hbm, (3300, 3100)).start()
    memory.wait_released(timeout_s=10, poll_s=0.05)
    assert calls == []
