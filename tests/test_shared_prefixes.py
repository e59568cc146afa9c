"""Shared prefixes from hash ids: imported with a trace, read back, turned into tokens at replay,
the hit rate they predict, and a replay on the stand-in whose prefix cache finds what was predicted."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from lorabench.cli import main as cli
from lorabench.config import ConfigError, read_config_file
from lorabench.load.traces import data
from lorabench.load.traces.prefixes import HashIds, copies, predict, predict_requests, prompt
from lorabench.load.traces.synthetic import TraceRequest
from lorabench.results.records import replays_path_for
from tests.helpers import ROOT, mooncake_like, result_files
from tests.test_trace_import import TRACES, imported


def test_ids_ride_with_their_rows_through_sort_window_and_clip(tmp_path):
    rows = [
        {"timestamp": 3000, "input_length": 40, "output_length": 2, "hash_ids": [7, 8]},
        {"timestamp": 1000, "input_length": 70, "output_length": 2, "hash_ids": [1, 2, 3]},
        {"timestamp": 2000, "input_length": 10, "output_length": 2, "hash_ids": []},
        {"timestamp": 4000, "input_length": 90, "output_length": 2, "hash_ids": [1, 2, 4]},
    ]
    source = tmp_path / "m.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = imported(tmp_path, "mooncake", source, "--hash-block-tokens", 32, "--start", 1)
    assert trace.header["hash_block_tokens"] == 32 and trace.block_tokens == 32
    # Sorted by arrival, the first left out by the window; each row keeps its own ids.
    assert trace.input_len.tolist() == [10, 40, 90]
    assert trace.hash_ids.rows() == [(), (7, 8), (1, 2, 4)]
    clipped = imported(tmp_path, "mooncake", source, "--hash-block-tokens", 32, "--max-model-len", 50, name="c.jsonl")
    assert clipped.input_len.tolist() == [48, 10, 40, 48]
    assert clipped.hash_ids.rows() == [(1, 2), (), (7, 8), (1, 2)], "ids past the clipped prompt are cut"
    plain = imported(tmp_path, "mooncake", source, "--no-hash-ids", name="p.jsonl")
    assert plain.hash_ids is None and "hash_block_tokens" not in plain.header
    assert all(r.hash_ids == () for r in plain.requests())


def test_a_csv_prefix_column_reads_ids_in_any_common_spelling(tmp_path):
    source = tmp_path / "c.csv"
    source.write_text('t,i,o,ids\n0,40,2,"[1, 2]"\n1,40,2,1 2\n2,40,2,1;3\n3,40,2,\n')
    columns = ("--time-column", "t", "--input-column", "i", "--output-column", "o", "--prefix-column", "ids")
    trace = imported(tmp_path, "csv", source, *columns, "--hash-block-tokens", 16)
    assert trace.hash_ids.rows() == [(1, 2), (1, 2), (1, 3), ()]
    again = data.load(tmp_path / "out.jsonl")
    assert again.hash_ids.rows() == trace.hash_ids.rows() and again.requests()[2].hash_ids == (1, 3)


def test_a_file_whose_header_promises_ids_and_a_line_without_them_is_refused(tmp_path):
    trace = imported(tmp_path, "mooncake", TRACES / "mooncake.jsonl")
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    lines[2] = json.dumps({k: v for k, v in json.loads(lines[2]).items() if k != "hash_ids"})
    (tmp_path / "cut.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"cut.jsonl: not a readable lorabench trace \(line 3: KeyError: 'hash_ids'\)"):
        data.load(tmp_path / "cut.jsonl")
    assert len(trace.hash_ids) == len(trace)


def test_prompts_share_exactly_the_spans_of_their_common_leading_ids():
    own = [list(range(k * 100, k * 100 + 40)) for k in range(3)]
    a, b, c = (prompt(ids, 16, mine, 1000, 0) for ids, mine in zip([(1, 2), (1, 3), (9,)], own))
    assert len(a) == len(b) == len(c) == 40
    assert a[:16] == b[:16] and a[16:32] != b[16:32] and a[:16] != c[:16]
    assert a[32:] == own[0][32:] and c[16:] == own[2][16:], "past the ids' reach, the request's own tokens"
    assert prompt((1, 2), 16, own[0], 1000, 1)[:16] != a[:16], "another seed, other spans"


@pytest.mark.parametrize(
    ("adapters", "expected"),
    [
        # Request 0 caches [1: 16, 2: 16, 3: 0 of its 8 tokens, no full block]. Request 1 finds 1 and 2
        # (32, its last-token cap too). Request 2 (20 tokens) finds 16 of block 1 and its 4 tokens of
        # block 2, cut to whole blocks: 16. Request 3 shares nothing; request 4 finds 1 and 2, not 3.
        (None, [0, 32, 16, 0, 32]),
        # By adapter: request 1, on adapter 1, finds none of adapter 0's blocks.
        ([0, 1, 0, 0, 0], [0, 0, 16, 0, 32]),
    ],
)
def test_predicted_hits_follow_vllms_blocks_and_keys(adapters, expected):
    ids = HashIds.from_lists([[1, 2, 3], [1, 2, 4], [1, 2], [5], [1, 2, 3]])
    lengths = np.array([40, 40, 20, 16, 48])
    keyed = None if adapters is None else np.array(adapters)
    assert predict(ids, lengths, keyed, 16, 16).tolist() == expected
    # Engine blocks of 32: request 1's hit is a whole block of 32 at most... and its cap (39 // 32) * 32.
    assert predict(ids, lengths, keyed, 16, 32).tolist()[1] == (32 if adapters is None else 0)


def test_a_prompt_found_whole_still_computes_its_last_token():
    """The same two blocks twice: the second finds 32 tokens, but vLLM leaves the last block."""
    twice = HashIds.from_lists([[1, 2], [1, 2]])
    assert predict(twice, np.array([32, 32]), None, 16, 16).tolist() == [0, 16]
    assert predict(twice, np.array([32, 33]), None, 16, 16).tolist() == [0, 32]


def test_trace_stats_prints_the_predicted_hit_rate_per_adapter(tmp_path, capsys):
    imported(tmp_path, "mooncake", TRACES / "mooncake.jsonl", "--num-adapters", 2, "--popularity", "round-robin")
    assert cli.main(["trace", "stats", str(tmp_path / "out.jsonl"), "--block-size", "128"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("prefix hit rate"))
    assert "512-token ids; an infinite cache of 128-token blocks" in line
    split, shared = map(float, re.findall(r"([0-9.]+)% (?:of prompt tokens|if adapters shared)", line))
    # Requests 0 and 11 share 12 blocks (10.3 %), but round-robin puts them on different adapters.
    assert (split, shared) == (1.5, 10.3)
    assert "  per adapter: adapter-0 " in out


def test_a_replay_finds_cached_what_the_ids_predict_per_adapter_and_caching_cuts_ttft(pytester):
    """Ground truth on the stand-in: a prefix hit is not prefilled, at 2 ms a token; the hit
    rate measured per adapter is within 3 points of the prediction; caching off finds none."""
    from lorabench.targets.standin import Costs, StandIn, write_config

    folder = pytester.path
    source = mooncake_like(folder / "moon.jsonl", 60, seed=3)
    (folder / "traces").mkdir()
    options = ["--hash-block-tokens", "32", "--label-column", "user", "--num-adapters", "3"]
    assert cli.main(["trace", "import", "mooncake", str(source), "--out", "traces/moon.jsonl", *options]) == 0
    suite = {"name": "moon", "trace": "traces/moon.jsonl", "rate": [4], "duration": 12}
    config = write_config(
        folder,
        adapters=3,
        engine={"enable_prefix_caching": [False, True], "max_loras": 3},
        online={"warmup_s": 0.5, "suites": [suite]},
    )
    pytester.makepyfile(test_multilora_online=(ROOT / "bench" / "test_multilora_online.py").read_text())
    result = pytester.runpytest(
        "--bench-config",
        str(config),
        "-k",
        "online",
        "-p",
        "no:cacheprovider",
        plugins=[StandIn(Costs(prefill_ms_per_token=2.0), virtual_clock=True)],
    )
    result.assert_outcomes(passed=2)
    (csv,) = result_files(folder / "results")
    rows = pd.read_csv(csv).set_index("enable_prefix_caching")
    on, off = rows.loc[True], rows.loc[False]
    assert on["prefix_hit_rate_predicted"] == off["prefix_hit_rate_predicted"] > 0.4
    assert abs(on["prefix_hit_rate"] - on["prefix_hit_rate_predicted"]) < 0.03
    assert off["prefix_hit_rate"] == 0
    usage = pd.read_csv(replays_path_for(csv, "adapters"))
    cached = usage[usage["enable_prefix_caching"]]
    assert len(cached) == 3 and (usage[~usage["enable_prefix_caching"]]["prefix_hit_rate"] == 0).all()
    assert (abs(cached["prefix_hit_rate"] - cached["prefix_hit_rate_predicted"]) < 0.03).all()
    # vLLM's own counters, step by step in the timeline, say the same after the warm-up.
    steps = pd.read_csv(replays_path_for(csv, "timeline"))
    steps = steps[steps["enable_prefix_caching"] & (steps["t_s"] >= 0.5)]
    assert abs(steps["prefix_hits"].sum() / steps["prefix_queries"].sum() - on["prefix_hit_rate"]) < 0.03
    # Each hit skips 2 ms a token of prefill: the median TTFT falls by about a hit's worth.
    saved = off["ttft_ms_p50"] - on["ttft_ms_p50"]
    assert 0.5 * 64 * 2.0 < saved < 1.5 * 64 * 2.0, (off["ttft_ms_p50"], on["ttft_ms_p50"])
    # The report pairs the case off and on, and draws each adapter's rates.
    from lorabench.analysis.report import prefix_figures
    from lorabench.analysis.report.runs import load_runs

    runs = load_runs([csv])
    (pair,) = prefix_figures._paired(runs[0].rows).to_dict("records")
    assert pair == {"off": off["ttft_ms_p50"], "on": on["ttft_ms_p50"]}
    assert prefix_figures.hit_rates(runs) is not None and prefix_figures.ttft_gain(runs) is not None


def test_shared_prefixes_asked_of_a_trace_without_ids_is_bad_input(tiny_config, tmp_path):
    from tests.test_trace_suite import import_to, online, problems

    import_to(tmp_path, "mooncake", TRACES / "mooncake.jsonl", "--no-hash-ids", "--max-model-len", 128)
    suite = {"name": "m", "trace": "traces/mooncake.jsonl", "rate": [1], "duration": 5, "shared_prefixes": True}
    said = problems(tiny_config(online=online(suite)))
    assert (
        "field 'online.suites[0].shared_prefixes' has bad value true: mooncake.jsonl was imported without hash" in said
    )
    assert "import it again keeping them" in said
    synthetic = {"name": "s", "num_adapters": [2], "rate": [1], "shared_prefixes": True}
    with pytest.raises(ConfigError, match="a synthetic trace has no hash ids to share prefixes by"):
        read_config_file(tiny_config(online=online(synthetic)))


def test_shared_prefixes_false_replays_the_trace_without_its_ids(tmp_path):
    from lorabench.config.online_cases import ImportedCase

    import_to_path = tmp_path / "t.jsonl"
    assert cli.main(["trace", "import", "mooncake", str(TRACES / "mooncake.jsonl"), "--out", str(import_to_path)]) == 0
    kept = ImportedCase("m", import_to_path, 1.0, 5.0).requests(["a0"])
    ignored = ImportedCase("m", import_to_path, 1.0, 5.0, shared_prefixes=False).requests(["a0"])
    assert kept[0].hash_ids[:2] == (0, 1) and kept[0].block_tokens == 512
    assert all(r.hash_ids == () for r in ignored) and [r.input_len for r in ignored] == [r.input_len for r in kept]


@pytest.mark.realtime
@pytest.mark.parametrize("details", [True, False])
def test_over_http_the_usage_says_what_was_cached_and_each_replay_is_salted_apart(pytester, details):
    """`vllm serve --enable-prompt-tokens-details` reports each request's cached tokens in its
    usage; without it, the server's prefix-cache counters give the replay's rate (and no
    adapter's). The replay salts its requests so no earlier replay warms its cache."""
    from lorabench.targets.standin import Costs, write_config
    from lorabench.targets.standin.server import StandInServer

    folder = pytester.path / "run"
    (folder / "traces").mkdir(parents=True)
    source = mooncake_like(pytester.path / "moon.jsonl", 30, seed=4)
    options = ["--hash-block-tokens", "32", "--label-column", "user", "--num-adapters", "3"]
    assert (
        cli.main(["trace", "import", "mooncake", str(source), "--out", str(folder / "traces/moon.jsonl"), *options])
        == 0
    )
    suite = {"name": "moon", "trace": "traces/moon.jsonl", "rate": [20, 30], "duration": 1.0}
    config = write_config(
        folder,
        adapters=3,
        engine={"enable_prefix_caching": True, "max_loras": 3},
        online={"warmup_s": 0.1, "suites": [suite]},
    )
    pytester.makepyfile(test_multilora_online=(ROOT / "bench" / "test_multilora_online.py").read_text())
    server = StandInServer(
        ["a0", "a1", "a2"],
        Costs(prefill_ms_per_token=0.2),
        max_loras=3,
        prefix_caching=True,
        prompt_tokens_details=details,
    )
    with server:
        args = ("--bench-config", str(config), "--bench-target", server.url, "-k", "online", "-p", "no:cacheprovider")
        pytester.runpytest(*args).assert_outcomes(passed=2)
    rows = pd.read_csv(result_files(folder / "results")[0])
    assert (rows["prefix_hit_rate_predicted"] > 0.4).all()
    # Without per-request counts the rate is the counters' over the scrapes (4 a second) from the
    # first after the warm-up to the last, at the replay's end: the requests between the
    # warm-up's end (0.1 s) and that first scrape (0.25 s, later on a busy host), whose prefixes
    # are mostly new, are left out of a 1 s replay (0.656 against 0.591 predicted at 20 req/s,
    # on a quiet host). The salts themselves are checked below.
    tolerance = 0.03 if details else 0.1
    assert (abs(rows["prefix_hit_rate"] - rows["prefix_hit_rate_predicted"]) < tolerance).all(), rows["prefix_hit_rate"]
    usage = pd.read_csv(replays_path_for(result_files(folder / "results")[0], "adapters"))
    assert usage["prefix_hit_rate"].notna().all() == details, "per adapter only where each request said"
    salts = [b["cache_salt"] for b in server.received if "cache_salt" in b]
    assert len(salts) >= rows["num_requests"].sum() and len(set(salts)) == 2, "one salt per replay, each its own"


@pytest.mark.parametrize(
    ("matrix", "expected"),
    [
        ({"shared_prefix_len": 8}, "'matrix.shared_prefix_len' has bad value 8: a shared prefix is of"),
        ({"input_len": 32, "shared_prefix_len": 32}, "needs one of its own after the prefix: give 31 or less"),
        ({"input_len": 32, "shared_prefix_share": 0}, "'matrix.shared_prefix_share' has bad value 0"),
    ],
)
def test_a_shared_prefix_that_cannot_fit_its_prompts_is_bad_input(tiny_config, matrix, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        read_config_file(tiny_config(matrix=matrix))


def test_a_shared_prefix_longer_than_the_model_is_bad_input(tiny_config):
    from tests.test_trace_suite import problems

    said = problems(tiny_config(matrix={"input_len": 300, "shared_prefix_len": 200}))
    assert "field 'matrix.shared_prefix_len' has bad value 200: longer than engine.max_model_len = 128" in said


def _batch_rows(pytester, matrix: dict, caching: list[bool]) -> pd.DataFrame:
    from lorabench.targets.standin import Costs, StandIn, write_config

    pytester.makepyfile(
        test_multilora=(ROOT / "bench" / "test_multilora.py").read_text(),
        test_no_lora=(ROOT / "bench" / "test_no_lora.py").read_text(),
    )
    matrix = {"batch_sizes": [4], "input_len": 64, "warmup_rounds": 1, "rounds": 2, **matrix}
    engine = {"enable_prefix_caching": caching, "max_loras": 4}
    config = write_config(pytester.path, adapters=4, engine=engine, matrix=matrix)
    plugin = StandIn(Costs(prefill_ms_per_token=1.0), virtual_clock=True)
    result = pytester.runpytest("--bench-config", str(config), "-p", "no:cacheprovider", plugins=[plugin])
    result.assert_outcomes(passed=3 * len(caching))  # multilora, no_lora on the LoRA and the plain engine
    return pd.read_csv(result_files(pytester.path / "results")[0])


def test_a_batch_finds_its_shared_prefix_cached_and_nothing_of_earlier_rounds(pytester):
    """Distinct adapters, 48 of 64 tokens shared: after the warm-up round each request finds its
    own adapter's 48 cached, so the hit rate is 0.75; the four prefill in one step, each 4 x 48 ms
    shorter at 1 ms a token. The own tokens are new each round, so without the prefix nothing is found."""
    rows = _batch_rows(pytester, {"shared_prefix_len": 48}, [False, True])
    lora = rows[rows["scenario"] == "multilora"].set_index("enable_prefix_caching")
    assert lora.loc[True, "prefix_hit_rate"] == 0.75 and lora.loc[False, "prefix_hit_rate"] == 0
    assert lora.loc[True, "prefix_cache_salted"] and pd.isna(lora.loc[False, "prefix_cache_salted"])
    assert (lora["shared_prefix_len"] == 48).all() and (lora["shared_prefix_share"] == 1).all()
    saved = lora.loc[False, "prefill_ms"] - lora.loc[True, "prefill_ms"]
    assert 4 * 48 * 0.95 < saved < 4 * 48 * 1.05, saved
    base = rows[(rows["scenario"] == "no_lora") & rows["enable_prefix_caching"]]
    assert (base["prefix_hit_rate"] == 0.75).all(), "no adapter: the same prefix for all"


@pytest.mark.parametrize("input_len", [64, None])
def test_caching_on_without_a_shared_prefix_finds_nothing_the_workload_did_not_share(pytester, input_len):
    """Synthetic prompts bring new own tokens each round; text prompts, which repeat, a salt each."""
    rows = _batch_rows(pytester, {"input_len": input_len}, [True])
    assert (rows["prefix_hit_rate"] == 0).all() and rows["shared_prefix_len"].isna().all()
    assert rows["prefix_cache_salted"].all()


def test_ids_that_reach_past_their_prompts_are_cut_and_said(tmp_path, capsys):
    """Ids for 128-token blocks read as Mooncake's 512: the import says so, and stats too."""
    rows = [{"timestamp": k, "input_length": 300, "output_length": 2, "hash_ids": [1, 2, 3]} for k in range(4)]
    source = tmp_path / "m.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = imported(tmp_path, "mooncake", source)
    assert trace.hash_ids.rows() == [(1,)] * 4
    err = capsys.readouterr().err
    assert "warning: 4 rows list more hash ids than their prompt has blocks of 512 tokens" in err
    assert "give --hash-block-tokens" in err
    imported(tmp_path, "mooncake", source, "--hash-block-tokens", 128, name="right.jsonl")
    assert "warning" not in capsys.readouterr().err


def test_the_ttft_figure_pairs_each_case_with_itself_and_nothing_else():
    """Two tiers of one configuration, each off and on; a suite measured off only is no pair."""
    from lorabench.analysis.report.prefix_figures import _paired

    base = {"scenario": "residency", "enable_lora": True, "max_loras": 2, "max_lora_rank": 8, "max_cpu_loras": 4}
    rows = pd.DataFrame(
        [
            {**base, "tier": "slot", "enable_prefix_caching": False, "ttft_ms_p50": 50.0},
            {**base, "tier": "slot", "enable_prefix_caching": True, "ttft_ms_p50": 40.0},
            {**base, "tier": "disk", "enable_prefix_caching": False, "ttft_ms_p50": 500.0},
            {**base, "tier": "disk", "enable_prefix_caching": True, "ttft_ms_p50": 400.0},
            {**base, "tier": "cpu", "enable_prefix_caching": False, "ttft_ms_p50": 90.0},
        ]
    )
    pairs = _paired(rows)
    assert sorted(pairs.to_dict("records"), key=lambda r: r["off"]) == [
        {"off": 50.0, "on": 40.0},
        {"off": 500.0, "on": 400.0},
    ]
    assert all("-pc" not in label for label in pairs.index) and any("slot" in label for label in pairs.index)


def test_ids_past_64_bits_and_a_header_without_a_block_size_are_bad_input(tmp_path, capsys):
    source = tmp_path / "big.jsonl"
    source.write_text(json.dumps({"timestamp": 1, "input_length": 3, "output_length": 4, "hash_ids": [2**64]}) + "\n")
    assert cli.main(["trace", "import", "mooncake", str(source), "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "row 1, column 'hash_ids': an id of '[18446744073709551616]' is outside" in err
    imported(tmp_path, "mooncake", TRACES / "mooncake.jsonl")
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    for bad in (0, -1, "x"):
        (tmp_path / "bad.jsonl").write_text(
            "\n".join([json.dumps({**json.loads(lines[0]), "hash_block_tokens": bad}), *lines[1:]]) + "\n"
        )
        assert cli.main(["trace", "stats", str(tmp_path / "bad.jsonl")]) == 2
        assert f"hash_block_tokens {bad!r} is not a number of tokens above 0" in capsys.readouterr().err


def test_the_rates_are_over_the_finished_requests_after_the_warm_up_only():
    from lorabench.measure.replay import ReplayedRequest
    from lorabench.measure.replay_summary import summarize_online

    def request(at, cached, predicted, finished=True):
        r = ReplayedRequest(0, "a0", 100, 2, at, sent_s=at, token_times=[at + 0.01, at + 0.02], finished=finished)
        r.cached_tokens, r.predicted_cached = cached, predicted
        return r

    records = [request(0.1, 0, 0), request(1.5, 80, 80), request(2.0, 40, 60), request(2.5, 0, 0, finished=False)]
    metrics, _ = summarize_online(records, slo_ttft_ms=1000, slo_tpot_ms=100, warmup_s=1.0)
    assert metrics["prefix_hit_rate"] == 120 / 200 and metrics["prefix_hit_rate_predicted"] == 140 / 200


@pytest.mark.parametrize("until_t", [False, True])
def test_the_engines_counters_count_from_the_warm_up_on(until_t):
    """In process a record counts from its t_s; a scrape's counts run up to its t_s, so the
    first scrape after the warm-up still counts warm-up admissions and is left out."""
    from lorabench.results.records import TimelineRecord
    from lorabench.targets.timeline import prefix_hit_rate

    def record(t, queries, hits):
        zeros = dict.fromkeys(("running", "waiting", "adapters_running", "adapters_waiting", "preemptions"), 0)
        counts = {"prompt_tokens": queries, "generation_tokens": 0, "prefix_queries": queries, "prefix_hits": hits}
        return TimelineRecord(t_s=t, steps=1, kv_usage=0.0, **zeros, **counts)

    rows = [record(0.5, 100, 0), record(1.25, 100, 10), record(1.5, 100, 50)]
    assert prefix_hit_rate(rows, 1.0, until_t) == (50 / 100 if until_t else 60 / 200)
    assert prefix_hit_rate([record(0.5, 0, 0)], 0.0, until_t) is None, "no query counted: no rate"


def test_a_run_with_caching_off_and_one_with_it_on_are_paired_together():
    from types import SimpleNamespace

    from lorabench.analysis.report import prefix_figures

    case = {"scenario": "online", "enable_lora": True, "max_loras": 2, "max_lora_rank": 8, "trace_suite": "m"}
    off = pd.DataFrame([{**case, "enable_prefix_caching": False, "ttft_ms_p50": 240.0}])
    on = pd.DataFrame([{**case, "enable_prefix_caching": True, "prefix_cache_salted": True, "ttft_ms_p50": 45.0}])
    runs = [SimpleNamespace(label="aaaa", rows=off), SimpleNamespace(label="bbbb", rows=on)]
    assert prefix_figures.ttft_gain(runs) is not None
    assert prefix_figures.ttft_gain(runs[:1]) is None, "one side alone pairs nothing"


def test_copies_of_a_slice_share_blocks_within_each_copy_not_across():
    """A capacity probe replays copies of one slice back to back: each copy's own sharing,
    as the trace has it, and nothing found cached from the copy before."""
    block = 16
    # Two conversations of two turns each: a turn extends its first turn's blocks.
    one = [
        TraceRequest(0.0, "a0", 64, 4, hash_ids=(1, 2, 3, 4), block_tokens=block),
        TraceRequest(0.5, "a0", 96, 4, hash_ids=(1, 2, 3, 4, 5, 6), block_tokens=block),
        TraceRequest(1.0, "a1", 64, 4, hash_ids=(7, 8, 9, 10), block_tokens=block),
        TraceRequest(1.5, "a1", 96, 4, hash_ids=(7, 8, 9, 10, 11, 12), block_tokens=block),
    ]
    alone = predict_requests(one, block)
    assert alone == [0, 64, 0, 64]
    four = copies(one, 2.0, 4)
    assert [r.arrival_s for r in four[4:8]] == [2.0, 2.5, 3.0, 3.5]
    assert predict_requests(four, block) == alone * 4
    assert four[:4] == one and len({four[k * 4].hash_ids for k in range(4)}) == 4
