"""The multi-LoRA scenarios on real CPU engines: residency tiers, working sets, skewed and
mixed batches, LoRA overhead, adapter ranks and the output digests."""

import pandas as pd
import pytest

from lorabench.cli import main as cli
from lorabench.results.records import replays_path_for
from tests.helpers import ROOT, generate_adapters, mooncake_like, result_files

pytestmark = pytest.mark.engine

MODULES = (
    "test_multilora.py",
    "test_multilora_residency.py",
    "test_multilora_working_set.py",
    "test_isolation.py",
    "test_multilora_online.py",
    "test_capacity.py",
)


def read_run(folder):
    (csv,) = result_files(folder)
    return csv, pd.read_csv(csv), pd.read_csv(csv.with_name(csv.stem + ".samples.csv"))


def test_every_multilora_scenario_on_a_real_engine(pytester, tiny_config, tmp_path):
    for name in MODULES:
        pytester.makepyfile(**{name[:-3]: (ROOT / "bench" / name).read_text()})
    # Prefix caching on: the isolation canaries share the one build (-pc). Prompts of a shared
    # KV block (128 tokens on the CPU) and 8 tokens of their own, so that a batch's measured
    # round finds the prefix cached by its warm-up round; 160 tokens fit them and the canaries'.
    engine = {"max_loras": 1, "max_lora_rank": 16, "max_cpu_loras": 2, "max_model_len": 160, "max_num_seqs": 8}
    # A Mooncake-like trace: two system prompts of one 128-token block, three users on two
    # adapters; 400 requests, 10 req/s, so that a probe of 4 s may go up to 100 req/s (with 40,
    # an AMD EPYC with AVX-512 passed the first probe at 10 req/s, all the trace could give).
    source = mooncake_like(tmp_path / "moon.jsonl", 400, seed=5, block=128, system_blocks=1)
    (tmp_path / "traces").mkdir()
    options = ["--hash-block-tokens", "128", "--label-column", "user", "--num-adapters", "2", "--max-model-len", "160"]
    out = str(tmp_path / "traces" / "m.jsonl")
    assert cli.main(["trace", "import", "mooncake", str(source), "--out", out, *options]) == 0
    path = tiny_config(
        engine=engine | {"enable_prefix_caching": True},
        matrix={"batch_sizes": [4], "workloads": ["skewed", "mixed"], "input_len": 136, "output_len": 4}
        | {"warmup_rounds": 1, "rounds": 1, "shared_prefix_len": 128},
        residency={"requests": 3},
        working_set={"sizes": [1, 2, 3], "cycles": 1, "min_requests": 2},
        online={"warmup_s": 0.5, "suites": [{"name": "moon", "trace": "traces/m.jsonl", "rate": [4], "duration": 5}]},
        # Two short probes of the same trace, each whole copies of one slice of it: the first at
        # a share of one request at a time's throughput, the second (it passed) at twice that.
        capacity={"slo_ttft_ms": 1500, "slo_tpot_ms": 300, "precision": 0.5, "probe_duration_s": 4, "warmup_s": 0.2}
        | {"drain_s": 2, "max_probes": 2, "max_time_s": 40, "estimate_concurrency": 1}
        | {"shapes": [{"name": "moon", "trace": "traces/m.jsonl"}]},
    )
    result = pytester.runpytest_subprocess("--bench-config", str(path), "-p", "no:cacheprovider", timeout=600)
    # The isolation case fails on vLLM 0.32: a reload in place reuses the old weights' blocks.
    result.assert_outcomes(passed=10, failed=1)
    result.stdout.fnmatch_lines(["by adapter rank: rank 8: ttft p50 * ms, decode p50 * ms (* requests); rank 16: *"])
    csv, rows, samples = read_run(tmp_path / "results")

    batch = rows[rows.scenario == "multilora"].set_index("workload")
    assert (batch["lora_overhead"] > 0).all() and (batch["baseline_e2e_ms"] > 0).all()
    # vLLM caches by adapter: the measured round (its own tokens new) finds the shared prefix the
    # warm-up round cached for the same adapter; the working set's waves, which repeat their
    # prompts, are salted apart and find nothing.
    assert (batch["prefix_hit_rate"] == 128 / 136).all(), "each request found the shared prefix's block cached"
    assert (batch["shared_prefix_len"] == 128).all()
    assert (rows[rows.scenario == "working_set"]["prefix_hit_rate"] == 0).all()
    assert (batch["engine_id"] == "loras1-rank16-cpu2-pc-build0").all()
    assert batch.at["skewed", "num_adapters"] == 3, "batch 4 at alpha 1.5: groups of 2, 1, 1"
    # Three adapters one at a time (max_loras 1) through a cache of two: vLLM's worker loaded
    # each from disk in the measured round; the mixed case's two fit, and none loaded.
    assert batch["timed_adapter_loads"].to_dict() == {"skewed": 3, "mixed": 0}
    assert batch.at["mixed", "base_share"] == 0.5 and batch.at["mixed", "base_ttft_ms"] > 0
    assert pd.isna(batch.at["skewed", "base_ttft_ms"])

    tiers = rows[rows.scenario == "residency"].set_index("tier")
    assert sorted(tiers.index) == ["cpu", "disk", "slot"]
    assert (tiers["rounds"] == 3).all() and (tiers["ttft_ms_p50"] > 0).all()
    assert tiers["disk_load_ms"].notna().tolist() == [t == "disk" for t in tiers.index]
    assert tiers["tier_extra_ttft_ms"].notna().all()
    tier_samples = samples[samples.scenario == "residency"]
    assert tier_samples.groupby("tier").size().to_dict() == {"cpu": 3, "disk": 3, "slot": 3}, "repeats are no samples"

    # vLLM 0.32 keys KV blocks by adapter, and caches with LoRA: each owner's second request
    # found its prompt's block cached (128 tokens), no other adapter found any or answered otherwise.
    # But its key is the adapter's name and path: new weights loaded in place over an
    # adapter's found its old weights' block, and answered otherwise (docs/scenarios.md#isolation).
    (canary,) = rows[rows.scenario == "isolation"].to_dict("records")
    assert canary["engine_id"] == "loras1-rank16-cpu2-pc-build0" and canary["enable_prefix_caching"]
    assert (canary["isolation_checked"], canary["isolation_broken"], canary["isolation_control_changed"]) == (7, 0, 0)
    assert canary["isolation_cached_tokens"] == 128 and canary["isolation_reload_broken"] == 1
    assert canary["isolation_unjudged"] == 0, "the reload changed the uncached answer: it took"
    result.stdout.fnmatch_lines(
        ["*ADAPTER ISOLATION BROKEN: lorabench-reloaded*in place*found 128 tokens of prompt 2*"]
    )

    # The trace's shared system prompts: what vLLM found cached, per adapter, is what the hash ids predict.
    (online,) = rows[rows.scenario == "online"].to_dict("records")
    assert online["timed_adapter_loads"] == 0, "the trace's two adapters fit the cache of two, put there first"
    assert online["prefix_hit_rate_predicted"] > 0.5
    assert abs(online["prefix_hit_rate"] - online["prefix_hit_rate_predicted"]) < 0.03
    usage = pd.read_csv(replays_path_for(csv, "adapters"))
    assert len(usage) == 2 and (abs(usage["prefix_hit_rate"] - usage["prefix_hit_rate_predicted"]) < 0.03).all()
    # vLLM's own PrefixCacheStats, step by step in the timeline, found cached hits too.
    steps = pd.read_csv(replays_path_for(csv, "timeline"))
    steps = steps[steps["scenario"] == "online"]
    assert steps["prefix_queries"].sum() > steps["prefix_hits"].sum() > 0
    # Each capacity probe too, however many copies of its slice it replayed: a copy finds
    # cached what its own requests share, nothing of the copy before it.
    probes = pd.read_csv(replays_path_for(csv, "probes"))
    assert len(probes) == 2 and probes["rate"].iloc[1] >= 2 * probes["rate"].iloc[0], probes["rate"]
    assert (probes["prefix_hit_rate_predicted"] > 0.5).all()
    assert (abs(probes["prefix_hit_rate"] - probes["prefix_hit_rate_predicted"]) < 0.03).all(), probes

    sweep = rows[rows.scenario == "working_set"].set_index("working_set")
    assert sweep["load_share"].to_dict() == {1: 0.0, 2: 0.0, 3: 1.0}, "past max_cpu_loras=2 every request loads"
    # Counted in vLLM's worker (lorabench's worker extension): one load a wave of one past the cache.
    assert sweep["timed_adapter_loads"].to_dict() == {1: 0, 2: 0, 3: 3}
    assert (sweep["output_tokens_per_s"] > 0).all()

    assert rows["digest_mismatches"].eq(0).all(), "the same adapter answers the same everywhere"
    digests = pd.read_csv(csv.with_name(csv.stem + ".digests.csv"), dtype=str)
    assert sorted(digests["adapter"].unique()) == sorted(f"dummy-lora-rank-{r}-{i}" for i in (0, 1) for r in (8, 16))
    assert (digests["digest"] != digests["base_digest"]).all()
    assert set(samples["adapter_rank"].dropna()) == {8, 16}
    mixed = samples[(samples.scenario == "multilora") & (samples.workload == "mixed")]
    assert mixed["adapter_rank"].isna().sum() == 2, "the mixed batch's base-model requests have no rank"


def test_an_adapter_whose_weights_changed_between_runs_is_flagged(pytester, tiny_config, tmp_path):
    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())

    def run(seed, *args):
        path = tiny_config(
            adapters=str(generate_adapters(tmp_path / "loras", 2, "8", seed)),
            engine={"max_loras": 1, "max_lora_rank": 8, "max_cpu_loras": 2, "max_model_len": 128},
            matrix={"batch_sizes": [1], "workloads": ["identical"], "input_len": 8, "output_len": 2, "rounds": 1},
        )
        out = tmp_path / f"run{seed}.csv"
        return out, pytester.runpytest_subprocess(
            "--bench-config", str(path), "-p", "no:cacheprovider", "--bench-output", str(out), *args, timeout=300
        )

    first, result = run(0)
    result.assert_outcomes(passed=1)
    _, result = run(1, "--bench-compare", str(first), "--bench-compare-fail")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "OUTPUT CHANGED: adapter dummy-lora-rank-8-0 (builtin:tiny-llama) answers the greedy probe differently: *",
            "2 changed adapter outputs: the session fails (--bench-compare-fail)",
        ]
    )
