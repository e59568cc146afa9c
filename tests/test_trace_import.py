"""``lorabench trace import``: each format read from a hand-written excerpt, the transforms,
the adapter labels, byte-identical output, and bad input as one line with exit status 2."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.special import chdtrc

from lorabench.cli import main as cli
from lorabench.load.traces import data
from lorabench.load.traces.sources import _datetime_seconds
from lorabench.load.traces.synthetic import adapter_shares

TRACES = Path(__file__).parent / "data" / "traces"


def run(*args: object) -> int:
    return cli.main(["trace", "import", *map(str, args)])


def imported(tmp_path: Path, fmt: str, source: Path, *options: object, name: str = "out.jsonl") -> data.TraceData:
    out = tmp_path / name
    assert run(fmt, source, "--out", out, *options) == 0
    return data.load(out)


def bursty_csv(path: Path, rows: int = 3000, sessions: int = 0, seed: int = 5) -> Path:
    """Arrivals in bursts (inter-arrival CV about 3), times in seconds, optional sessions."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.gamma(1 / 9, 9 / 20, size=rows))
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t", "in", "out", "session"])
        for k, t in enumerate(times):
            writer.writerow([f"{t:.6f}", 1 + k % 97, 1 + k % 31, f"s{rng.integers(sessions) if sessions else 0}"])
    return path


CSV_COLUMNS = ("--time-column", "t", "--input-column", "in", "--output-column", "out")


def test_azure_timestamps_keep_seven_fractional_digits():
    whole, fraction = _datetime_seconds("2023-11-16 18:15:53.9999999")
    assert fraction == pytest.approx(0.9999999, abs=1e-12)
    assert _datetime_seconds("2023-11-16T18:15:53Z") == (whole, 0.0)
    assert _datetime_seconds("2023-11-16 19:15:53+01:00") == (whole, 0.0)


def test_azure_excerpt(tmp_path):
    trace = imported(tmp_path, "azure", TRACES / "azure_code.csv")
    # 16 rows, one without output; times from the first row, across a minute boundary.
    assert len(trace) == 15 and trace.arrival_s[0] == 0.0
    assert trace.arrival_s[1] == pytest.approx(4.314579, abs=1e-9)
    assert 7.319410 in trace.arrival_s.tolist() and 9.31941 in trace.arrival_s.tolist()
    assert trace.arrival_s[-1] == pytest.approx(20.208299, abs=1e-9)
    assert (trace.input_len[0], trace.output_len[0]) == (4808, 10)
    assert 1020 not in trace.input_len
    source = trace.header["source"]
    assert source["file"] == "azure_code.csv" and source["rows"] == 16 and len(source["sha256"]) == 64
    assert {"op": "drop", "rows_no_output": 1, "rows_no_input": 0} in trace.header["transforms"]


def test_burstgpt_excerpt_drops_failed_requests(tmp_path):
    trace = imported(tmp_path, "burstgpt", TRACES / "burstgpt.csv")
    assert len(trace) == 12 and trace.arrival_s.tolist()[:3] == [0.0, 40.0, 120.0]
    assert trace.duration_s == 215.0 and 332 not in trace.input_len and 85 not in trace.input_len


def test_mooncake_excerpt_times_are_milliseconds(tmp_path):
    trace = imported(tmp_path, "mooncake", TRACES / "mooncake.jsonl")
    assert len(trace) == 12 and trace.arrival_s.tolist()[:3] == [0.0, 0.0, 3.052]
    assert trace.input_len.tolist()[:2] == [6755, 7319] and trace.output_len[-1] == 77


def test_any_csv_with_named_columns_unit_and_labels(tmp_path):
    trace = imported(
        tmp_path,
        "csv",
        TRACES / "requests.csv",
        *("--time-column", "arrival_ms", "--input-column", "prompt_tokens", "--output-column", "completion_tokens"),
        *("--time-unit", "ms", "--label-column", "user", "--num-adapters", "3"),
    )
    assert trace.arrival_s.tolist()[:3] == [0.0, 0.75, 0.75] and trace.input_len[0] == 12
    users = [row["user"] for row in csv.DictReader((TRACES / "requests.csv").read_text().splitlines())]
    # By request count: alice 4, bob 3, carol 2, dave 1; the fourth goes round to adapter 0.
    assert dict(zip(users, trace.adapter.tolist())) == {"alice": 0, "bob": 1, "carol": 2, "dave": 0}


