"""The isolation canaries run twice against one long-lived engine or server, and judged on
answers alone (a server that does not count cached tokens)."""

from __future__ import annotations

import functools
import json
import urllib.request
from collections import Counter

import pandas as pd
import pytest

from lorabench.config import EngineSpec, read_config_file, resolve_config
from lorabench.measure import isolation
from lorabench.results.records import IsolationRecord
from lorabench.targets.standin import Costs, StandIn, write_config
from tests.helpers import ROOT, result_files

# Per session, with 4 adapters: 8 references, 3 for the reload; 10 owner, victim and control
# requests, 3 for the reload (its owner, the reloaded, the new path).
REFERENCES, SALTED_ALIKE = 11, 13


@pytest.mark.parametrize(
    "costs",
    [Costs(blocks_keyed_by_weights=True), Costs(), Costs(blocks_keyed_without_adapter=True)],
    ids=["clean", "vllm-0.32", "planted"],
)
def test_a_second_session_on_one_engine_finds_nothing_the_first_cached(tmp_path, costs, monkeypatch):
    """Unsalted, the second session's owners and victims find their own blocks of the first
    session's (16 tokens each), which reads as a breach on a clean engine."""
    path = write_config(tmp_path, adapters=4)
    config = resolve_config(path, read_config_file(path), needs_lora=True)
    spec = EngineSpec(True, 2, 8, 4, enable_prefix_caching=True)
    salts: list[str | None] = []
    with StandIn(costs, virtual_clock=True).engine(config, spec, "cpu", None) as engine:
        generate = engine.generate

        def spy(prompts, adapters, output_len, **how):
            salts.append(how.get("cache_salt"))
            return generate(prompts, adapters, output_len, **how)

        monkeypatch.setattr(engine, "generate", spy)
        prompts = isolation.canary_prompts(engine, 0)
        first, second = (isolation.judge(isolation.canaries(engine, config.adapters, prompts)) for _ in (0, 1))
    assert second == first, "the second session judged as the first"
    assert second.checked == 7 and second.control_cached_tokens == 16, "each control still found its own block"
    assert second.unjudged == [], "no owner found a block cached"
    if costs.blocks_keyed_by_weights:
        assert second.failure is None
    assert None not in salts and len(salts) == 2 * (REFERENCES + SALTED_ALIKE)
    shared = [salt for salt, n in Counter(salts).items() if n > 1]
    assert [Counter(salts)[salt] for salt in shared] == [SALTED_ALIKE] * 2, "one salt a session, each its own"


@pytest.mark.realtime
def test_a_clean_long_lived_server_passes_the_canaries_twice(pytester):
    """The issue's case: two runs against one server, whose prefix cache still holds the
    first run's blocks when the second runs."""
    from lorabench.targets.standin.server import StandInServer

    pytester.makepyfile(test_bench_isolation=(ROOT / "bench" / "test_isolation.py").read_text())
    costs = Costs(blocks_keyed_by_weights=True)
    with StandInServer(["a0", "a1", "a2", "a3"], costs, prefix_caching=True) as server:
        for run in ("run1", "run2"):
            config = write_config(pytester.path / run, engine={"enable_prefix_caching": True})
            args = ("--bench-config", str(config), "-p", "no:cacheprovider", "--bench-target", server.url)
            result = pytester.runpytest(*args)
            assert "ADAPTER ISOLATION BROKEN" not in result.stdout.str()
            result.assert_outcomes(passed=1)
            (row,) = pd.read_csv(result_files(pytester.path / run / "results")[0]).to_dict("records")
            assert (row["isolation_checked"], row["isolation_broken"], row["isolation_unjudged"]) == (7, 0, 0)
            assert row["isolation_cached_tokens"] == 16
    # The canaries' requests: a KV block of the stand-in's and TAIL tokens (the harness sends others).
    canaries = [body for body in server.received if len(body["prompt"]) == 16 + isolation.TAIL]
    salts = Counter(body.get("cache_salt") for body in canaries)
    assert None not in salts and sorted(salts.values()) == [1] * 2 * REFERENCES + [SALTED_ALIKE] * 2


