"""Device facts from the management tools' output, parsed from recorded text."""

import pytest

from lorabench.host import smi

# npu-smi 24.1: two 910B3 cards; HBM "used / total" sometimes without a space.
NPU_SMI_24 = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.rc2.1               Version: 24.1.rc2.1                                           |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 121.6       40                0    / 0             |
| 0                         | 0000:C1:00.0  | 10          0    / 0          57895/ 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 116.4       39                0    / 0             |
| 0                         | 0000:C2:00.0  | 10          0    / 0          3314 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       0                 | 1712733       | python3                  | 54528                   |
+===========================+===============+====================================================+
"""

# npu-smi 26.0: the wider layout, one 910B4.
NPU_SMI_26 = """\
+------------------------------------------------------------------------------------------------------------------+
| npu-smi 26.0.rc1                            Version: 26.0.rc1                                                    |
+---------------------------+---------------+----------------------------------------------------------------------+
| NPU   Name                | Health        | Power(W)             Temp(C)                 Hugepages-Usage(page)   |
| Chip                      | Bus-Id        | AICore(%)            Memory-Usage(MB)        HBM-Usage(MB)           |
+===========================+===============+======================================================================+
| 0     910B4               | OK            | 82.6                 32                      0    / 0                |
| 0                         | 0000:C1:00.0  | 0                    0    / 0                2871 / 32768            |
+===========================+===============+======================================================================+
"""

NVIDIA_SMI = """\
0, GPU-5b1c0f2e-aaaa-bbbb-cccc-000000000000, NVIDIA H100 80GB HBM3, 1021, 81559, 550.54.15
1, GPU-77d0e0a1-aaaa-bbbb-cccc-111111111111, NVIDIA H100 80GB HBM3, 4, 81559, 550.54.15
"""


def test_npu_smi_devices_and_hbm_usage():
    devices = smi.parse_npu_smi_info(NPU_SMI_24)
    assert [(d.index, d.name, d.used_mib, d.total_mib) for d in devices] == [
        (0, "910B3", 57895, 65536),
        (1, "910B3", 3314, 65536),
    ]
    (only,) = smi.parse_npu_smi_info(NPU_SMI_26)
    assert (only.index, only.name, only.used_mib, only.total_mib) == (0, "910B4", 2871, 32768)


def test_npu_smi_driver_version_from_its_header():
    assert smi.parse_npu_smi_version(NPU_SMI_24) == "24.1.rc2.1"
    assert smi.parse_npu_smi_version(NPU_SMI_26) == "26.0.rc1"
    assert smi.parse_npu_smi_version("no header") == ""


def test_npu_smi_without_devices_is_an_error():
    with pytest.raises(smi.DeviceToolError, match="no device rows"):
        smi.parse_npu_smi_info("Error: the driver is not loaded\n")


def test_nvidia_smi_query_and_driver():
    devices = smi.parse_nvidia_smi_csv(NVIDIA_SMI)
    assert [(d.index, d.name, d.used_mib, d.total_mib) for d in devices] == [
        (0, "NVIDIA H100 80GB HBM3", 1021, 81559),
        (1, "NVIDIA H100 80GB HBM3", 4, 81559),
    ]
    assert devices[1].uuid.startswith("GPU-77d0")
    assert smi.parse_nvidia_driver(NVIDIA_SMI) == "550.54.15"
    with pytest.raises(smi.DeviceToolError):
        smi.parse_nvidia_smi_csv("0, GPU-x, name, [N/A], 81559, 550\n")


@pytest.mark.parametrize(
    ("device_type", "value", "expected"),
    [
        ("npu", None, [0, 1]),
        ("npu", "1", [1]),
        ("npu", "1,0", [1, 0]),
        ("cuda", "GPU-77d0", [1]),  # a UUID prefix, as CUDA accepts
        ("cuda", "0,7", [0]),  # no such device: left out
    ],
)
def test_visible_devices_follow_the_runtime_variable(device_type, value, expected):
    devices = smi.parse_npu_smi_info(NPU_SMI_24) if device_type == "npu" else smi.parse_nvidia_smi_csv(NVIDIA_SMI)
    env = {} if value is None else {smi.VISIBLE_VARIABLES[device_type]: value}
    assert [d.index for d in smi.visible(devices, device_type, env)] == expected


def test_ascend_versions_from_the_installers_files(tmp_path, monkeypatch):
    home = tmp_path / "ascend-toolkit" / "latest"
    (home / "aarch64-linux").mkdir(parents=True)
    (home / "aarch64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.0.RC3\n"
    )
    (tmp_path / "driver").mkdir()
    (tmp_path / "driver" / "version.info").write_text("Version=24.1.rc2\nascendhal_version=7.35.19\n")
    (tmp_path / "firmware").mkdir()
    (tmp_path / "firmware" / "version.info").write_text("Version=7.5.0.1.129\n")
    monkeypatch.setattr(smi, "ASCEND_HOME", home)
    monkeypatch.setattr(smi, "ASCEND_ROOT", tmp_path)
    assert smi.ascend_versions() == {
        "toolkit_version": "8.0.RC3",
        "driver_version": "24.1.rc2",
        "firmware_version": "7.5.0.1.129",
    }


def test_a_missing_tool_is_a_device_tool_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(smi.DeviceToolError, match="npu-smi not found"):
        smi.read_devices("npu")