def test_window_and_clip_are_counted(tmp_path, capsys):
    out = tmp_path / "w.jsonl"
    assert (
        run("azure", TRACES / "azure_code.csv", "--out", out, "--start", 4, "--duration", 9, "--max-model-len", 512)
        == 0
    )
    trace = data.load(out)
    steps = {s["op"]: s for s in trace.header["transforms"]}
    # [4, 13) s after the first request: rows 2 to 10 of the file, one of them without output.
    assert steps["window"]["rows_outside"] == 7 and len(trace) == 8 and trace.duration_s == 9
    assert trace.arrival_s[0] == pytest.approx(0.314579) and trace.arrival_s.max() < 9
    assert steps["clip"]["rows_clipped"] == 5 and ((trace.input_len + trace.output_len) <= 512).all()
    assert (trace.input_len >= 1).all() and (trace.output_len >= 1).all()
    capsys.readouterr()
    assert cli.main(["trace", "stats", str(out)]) == 0
    text = capsys.readouterr().out
    assert "7 rows outside" in text and "1 rows without output" in text and "clipped to 512 tokens" in text


def test_a_window_past_the_end_is_refused_with_the_length_that_fits(tmp_path, capsys):
    """The trace's last request is 20.2083 s after its first: a window to 110 s would say
    1 req/s of a trace whose requests all arrive in its first 0.7 s."""
    out = tmp_path / "w.jsonl"
    assert run("azure", TRACES / "azure_code.csv", "--out", out, "--start", 10, "--duration", 100, "--rate", 1) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and not out.exists()
    assert "--start 10 --duration 100 runs to 110 s, past the trace's last request at 20.2083 s" in captured.err
    assert "give --duration 10.208 or less, or leave --duration out" in captured.err
    assert run("azure", TRACES / "azure_code.csv", "--out", out, "--start", 10, "--duration", 10.208, "--rate", 1) == 0
    fitted = data.load(out)
    # The requests from 10 s to 20.208 s (the last one, at 20.2083 s, just outside), at 1 req/s.
    assert len(fitted) == 6 and fitted.duration_s == pytest.approx(6.0) and fitted.arrival_s[-1] < 6.0


def test_clipping_keeps_the_output_and_shortens_the_input(tmp_path):
    trace = imported(tmp_path, "mooncake", TRACES / "mooncake.jsonl", "--max-model-len", 1000)
    assert (trace.input_len[0], trace.output_len[0]) == (500, 500)
    assert (trace.input_len[9], trace.output_len[9]) == (512, 64), "a request that fits is left alone"
    tight = imported(tmp_path, "mooncake", TRACES / "mooncake.jsonl", "--max-model-len", 300, name="tight.jsonl")
    assert (tight.input_len[0], tight.output_len[0]) == (1, 299), "an output too long keeps one token of input"
    assert ((tight.input_len + tight.output_len) <= 300).all() and tight.input_len.min() >= 1


@pytest.mark.parametrize("rate", [0.5, 7.0, 40.0])
def test_rate_is_reached_and_arrival_order_and_shape_kept(tmp_path, rate):
    source = bursty_csv(tmp_path / "b.csv")
    plain = imported(tmp_path, "csv", source, *CSV_COLUMNS, name="plain.jsonl")
    scaled = imported(tmp_path, "csv", source, *CSV_COLUMNS, "--rate", rate, name="scaled.jsonl")
    assert abs(scaled.rate - rate) / rate < 0.01
    assert scaled.input_len.tolist() == plain.input_len.tolist(), "arrival order kept"
    assert (np.diff(scaled.arrival_s) >= 0).all()
    factor = scaled.duration_s / plain.duration_s
    # Both files hold times to the microsecond: the plain one's rounding grows with the factor.
    assert np.allclose(scaled.arrival_s, plain.arrival_s * factor, rtol=0, atol=1e-6 * (1 + factor)), "same shape"


