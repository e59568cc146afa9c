import builtins

import pytest

from lorabench.host import device


@pytest.mark.engine  # vLLM's own platform, imported in this process (seconds of torch)
def test_platform_here_is_the_cpu():
    device.detect_platform.cache_clear()
    platform = device.detect_platform()
    assert platform.device_type == "cpu" and platform.device_name and not platform.note


def test_a_broken_platform_plugin_means_cpu_not_a_crash(monkeypatch):
    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name == "vllm.platforms":
            raise ImportError("libascend_hal.so: cannot open shared object file")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", failing_import)
    device.detect_platform.cache_clear()
    try:
        platform = device.detect_platform()
    finally:
        device.detect_platform.cache_clear()
    assert platform.device_type == "cpu"
    assert "libascend_hal.so" in platform.note


def test_versions_are_read_without_importing():
    versions = device.stack_versions()
    assert versions["vllm_version"] and versions["torch_version"]
    assert versions["vllm_ascend_version"] == "" and versions["torch_npu_version"] == ""


def test_a_builds_commit_comes_from_its_version_file_or_its_version_and_is_never_guessed(tmp_path, monkeypatch):
    from lorabench.host.device import _commit_of

    for name, text in (
        ("built_scm", "__version__ = version = '0.33.0'\n__commit_id__ = commit_id = 'g1a2b3c4d5'\n"),
        ("built_none", "__version__ = version = '0.33.0'\n__commit_id__ = commit_id = None\n"),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('reading the commit must not import')\n")
        (tmp_path / name / "_version.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _commit_of("built_scm", "0.33.0") == "1a2b3c4d5"
    assert _commit_of("built_none", "0.33.0") == "unknown"
    assert _commit_of("built_none", "0.11.1.dev42+g9f8e7d6c") == "9f8e7d6c"
    assert _commit_of("not_installed_at_all", "") == "unknown"


def test_a_rows_provenance_names_the_cpu_and_how_many_devices(tmp_path):
    from lorabench.host.device import Platform, cpu_name
    from lorabench.results.provenance import provenance

    info = provenance(tmp_path, Platform("npu", "Ascend 910B3", device_count=8), "m")
    assert info["cpu_model"] == cpu_name() and info["device_count"] == 8
    assert info["vllm_commit"] and info["vllm_ascend_commit"] == "unknown"


def test_a_host_name_of_ones_own_replaces_a_containers(tmp_path, monkeypatch):
    import socket

    from lorabench.host.device import Platform
    from lorabench.results.provenance import HOSTNAME_ENV, provenance

    assert provenance(tmp_path, Platform("cpu", "x"), "m")["hostname"] == socket.gethostname()
    monkeypatch.setenv(HOSTNAME_ENV, "nightly-npu-1")
    assert provenance(tmp_path, Platform("cpu", "x"), "m")["hostname"] == "nightly-npu-1"
