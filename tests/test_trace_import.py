"""``lorabench trace import``: each format read from a hand-written excerpt, the transforms,
the adapter labels, byte-identical output, and bad input as one line with exit status 2."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from lorabench import cli
from lorabench.trace import adapter_shares
from lorabench.traces import data
from lorabench.traces.sources import _datetime_seconds
from lorabench.traces.transforms import hashed_label

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
        *("--time-unit", "ms", "--label-column", "user", "--adapters", "3"),
    )
    assert trace.arrival_s.tolist()[:3] == [0.0, 0.75, 0.75] and trace.input_len[0] == 12
    users = [row["user"] for row in csv.DictReader((TRACES / "requests.csv").read_text().splitlines())]
    assert {(u, a) for u, a in zip(users, trace.adapter.tolist())} == {(u, hashed_label(u, 3)) for u in users}


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
    trace = imported(tmp_path, "csv", source, *CSV_COLUMNS, "--adapters", n, "--popularity", popularity, "--seed", 3)
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
    assert chisquare(counts, counts.sum() * expected).pvalue > 0.001
    assert chisquare(counts, counts.sum() * other).pvalue < 1e-6


def test_round_robin_takes_turns(tmp_path):
    counts = labels(tmp_path, "round-robin", n=7, rows=100)
    assert counts.tolist() == [15, 15, 14, 14, 14, 14, 14]


def test_a_session_stays_on_one_adapter(tmp_path):
    source = bursty_csv(tmp_path / "s.csv", rows=4000, sessions=150)
    trace = imported(tmp_path, "csv", source, *CSV_COLUMNS, "--label-column", "session", "--adapters", 6)
    sessions = [row["session"] for row in csv.DictReader(source.read_text().splitlines())]
    adapters_of: dict[str, set[int]] = {}
    for session, adapter in zip(sessions, trace.adapter.tolist()):
        adapters_of.setdefault(session, set()).add(adapter)
    assert len(adapters_of) == 150 and all(len(a) == 1 for a in adapters_of.values())
    assert len(set(trace.adapter.tolist())) == 6


def test_the_session_hash_is_the_same_in_every_process():
    code = "from lorabench.traces.transforms import hashed_label; print([hashed_label(str(s), 8) for s in range(20)])"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True
        ).stdout
        for seed in ("1", "2")
    }
    assert outputs == {str([hashed_label(str(s), 8) for s in range(20)]) + "\n"}


def test_same_input_and_options_give_the_same_bytes(tmp_path):
    options = ("--adapters", 4, "--popularity", "zipf:1.1", "--rate", 3, "--max-model-len", 4096)
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
        tmp_path, "burstgpt", TRACES / "burstgpt.csv", "--adapters", 2, "--adapter-names", tmp_path / "adapters.json"
    )
    assert trace.adapters == ["lora-x", "lora-y"]


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
        ("mooncake", "j.jsonl", '{"timestamp": 1, "input_length": 3, "output_length": 4}\n[1]\n', (), "j.jsonl: row 2"),
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
        ("azure", "l.csv", AZURE_HEAD, ("--label-column", "user", "--adapters", 2), "l.csv: row 1: no column 'user'"),
        ("azure", "z.csv", AZURE_HEAD, ("--popularity", "zipf"), "--popularity 'zipf'"),
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