def test_time_scale_multiplies_arrivals(tmp_path):
    plain = imported(tmp_path, "burstgpt", TRACES / "burstgpt.csv", name="a.jsonl")
    fast = imported(tmp_path, "burstgpt", TRACES / "burstgpt.csv", "--time-scale", 0.01, name="b.jsonl")
    assert np.allclose(fast.arrival_s, plain.arrival_s / 100) and fast.duration_s == pytest.approx(2.15)


def labels(tmp_path: Path, popularity: str, n: int = 8, rows: int = 20000) -> np.ndarray:
    source = bursty_csv(tmp_path / "l.csv", rows=rows)
    trace = imported(
        tmp_path, "csv", source, *CSV_COLUMNS, "--num-adapters", n, "--popularity", popularity, "--seed", 3
    )
    return np.bincount(trace.adapter, minlength=n)


def zipf_shares(n: int, alpha: float) -> np.ndarray:
    weights = np.arange(1, n + 1) ** -alpha
    return weights / weights.sum()


@pytest.mark.parametrize(
    ("popularity", "expected", "other"),
    [
        ("powerlaw:0.3", adapter_shares(8, 0.3), zipf_shares(8, 1.0)),
        ("zipf:1.2", zipf_shares(8, 1.2), adapter_shares(8, 0.3)),
        ("uniform", np.full(8, 1 / 8), zipf_shares(8, 0.3)),
    ],
)
def test_popularity_gives_the_asked_shares(tmp_path, popularity, expected, other):
    """A chi-square test at the 0.1 % level, and the same counts reject a neighbouring law."""
    counts = labels(tmp_path, popularity)
    assert chi_square_p(counts, counts.sum() * expected) > 0.001
    assert chi_square_p(counts, counts.sum() * other) < 1e-6


def chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's goodness-of-fit p-value (scipy.stats.chisquare's, without importing all of
    scipy.stats: a second of every quick loop's collection)."""
    return float(chdtrc(len(observed) - 1, ((observed - expected) ** 2 / expected).sum()))


def test_round_robin_takes_turns(tmp_path):
    counts = labels(tmp_path, "round-robin", n=7, rows=100)
    assert counts.tolist() == [15, 15, 14, 14, 14, 14, 14]


def sessions_and_adapters(tmp_path: Path, sessions: int, adapters: int, rows: int = 4000) -> dict[str, set[int]]:
    source = bursty_csv(tmp_path / "s.csv", rows=rows, sessions=sessions)
    trace = imported(tmp_path, "csv", source, *CSV_COLUMNS, "--label-column", "session", "--num-adapters", adapters)
    names = [row["session"] for row in csv.DictReader(source.read_text().splitlines())]
    adapters_of: dict[str, set[int]] = {}
    for session, adapter in zip(names, trace.adapter.tolist()):
        adapters_of.setdefault(session, set()).add(adapter)
    return adapters_of


def test_a_session_stays_on_one_adapter_and_folded_sessions_spread(tmp_path, capsys):
    adapters_of = sessions_and_adapters(tmp_path, 150, 6)
    assert len(adapters_of) == 150 and all(len(a) == 1 for a in adapters_of.values())
    sessions_per_adapter = np.bincount([min(a) for a in adapters_of.values()])
    assert sessions_per_adapter.tolist() == [25] * 6, "dealt round-robin by rank"
    err = capsys.readouterr().err
    assert "warning: column 'session' has 150 labels for 6 adapters: folded by request count" in err
    header = data.load(tmp_path / "out.jsonl").header
    assert header["transforms"][-1] == {"op": "label", "label_column": "session", "labels": 150, "adapters": 6}


def test_no_more_labels_than_adapters_gives_each_its_own(tmp_path, capsys):
    """Twelve tenants on twelve adapters use twelve (hashing them put five pairs together)."""
    adapters_of = sessions_and_adapters(tmp_path, 12, 12, rows=600)
    assert sorted(min(a) for a in adapters_of.values()) == list(range(12))
    assert all(len(a) == 1 for a in adapters_of.values()) and capsys.readouterr().err == ""
    trace = data.load(tmp_path / "out.jsonl")
    counts = np.bincount(trace.adapter)
    busiest = trace.header["transforms"][-1]["adapter_labels"]
    assert (np.diff(counts) <= 0).all(), "the busiest label on adapter 0"
    assert sorted(busiest) == sorted(adapters_of) and adapters_of[busiest[0]] == {0}


