"""A benchmark session whose cases were all skipped measured nothing, and says so: exit
status 2 with one line on stderr that gives the skip's reason (a node where CANN's
set_env.sh was not sourced runs vLLM on the CPU, and every NPU case skips). A session that
measured something, or that collected no benchmark case, keeps pytest's status.

On the stand-in engine, whose platform is the CPU: no vLLM."""

from __future__ import annotations

import pytest

from tests.helpers import ROOT, on_the_stand_in

FAILS = 2  # lorabench's "nothing was measured, the command or the machine was wrong" (docs/cli.md)


@pytest.fixture
def bench_dir(pytester):
    for name in ("test_multilora.py", "test_multilora_churn.py"):
        pytester.makepyfile(**{name[:-3]: (ROOT / "bench" / name).read_text()})
    on_the_stand_in(pytester)
    return pytester


def _the_line(result) -> str:
    lines = [line for line in result.stderr.lines if line.startswith("lorabench: every benchmark case skipped")]
    assert len(lines) == 1, result.stderr.lines
    return lines[0]


def test_npu_cases_on_a_host_without_an_npu_fail_the_session_in_one_line(bench_dir, tiny_config):
    path = tiny_config(device="npu", model="/models/Llama-2-7b-hf", adapters="/models/adapters.json")
    result = bench_dir.runpytest("--bench-config", str(path), "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=6)
    assert result.ret == FAILS
    line = _the_line(result)
    assert "(6 collected)" in line and "needs vLLM's npu platform; this host runs cpu" in line
    assert "set_env.sh" in line and f"lorabench doctor --config {path}" in line
    assert line.endswith(f"nothing was measured (exit status {FAILS})")
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_cases_all_skipped_for_another_reason_fail_with_that_reason(bench_dir, tiny_config):
    # The churn module runs only with a 'churn' block, which this config lacks.
    path = tiny_config()
    result = bench_dir.runpytest("--bench-config", str(path), "-k", "churn", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=2)
    assert result.ret == FAILS
    line = _the_line(result)
    assert "(2 collected)" in line and "the config has no 'churn' block" in line
    assert "set_env.sh" not in line, "no device was missing"
    result.stdout.fnmatch_lines(["benchmark cases skipped: *the config has no 'churn' block"])


def test_some_cases_measured_and_some_skipped_is_a_passing_session(bench_dir, tiny_config):
    path = tiny_config(engine={"max_loras": 1})
    result = bench_dir.runpytest("--bench-config", str(path), "-k", "identical or churn", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == 0
    assert "every benchmark case skipped" not in result.stderr.str()


def test_a_session_without_benchmark_cases_keeps_pytest_status(pytester):
    on_the_stand_in(pytester)
    pytester.makepyfile("import pytest\n\n\n@pytest.mark.npu\ndef test_npu_only(): pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    assert result.ret == 0


def test_collecting_only_runs_nothing_and_fails_nothing(bench_dir, tiny_config):
    path = tiny_config(device="npu", model="/models/Llama-2-7b-hf", adapters="/models/adapters.json")
    result = bench_dir.runpytest("--bench-config", str(path), "--collect-only", "-p", "no:cacheprovider")
    assert result.ret == 0
