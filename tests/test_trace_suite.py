"""Imported traces in online suites (config, resolve, cases) and ``lorabench trace stats``."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lorabench.cli import main as cli
from lorabench.config import ConfigError, online_cases, read_config_file, resolve_config
from lorabench.config.online_cases import IMPORTED_TRACE_COLUMNS, ONLINE_TRACE_COLUMNS, SYNTHETIC_TRACE_COLUMNS
from lorabench.load.traces import data
from lorabench.load.traces.transforms import replay_window
from tests.helpers import ROOT, result_files
from tests.test_trace_import import CSV_COLUMNS, TRACES, bursty_csv

SYNTHETIC = {"name": "syn", "num_adapters": [2], "rate": [2], "duration": 5, "input_range": [8, 32]}


def import_to(folder: Path, fmt: str, source: Path, *options: object) -> Path:
    out = folder / "traces" / f"{source.stem}.jsonl"
    out.parent.mkdir(exist_ok=True)
    assert cli.main(["trace", "import", fmt, str(source), "--out", str(out), *map(str, options)]) == 0
    return out


def online(*suites: dict) -> dict:
    return {"warmup_s": 1, "suites": list(suites)}


def problems(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_config(path, read_config_file(path), needs_lora=True)
    return str(info.value)


@pytest.mark.parametrize(
    ("suite", "expected"),
    [
        ({"trace": "t.jsonl", "rate": [1], "alpha": [0.5]}, "field 'online.suites[0].alpha' has bad value [0.5]"),
        ({"trace": "t.jsonl", "rate": [1], "num_adapters": [2]}, "leave this synthetic-trace field out"),
        ({"name": "s", "rate": [1]}, "field 'online.suites[0].num_adapters' has bad value None: a synth"),
        ({**SYNTHETIC, "start": 3}, "field 'online.suites[0].start' has bad value 3: 'start' is where"),
    ],
)
def test_a_suite_is_synthetic_or_imported_never_both(tiny_config, suite, expected):
    with pytest.raises(ConfigError) as info:
        read_config_file(tiny_config(online=online(suite)))
    assert expected in str(info.value)


@pytest.fixture
def two_traces(tiny_config, tmp_path):
    """A config whose two imported suites replay two different traces, beside a synthetic one."""
    import_to(tmp_path, "burstgpt", TRACES / "burstgpt.csv", "--num-adapters", 3, "--max-model-len", 128)
    import_to(tmp_path, "mooncake", TRACES / "mooncake.jsonl", "--num-adapters", 2, "--max-model-len", 128)
    return tiny_config(
        online=online(
            SYNTHETIC,
            {"name": "burst", "trace": "traces/burstgpt.jsonl", "rate": [0.5, 1], "duration": 4},
            {"name": "moon", "trace": "traces/mooncake.jsonl", "rate": [1], "duration": 5, "start": 3},
        )
    )


def test_imported_suites_resolve_and_expand(two_traces):
    config = resolve_config(two_traces, read_config_file(two_traces), needs_lora=True)
    cases = [c.located(config.path.parent) for c in online_cases(config.file)]
    assert [c.id for c in cases] == [
        "syn-n2-a1-cv1-r2",
        "burst-burstgpt-r0.5",
        "burst-burstgpt-r1",
        "moon-mooncake-s3-r1",
    ]
    names = [a.name for a in config.adapters]
    fields = [c.fields(1.0) for c in cases]
    assert set(fields[0]) == ONLINE_TRACE_COLUMNS | SYNTHETIC_TRACE_COLUMNS
    assert all(set(f) == ONLINE_TRACE_COLUMNS | IMPORTED_TRACE_COLUMNS for f in fields[1:])
    shas = [f["trace_sha256"] for f in fields[1:]]
    assert shas[0] == shas[1] != shas[2] == data.file_sha256(two_traces.parent / "traces" / "mooncake.jsonl")
    assert fields[3] == {
        "trace_suite": "moon",
        "trace_num_adapters": 2,
        "trace_rate": 1,
        "trace_duration_s": 5,
        "trace_warmup_s": 1.0,
        "trace_file": "mooncake.jsonl",
        "trace_sha256": shas[2],
        "trace_start_s": 3,
    }
    requests = cases[2].requests(names[: cases[2].num_adapters])
    assert len(requests) == 4 and {r.adapter for r in requests} <= set(names[:3])
    assert all(0 <= r.arrival_s <= 4 for r in requests)
    moon = cases[3].requests(names[:2])
    # From 3 s on: the mooncake excerpt's requests from 3.052 s, the first at 0.052 s times the scale.
    assert len(moon) == 5 and moon[0].input_len == data.load(cases[3].trace).input_len[2]


@pytest.mark.parametrize(
    ("suite", "options", "expected"),
    [
        ({"rate": [50], "duration": 4}, (), "field 'online.suites[0].rate' has bad value 50: from 0 s on the trace"),
        ({"rate": [1], "duration": 4}, ("--num-adapters", 6), "labels requests with 6 adapters, only 4 are configured"),
        ({"rate": [1], "duration": 4}, ("--max-model-len", 4096), "import it again with --max-model-len 128"),
        ({"rate": [1], "duration": 4, "trace": "traces/none.jsonl"}, (), "none.jsonl: not a readable lorabench"),
        ({"rate": [1], "duration": 1}, (), "'online.warmup_s' has bad value 1.0: it leaves nothing of suite 't'"),
        (
            {"rate": [1, 0.25], "duration": 10},
            (),
            "'online.suites[0].rate' has bad value 0.25: over 10 s it is 2.5 requests, and a replay sends 2 "
            "(0.2 req/s)",
        ),
        (
            {"rate": [1], "duration": 4, "start": 300},
            (),
            "field 'online.suites[0].start' has bad value 300: burstgpt.jsonl's last request arrives at 215 s",
        ),
    ],
)
def test_bad_imported_suites(tiny_config, tmp_path, suite, options, expected):
    import_to(tmp_path, "burstgpt", TRACES / "burstgpt.csv", *(options or ("--max-model-len", 128)))
    path = tiny_config(online=online({"name": "t", "trace": "traces/burstgpt.jsonl", **suite}))
    assert expected in problems(path)


@pytest.mark.parametrize("rate", [2, 4.5, 11])
def test_a_replay_window_has_the_rate_asked(tmp_path, rate):
    trace = data.load(import_to(tmp_path, "csv", bursty_csv(tmp_path / "b.csv"), *CSV_COLUMNS))
    window = replay_window(trace, 10.0, 30.0, rate)
    assert abs(len(window) / 30.0 - rate) / rate < 0.01
    assert (np.diff(window.arrival_s) >= 0).all() and 0 <= window.arrival_s.min() and window.arrival_s.max() <= 30
    first = int(np.searchsorted(trace.arrival_s, 10.0))
    assert window.input_len.tolist() == trace.input_len[first : first + len(window)].tolist()
    source_gaps, gaps = np.diff(trace.arrival_s[first : first + len(window)]), np.diff(window.arrival_s)
    assert np.allclose(gaps, source_gaps * (gaps.sum() / source_gaps.sum()), atol=1e-5), "bursts keep their shape"


def test_a_capacity_search_counts_the_requests_its_replay_can_use(tmp_path):
    """From ``start`` in the trace's time, as the replay takes them: a trace imported from
    3 s on starts 0.052 s in, and a probe from 0.05 s has all 10 of its requests."""
    from lorabench.config.online_cases import ImportedCase
    from lorabench.scenarios.capacity_probes import CapacityCase

    path = import_to(tmp_path, "mooncake", TRACES / "mooncake.jsonl", "--start", 3)
    case = CapacityCase(ImportedCase("moon", path, rate=1.0, duration=5.0, start=0.05))
    assert case.shape.data.arrival_s[0] == pytest.approx(0.052) and len(case.shape.data) == 10
    assert case.available() == 10 and len(replay_window(case.shape.data, 0.05, 5.0, 10 / 5.0)) == 10
    with pytest.raises(ValueError, match="has 10 requests"):
        replay_window(case.shape.data, 0.05, 5.0, 11 / 5.0)


def test_stats_of_an_imported_trace_and_its_plot(tmp_path, capsys):
    out = import_to(tmp_path, "azure", TRACES / "azure_code.csv", "--num-adapters", 3, "--popularity", "powerlaw:0.5")
    capsys.readouterr()
    assert cli.main(["trace", "stats", str(out), "--plot", str(tmp_path / "t.png")]) == 0
    text = capsys.readouterr().out
    assert "source: azure file azure_code.csv" in text and "1 rows without output" in text
    assert "requests: 15 over 20.2083 s: 0.742 req/s" in text
    assert "rate over time (0.5 s buckets, req/s): min 0, median 0, max 6" in text
    assert "adapter shares: adapter-0" in text and "input lengths: p50" in text
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert cli.main(["trace", "stats", str(out), "--plot", str(tmp_path / "no-such-folder" / "t.png")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"--plot {tmp_path / 'no-such-folder' / 't.png'}: No such file or directory" in line


class _Arrivals:
    """What rate_over_time reads of a trace."""

    def __init__(self, arrival_s, duration_s):
        self.arrival_s, self.duration_s = np.asarray(arrival_s, dtype=float), duration_s

    def __len__(self):
        return len(self.arrival_s)


@pytest.mark.parametrize("end_s", [13.1, 13.4, 13.0])
def test_an_even_trace_has_an_even_rate_over_time_to_its_last_bucket(end_s):
    """10 req/s to the end: a last bucket the trace covers only partly is no dip and no peak."""
    from lorabench.load.traces.summary import rate_over_time

    width, rates = rate_over_time(_Arrivals(np.arange(round(end_s * 10)) / 10, end_s))
    assert width == 0.5 and rates.min() >= 9 and rates.max() <= 11, rates


def test_stats_of_a_synthetic_trace_show_its_rate_over_time(tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    assert cli.main(["trace", "generate", "--out", str(out), "-n", "4", "-R", "5", "--duration", "60"]) == 0
    capsys.readouterr()
    assert cli.main(["trace", "stats", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(asked 5)" in text and "rate over time (1 s buckets, req/s)" in text


def standin_replay(pytester, folder: Path, source: Path, fmt: str) -> Path:
    """Replay an imported trace on the stand-in through the plugin; returns the result file."""
    from lorabench.targets.standin import Costs, StandIn, write_config

    folder.mkdir()
    import_to(folder, fmt, source, "--num-adapters", 2, "--max-model-len", 128)
    suite = {"name": "real", "trace": f"traces/{source.stem}.jsonl", "rate": [10], "duration": 0.5}
    config = write_config(folder, adapters=2, online={"warmup_s": 0.1, "suites": [suite]})
    result = pytester.runpytest(
        "--bench-config",
        str(config),
        "-k",
        "online",
        "-p",
        "no:cacheprovider",
        plugins=[StandIn(Costs(), virtual_clock=True)],
    )
    result.assert_outcomes(passed=1)
    (csv,) = result_files(folder / "results")
    return csv


def test_replays_of_two_imported_traces_run_and_are_never_matched(pytester):
    """Each row names its trace by file and sha256 and leaves the synthetic columns blank;
    compare pairs no case of a BurstGPT replay with one of a Mooncake replay."""
    from lorabench.analysis.compare import CompareError
    from lorabench.analysis.compare.select import run_comparison

    pytester.makepyfile(test_multilora_online=(ROOT / "bench" / "test_multilora_online.py").read_text())
    burst = standin_replay(pytester, pytester.path / "a", TRACES / "burstgpt.csv", "burstgpt")
    moon = standin_replay(pytester, pytester.path / "b", TRACES / "mooncake.jsonl", "mooncake")
    (row,) = pd.read_csv(burst).to_dict("records")
    assert row["trace_file"] == "burstgpt.jsonl" and len(row["trace_sha256"]) == 64
    assert row["trace_sha256"] == data.file_sha256(pytester.path / "a" / "traces" / "burstgpt.jsonl")
    assert row["trace_start_s"] == 0 and row["num_requests"] > 0
    assert all(pd.isna(row[c]) for c in SYNTHETIC_TRACE_COLUMNS)
    with pytest.raises(CompareError, match="no case in common"):
        run_comparison(str(burst), str(moon))


@pytest.mark.engine
def test_the_example_imported_trace_replays_on_the_real_cpu_engine(pytester, tmp_path):
    """config/imported-trace.json as a user runs it: both rates replay, with a timeline."""
    from lorabench.results.records import replays_path_for

    pytester.makepyfile(test_multilora_online=(ROOT / "bench" / "test_multilora_online.py").read_text())
    csv = tmp_path / "imported.csv"
    config = ROOT / "config" / "imported-trace.json"
    result = pytester.runpytest_subprocess(
        "--bench-config", str(config), "-k", "online", "-p", "no:cacheprovider", "--bench-output", str(csv), timeout=300
    )
    result.assert_outcomes(passed=2)
    rows = pd.read_csv(csv)
    assert sorted(rows["trace_rate"]) == [1, 2] and rows["trace_file"].eq("azure-code-excerpt.jsonl").all()
    assert (rows["num_requests"] > 0).all() and (rows["kv_usage_max"] > 0).all()
    steps = pd.read_csv(replays_path_for(csv, "timeline"))
    assert (steps.loc[steps["running"] > 0, "kv_usage"] > 0).all()