def test_fewer_labels_than_adapters_warn_and_stats_name_the_idle_ones(tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    options = ("--label-column", "Model", "--num-adapters", 4)
    assert run("burstgpt", TRACES / "burstgpt.csv", "--out", out, *options) == 0
    assert "'Model' has 2 labels for 4 adapters: 2 adapters get no request" in capsys.readouterr().err
    assert cli.main(["trace", "stats", str(out)]) == 0
    text = capsys.readouterr().out
    assert "adapter shares: adapter-0 66.7%, adapter-1 33.3%\n" in text, "no idle adapter listed at 0 %"
    assert "adapters without a request: 2 of 4: adapter-2, adapter-3" in text
    assert "column 'Model', 2 labels, each its own adapter, busiest first: 'ChatGPT', 'GPT-4'" in text


def test_same_input_and_options_give_the_same_bytes(tmp_path):
    options = ("--num-adapters", 4, "--popularity", "zipf:1.1", "--rate", 3, "--max-model-len", 4096)
    (tmp_path / "elsewhere").mkdir()
    copy = tmp_path / "elsewhere" / "mooncake.jsonl"
    copy.write_bytes((TRACES / "mooncake.jsonl").read_bytes())
    for out, source in (("a", TRACES / "mooncake.jsonl"), ("b", copy)):
        assert run("mooncake", source, "--out", tmp_path / out, *options) == 0
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    assert run("mooncake", copy, "--out", tmp_path / "c", *options, "--seed", 1) == 0
    assert (tmp_path / "a").read_bytes() != (tmp_path / "c").read_bytes()
    header = json.loads((tmp_path / "a").read_text().splitlines()[0])
    assert header["format"] == "lorabench-trace/2" and header["requests"] == 12


def test_adapter_names_come_from_an_adapters_file(tmp_path):
    names = [{"name": f"lora-{c}", "path": c} for c in "xyz"]
    (tmp_path / "adapters.json").write_text(json.dumps(names))
    trace = imported(
        tmp_path, "burstgpt", TRACES / "burstgpt.csv", "--num-adapters", 2, "--adapters", tmp_path / "adapters.json"
    )
    assert trace.adapters == ["lora-x", "lora-y"]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--time-scale", "inf"),
        ("--rate", "inf"),
        ("--duration", "inf"),
        ("--start", "inf"),
        ("--duration", "0"),
        ("--time-scale", "0"),
        ("--rate", "0"),
        ("--start", "-1"),
    ],
)
def test_an_infinite_or_empty_time_option_is_one_line_not_a_file_of_nan(tmp_path, capsys, option, value):
    """--time-scale inf wrote arrivals of nan that `trace stats` then could not read."""
    assert run("azure", TRACES / "azure_code.csv", "--out", tmp_path / "t.jsonl", option, value) == 2
    err = capsys.readouterr().err
    assert f"{option} {value}" in err and err.count("\n") == 1, err
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ("--adapters", "4"),
            "--adapters 4: --adapters names an adapters.json, as in trace generate; "
            "the number of adapters is --num-adapters 4",
        ),
        (("--adapter-names", "a.json"), "--adapter-names a.json: renamed, write --adapters a.json"),
    ],
)
def test_the_old_spellings_of_the_adapter_options_say_the_new_ones(tmp_path, capsys, options, message):
    """--adapters meant a number here and a file in trace generate: it names the file in both now."""
    assert run("azure", TRACES / "azure_code.csv", "--out", tmp_path / "t.jsonl", *options) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "t.jsonl").exists()


def bad_file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n"