def answers_alone(victim_reference="r1", victim="r1", cached=None):
    """One prompt's canary, a0 its owner and a1 its victim, on an engine that counts cached
    tokens (``cached`` 0 for the requests that find nothing, 16 for the control) or not (None)."""
    record = functools.partial(IsolationRecord, token_ids="", prompt_token_ids="")
    found = None if cached is None else 16
    return [
        record(prompt=0, adapter="a0", step="reference", digest="r0", cached_tokens=cached),
        record(prompt=0, adapter="a1", step="reference", digest=victim_reference, cached_tokens=cached),
        record(prompt=0, adapter="a0", step="owner", digest="r0", cached_tokens=cached),
        record(prompt=0, adapter="a1", step="victim", digest=victim, cached_tokens=cached),
        record(prompt=0, adapter="a0", step="control", digest="r0", cached_tokens=found),
    ]


def test_on_answers_alone_a_victim_whose_reference_is_its_owners_too_is_not_judged():
    verdict = isolation.judge(answers_alone(victim_reference="r0", victim="r0"))
    assert (verdict.checked, verdict.broken) == (0, [])
    assert verdict.unjudged == [
        "a1's victim answer to prompt 0 is not judged: its reference is a0's too, "
        "and the engine does not count cached tokens"
    ]
    assert verdict.failure.startswith("ISOLATION NOT JUDGED: a1's victim answer to prompt 0 is not judged")


@pytest.mark.parametrize(
    "case, checked, failure",
    [
        # References that differ: the answer tells, and it is the victim's own.
        (dict(), 1, None),
        # The engine counted nothing cached: the count tells, whatever the references.
        (dict(victim_reference="r0", victim="r0", cached=0), 1, None),
        # An answer that is neither reference's: judged on it, as ever.
        (dict(victim_reference="r0", victim="x1"), 1, "ADAPTER ISOLATION BROKEN: a1 answered prompt 0 otherwise"),
    ],
    ids=["references-differ", "counted", "answered-otherwise"],
)
def test_a_victim_that_can_be_judged_is_judged(case, checked, failure):
    verdict = isolation.judge(answers_alone(**case))
    assert (verdict.checked, verdict.unjudged) == (checked, [])
    assert verdict.failure == failure or verdict.failure.startswith(failure)


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


@pytest.mark.realtime
def test_a_server_without_cached_token_counts_and_two_names_of_one_adapter_counts_the_victim_unjudged(pytester):
    """a1 served from a0's folder answers as a0 does: on prompt 0, whose owner is a0, its answer
    cannot show whose KV it read. Prompt 1's victims (a3 its owner) are judged still."""
    from lorabench.targets.standin.server import StandInServer

    pytester.makepyfile(test_bench_isolation=(ROOT / "bench" / "test_isolation.py").read_text())
    config = write_config(pytester.path / "run", engine={"enable_prefix_caching": True})
    costs = Costs(blocks_keyed_by_weights=True)
    with StandInServer(["a0", "a1", "a2", "a3"], costs, prefix_caching=True, prompt_tokens_details=False) as server:
        post(server.url + "/v1/unload_lora_adapter", {"lora_name": "a1"})
        post(server.url + "/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": server.paths["a0"]})
        args = ("--bench-config", str(config), "-p", "no:cacheprovider", "--bench-target", server.url)
        result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)
    (row,) = pd.read_csv(result_files(pytester.path / "run" / "results")[0]).to_dict("records")
    assert (row["isolation_checked"], row["isolation_unjudged"], row["isolation_broken"]) == (6, 1, 0)
    assert pd.isna(row["isolation_cached_tokens"]), "the server said no request's cached tokens"
    assert "ISOLATION NOT JUDGED: a1's victim answer to prompt 0 is not judged: its reference is a0's too" in (
        result.stdout.str()
    )
