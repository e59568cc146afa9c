"""Variant builds and optional builds at their edges: in a fleet (a variant build runs in its
plain build's task, so its canary is judged; no optional builds, since a worker sees its own
rows only), where a variant fails to build (said and skipped, no finding), and where a
configuration fails to build (not counted as a build stopping saved)."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from lorabench.targets.failures import EngineBuildError
from lorabench.targets.standin import StandIn, write_config
from tests.helpers import ROOT, result_files
from tests.test_sequential import load_script

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a local fleet of two needs two cores")


def bench(pytester, *names):
    """The bench modules, under names of their own: tests/ has modules of theirs, imported already."""
    for name in names:
        pytester.makepyfile(**{f"test_bench_{name[5:]}": (ROOT / "bench" / f"{name}.py").read_text()})


def cores():
    first, second = sorted(os.sched_getaffinity(0))[:2]
    return ("--bench-fleet", "local", f"--bench-devices={first},{second}")


class Failing(StandIn):
    """Engines whose builds matching ``fails`` raise, as a build vLLM refuses would."""

    def __init__(self, fails, **kwargs):
        super().__init__(virtual_clock=True, **kwargs)
        self.fails = fails

    def engine(self, config, spec, device_type, log_path):
        engine = super().engine(config, spec, device_type, log_path)
        if self.fails(spec):

            def refuse(*_):
                raise EngineBuildError(f"planted: {spec.id} does not build here")

            engine.__enter__ = refuse
        return engine


def test_in_a_fleet_a_planted_spec_decode_bug_is_still_caught_on_its_variant_build(pytester):
    bench(pytester, "test_canary")
    pytester.makeconftest(
        "from lorabench.targets.standin import Costs, StandIn\n"
        "def pytest_lorabench_backend(config):\n"
        "    return StandIn(Costs(plant_spec_decode=True), virtual_clock=True)\n"
    )
    config = write_config(pytester.path / "run", adapters=6)
    result = pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", "-k", "spec_decode", *cores())
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*CANARY FAILS: an adapter answers otherwise with n-gram speculative decoding*"])


def test_a_fleet_collects_no_optional_builds(pytester):
    bench(pytester, "test_multilora")
    pytester.makeconftest(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
        "from bench_sequential_coverage import Noise, NoisyStandIn\n"
        "def pytest_lorabench_backend(config):\n"
        "    return NoisyStandIn(Noise('test', 0.001), 0)\n"
    )
    config = write_config(pytester.path / "run", matrix={"builds": 2, "max_builds": 5})
    result = pytester.runpytest(
        "--bench-config", str(config), "-p", "no:cacheprovider", "--bench-precision", "5%", *cores()
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(["lorabench: 2 engine builds, 2 cases*"])


def test_a_variant_that_fails_to_build_is_skipped_with_its_reason_not_a_finding(pytester):
    bench(pytester, "test_canary")
    plugin = Failing(lambda spec: spec.engine_variant == "ngram")
    config = write_config(pytester.path / "run", adapters=6)
    result = pytester.runpytest(
        "--bench-config", str(config), "-p", "no:cacheprovider", "-k", "spec_decode", "-rs", plugins=[plugin]
    )
    assert result.ret == 0
    result.assert_outcomes(passed=1, skipped=1, deselected=result.parseoutcomes()["deselected"])
    result.stdout.fnmatch_lines(
        [
            "SKIPPED * engine configuration loras2-rank8-cpu4-ngram-build0 failed to build: planted: *: the variant "
            "build's check is not judged"
        ]
    )


def test_a_variant_that_dies_while_answering_is_skipped_with_its_reason_not_a_finding(pytester):
    """As vLLM 0.30.0's CPU n-gram build, which dies at its first drafted step, LoRA or not."""
    bench(pytester, "test_canary")
    plugin = StandIn(virtual_clock=True)
    build = plugin.engine

    def engine(config, spec, device_type, log_path):
        made = build(config, spec, device_type, log_path)
        made.die_after = 3 if spec.engine_variant else None
        return made

    plugin.engine = engine
    config = write_config(pytester.path / "run", adapters=6)
    args = ("--bench-config", str(config), "-p", "no:cacheprovider", "-k", "spec_decode", "-rs")
    result = pytester.runpytest(*args, plugins=[plugin])
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "SKIPPED * engine loras2-rank8-cpu4-ngram-build0 died: *EngineDied: the stand-in engine died after 3 "
            "requests* (engine log: *ngram-build0.log): the variant build's check is not judged"
        ]
    )


def test_a_configuration_that_fails_to_build_is_not_counted_as_saved(pytester):
    bench(pytester, "test_multilora")
    script = load_script()

    class NoisyFailing(script.NoisyStandIn):
        def engine(self, config, spec, device_type, log_path):
            engine = super().engine(config, spec, device_type, log_path)
            if spec.max_loras == 4:

                def refuse(*_):
                    raise EngineBuildError("planted: out of memory")

                engine.__enter__ = refuse
            return engine

    engine = {"max_loras": [2, 4], "max_lora_rank": 8, "max_cpu_loras": 4}
    config = write_config(pytester.path / "run", engine=engine, matrix={"builds": 2, "max_builds": 5})
    plugin = NoisyFailing(script.Noise("test", 0.001), 0)
    result = pytester.runpytest(
        "--bench-config", str(config), "-p", "no:cacheprovider", "--bench-precision", "5%", plugins=[plugin]
    )
    assert result.ret == 1, "loras4's cases fail: it never builds"
    (csv,) = result_files(pytester.path / "run" / "results")
    assert sorted(pd.read_csv(csv)["build"]) == [0, 1], "loras2's rows: 2 builds"
    # loras2 stops after 2 builds: 3 of its 5 never built; loras4's 5 failed, none of them saved.
    result.stdout.fnmatch_lines(
        [
            "sequential builds: 1 case(s) precise before matrix.max_builds, 3 of their runs "
            "skipped, 3 build(s) not needed: about * s saved"
        ]
    )
