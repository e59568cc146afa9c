import builtins

from lorabench.host import device


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