@pytest.mark.parametrize(
    ("fmt", "name", "text", "options", "expected"),
    [
        ("azure", "b.csv", None, (), "burstgpt.csv: row 1: no column 'TIMESTAMP'"),
        ("azure", "t.csv", AZURE_HEAD + "2023-11-16 25:61:00,10,5\n", (), "t.csv: row 3, column 'TIMESTAMP'"),
        ("azure", "n.csv", AZURE_HEAD + "2023-11-16 18:15:47.1,-4,5\n", (), "n.csv: row 3, column 'ContextTokens'"),
        ("azure", "s.csv", AZURE_HEAD + "2023-11-16 18:15:47.1\n", (), "s.csv: row 3, column 'ContextTokens'"),
        (
            "burstgpt",
            "x.csv",
            "Timestamp,Session ID,Request tokens,Response tokens\n1,2,x,3\n",
            (),
            "x.csv: row 2, column 'Request tokens'",
        ),
        (
            "mooncake",
            "m.jsonl",
            '{"timestamp": 1, "input_length": 3}\n',
            (),
            "m.jsonl: row 1: no column 'output_length'",
        ),
        (
            "mooncake",
            "j.jsonl",
            '{"timestamp": 1, "input_length": 3, "output_length": 4, "hash_ids": [1]}\n[1]\n',
            (),
            "j.jsonl: row 2",
        ),
        # Shared prefixes: a Mooncake row without its ids, ids that are not whole numbers.
        (
            "mooncake",
            "h.jsonl",
            '{"timestamp": 1, "input_length": 3, "output_length": 4}\n',
            (),
            "h.jsonl: row 1: no column 'hash_ids' (it has 'timestamp', 'input_length', 'output_length'): fill it in, "
            "or pass --no-hash-ids",
        ),
        (
            "mooncake",
            "f.jsonl",
            '{"timestamp": 1, "input_length": 3, "output_length": 4, "hash_ids": [1, 2.5]}\n',
            (),
            "f.jsonl: row 1, column 'hash_ids': [1, 2.5] is not a list of block hash ids",
        ),
        (
            "csv",
            "p.csv",
            "t,i,o,ids\n1,3,4,7 x\n",
            ("--time-column", "t", "--input-column", "i", "--output-column", "o", "--prefix-column", "ids"),
            "p.csv: row 2, column 'ids': '7 x' is not a list of block hash ids",
        ),
        ("mooncake", "n.jsonl", AZURE_HEAD, ("--no-hash-ids", "--prefix-column", "x"), "--no-hash-ids and --prefix"),
        ("azure", "w.csv", AZURE_HEAD, ("--start", 100), "w.csv: the window --start 100 holds no request"),
        ("parquet", "p.csv", AZURE_HEAD, (), "unknown format 'parquet'"),
        ("csv", "c.csv", AZURE_HEAD, (), "the csv format needs --time-column"),
        (
            "csv",
            "u.csv",
            AZURE_HEAD,
            ("--time-column", "TIMESTAMP", "--input-column", "ContextTokens", "--output-column", "GeneratedTokens"),
            "u.csv: row 2, column 'TIMESTAMP'",
        ),
        (
            "azure",
            "l.csv",
            AZURE_HEAD,
            ("--label-column", "user", "--num-adapters", 2),
            "l.csv: row 1: no column 'user'",
        ),
        ("azure", "z.csv", AZURE_HEAD, ("--popularity", "zipf"), "--popularity 'zipf'"),
        # An empty or null label is no adapter's: it lumped every unlabelled request onto one adapter.
        (
            "azure",
            "e.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens,user\n"
            "2023-11-16 18:15:46.68,10,5,alice\n2023-11-16 18:15:47.1,10,5,\n",
            ("--label-column", "user", "--num-adapters", 2),
            "e.csv: row 3, column 'user': no label",
        ),
        (
            "mooncake",
            "e.jsonl",
            '{"timestamp": 1, "input_length": 3, "output_length": 4, "hash_ids": [], "user": null}\n',
            ("--label-column", "user", "--num-adapters", 2),
            "e.jsonl: row 1, column 'user': no label",
        ),
        ("azure", "missing.csv", None, (), "missing.csv: no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, fmt, name, text, options, expected):
    if text is not None:
        source = bad_file(tmp_path, name, text)
    else:
        source = TRACES / "burstgpt.csv" if name == "b.csv" else tmp_path / name
    assert run(fmt, source, "--out", tmp_path / "out.jsonl", *options) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("lorabench trace import: ") and expected in captured.err
    assert not (tmp_path / "out.jsonl").exists()
