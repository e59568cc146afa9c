"""Trace files: written whole or not at all, their request count checked on reading, and
bad input to ``trace generate`` and ``trace stats`` as one line with exit status 2."""

import json
from pathlib import Path

import pytest

from lorabench.cli import main as cli
from lorabench.load.traces import data
from lorabench.load.traces import synthetic as trace
from lorabench.load.traces.synthetic import TraceParams
from tests.test_trace_import import TRACES

ADAPTERS = [f"a{i}" for i in range(4)]
PARAMS = TraceParams(num_adapters=4, rate=5, duration=20, seed=3)


def imported(tmp_path: Path) -> Path:
    out = tmp_path / "azure.jsonl"
    assert cli.main(["trace", "import", "azure", str(TRACES / "azure_code.csv"), "--out", str(out)]) == 0
    return out


def generated(tmp_path: Path) -> Path:
    out = tmp_path / "syn.jsonl"
    trace.write(out, PARAMS, ADAPTERS, trace.generate(PARAMS, ADAPTERS))
    return out


def one_line(capsys: pytest.CaptureFixture[str], action: str) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"lorabench trace {action}: ") and "Traceback" not in captured.err
    return captured.err


def test_a_generated_trace_counts_its_requests_and_reads_back(tmp_path):
    path = generated(tmp_path)
    loaded = data.load(path)
    assert loaded.header["requests"] == len(loaded) == len(trace.generate(PARAMS, ADAPTERS)) > 50
    assert trace.params_from_header(loaded.header) == PARAMS and loaded.adapters == ADAPTERS
    assert loaded.requests() == trace.generate(PARAMS, ADAPTERS)


@pytest.mark.parametrize(("make", "again"), [(imported, "import"), (generated, "generate")])
def test_a_cut_file_is_refused_with_both_counts(tmp_path, capsys, make, again):
    path = make(tmp_path)
    capsys.readouterr()
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-3]))
    with pytest.raises(ValueError) as info:
        data.load(path)
    expected = f"the header says {len(lines) - 1} requests and the file holds {len(lines) - 4}"
    assert str(info.value).startswith(f"{path}: {expected}") and f"`lorabench trace {again}`" in str(info.value)
    assert cli.main(["trace", "stats", str(path)]) == 2
    assert expected in one_line(capsys, "stats")


def test_a_synthetic_file_from_before_the_count_still_reads(tmp_path):
    path = generated(tmp_path)
    header, *requests = path.read_text().splitlines()
    older = {k: v for k, v in json.loads(header).items() if k != "requests"}
    path.write_text("\n".join([json.dumps(older), *requests[:-1]]) + "\n")
    assert len(data.load(path)) == len(requests) - 1


class DiskFull:
    """A file that takes half of what is written to it, then fails as a full disk does."""

    def __init__(self, file):
        self.file = file

    def write(self, text: str) -> int:
        self.file.write(text[: len(text) // 2])
        raise OSError(28, "No space left on device")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def __getattr__(self, name):
        return getattr(self.file, name)


def write_imported(path: Path) -> None:
    data.write(path, data.load(path))


def write_generated(path: Path) -> None:
    trace.write(path, PARAMS, ADAPTERS, trace.generate(PARAMS, ADAPTERS))


@pytest.mark.parametrize(("make", "write"), [(imported, write_imported), (generated, write_generated)])
def test_a_failed_write_leaves_the_file_that_was_there(tmp_path, monkeypatch, make, write):
    """Writing again over a trace on a disk that fills up midway keeps the trace whole,
    and leaves no temporary file."""
    path = make(tmp_path)
    before = path.read_bytes()
    real_open = Path.open

    def open_on_full_disk(self, mode="r", *args, **kwargs):
        file = real_open(self, mode, *args, **kwargs)
        return DiskFull(file) if "w" in mode else file

    monkeypatch.setattr(Path, "open", open_on_full_disk)
    with pytest.raises(OSError, match="No space left"):
        write(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


GENERATE = ["trace", "generate", "-R", "5", "--duration", "10"]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["-n", "0"], "num_adapters must be at least 1, got 0"),
        (["-n", "2", "--popularity-alpha", "0"], "alpha must be above 0"),
        (["-n", "2", "--rate", "inf"], "rate must be above 0 requests/s and finite, got inf"),
        (["-n", "2", "--seed", "-1"], "argument --seed: expected a whole number from 0 to 4294967295, got '-1'"),
        (["-n", "2", "--adapters", "missing.json"], "--adapters: adapters file missing.json not found"),
        (["-n", "2", "--rate", "0.001", "--duration", "1"], "no request arrives in --duration 1 s at --rate 0.001"),
        (["-n", "2", "--out", "no/such/folder/t.jsonl"], "--out no/such/folder/t.jsonl: No such file"),
    ],
)
def test_bad_generate_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, options, expected):
    monkeypatch.chdir(tmp_path)
    out = [] if "--out" in options else ["--out", "t.jsonl"]
    assert cli.main([*GENERATE, *out, *options]) == 2
    assert expected in one_line(capsys, "generate")
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize(
    ("line", "change", "expected"),
    [
        (3, {"arrival_s": float("nan")}, "line 3: arrival_s nan is not a time of 0 s or later"),
        (3, {"arrival_s": -1.0}, "line 3: arrival_s -1.0 is not a time of 0 s or later"),
        (4, {"arrival_s": 0.0}, "line 4: arrival_s 0.0 is earlier than the request above it"),
        (2, {"input_len": 0}, "line 2: input_len 0 is not a number of tokens above 0"),
        (5, {"output_len": -3}, "line 5: output_len -3 is not a number of tokens above 0"),
        (1, {"params": {"duration": 0}}, "the header's duration 0.0 is not a number of seconds above 0"),
        (2, {"input_len": True}, "line 2: TypeError: arrival_s is not a number, or a length not a whole number"),
        (3, {"input_len": 10**20}, "line 3: OverflowError: int too big to convert"),
        (4, {"arrival_s": 10**400}, "line 4: OverflowError: int too large to convert to float"),
    ],
)
def test_a_trace_with_figures_no_replay_can_use_is_one_line_and_exit_2(tmp_path, capsys, line, change, expected):
    """An edited file, or one another tool wrote: trace stats crashed on these, a replay sent them."""
    path = tmp_path / "t.jsonl"
    assert cli.main([*GENERATE, "-n", "2", "--out", str(path)]) == 0
    lines = path.read_text().splitlines()
    lines[line - 1] = json.dumps({**json.loads(lines[line - 1]), **change})
    path.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert cli.main(["trace", "stats", str(path)]) == 2
    said = one_line(capsys, "stats")
    assert "t.jsonl: not a readable lorabench trace (" in said and expected in said, said


def test_an_unreadable_trace_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text("{}\n")
    assert cli.main(["trace", "stats", str(tmp_path / "bad.jsonl")]) == 2
    assert "bad.jsonl: not a readable lorabench trace" in one_line(capsys, "stats")
    assert cli.main(["trace", "stats", str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl: not a readable lorabench trace" in one_line(capsys, "stats")
