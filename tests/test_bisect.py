"""lorabench bisect: the search finds the planted slowdown in a chain within 6 A/B
sessions wherever it is, says so when there is none, skips what cannot run, resumes; and
one chain of stand-in interpreters runs end to end through real ``lorabench ab`` sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lorabench.ab.bisect import BAD, GOOD, SKIP, UNCLEAR, Bisection, Env, bisect
from tests.helpers import ROOT
from tests.test_ab import write_fake_python

CHAIN = [Env(f"/envs/{i}/bin/python", f"env{i:02d}") for i in range(16)]


def search(slow_from, skip=(), verdicts=None):
    """The search on the 16-environment chain with a slowdown from ``slow_from`` on (None: none)."""
    sessions = []

    def verdict_of(i):
        sessions.append(i)
        if i in skip:
            return SKIP
        return BAD if slow_from is not None and i >= slow_from and i > 0 else GOOD

    state = Bisection(CHAIN, dict(verdicts or {}))
    return bisect(state, verdict_of, lambda line: None), state, sessions


@pytest.mark.parametrize("k", range(1, 16))
def test_the_slowdown_is_found_wherever_it_is_within_6_sessions(k):
    stop, state, sessions = search(k)
    assert stop == "found" and state.bounds() == (k - 1, k)
    assert len(sessions) <= 6 and sessions[:2] == [0, 15]  # the first against itself, the last against the first


def test_no_slowdown_is_said_after_two_sessions():
    stop, _, sessions = search(None)
    assert stop == "no slowdown" and sessions == [0, 15]


def test_an_environment_that_cannot_run_is_skipped_and_the_answer_is_a_range_when_it_must_be():
    stop, state, sessions = search(6, skip={7})  # 7, tried first as the middle, cannot run: 8 instead
    assert stop == "found" and state.bounds() == (5, 6) and state.verdicts[7] == SKIP and sessions[2:4] == [7, 8]
    stop, state, _ = search(7, skip={6})  # the step is at 7, but 6 cannot tell: 6 or 7
    assert stop == "range" and state.bounds() == (5, 7) and state.verdicts[6] == SKIP


def test_a_resumed_search_runs_only_the_steps_it_lacks():
    _, first, sessions = search(11)
    done = dict(list(first.verdicts.items())[:3])
    stop, state, resumed = search(11, verdicts=done)
    assert stop == "found" and state.bounds() == (10, 11) and not set(resumed) & set(done)
    assert len(resumed) == len(sessions) - 3


def test_a_first_or_last_that_cannot_run_stops_the_search():
    assert search(None, skip={0})[0] == "first skip"
    assert search(5, skip={15})[0] == "last skip"


def chain_of_fake_interpreters(folder, count, slow_from, slowdown=1.3, crashing=()):
    """A chain of the stand-in interpreter, slower from ``slow_from`` on; those in
    ``crashing`` fail their first turn (an environment that cannot build an engine)."""
    fake = write_fake_python(folder)
    lines = []
    for i in range(count):
        wrapper = folder / f"env{i}"
        scale = slowdown if i >= slow_from else 1.0
        crash = "FAKE_FAIL_PAIR=0 " if i in crashing else ""
        wrapper.write_text(f'#!/bin/sh\nFAKE_SCALE={scale} {crash}exec "{fake}" "$@"\n')
        wrapper.chmod(0o755)
        lines.append(f"{wrapper} nightly-{i}")
    envs = folder / "envs.txt"
    envs.write_text("\n".join(lines) + "\n")
    return envs


def test_a_chain_of_interpreters_is_bisected_through_real_ab_sessions_and_resumed(tmp_path):
    # Three environments, the last two slower: A/A of the first, the last against it, then
    # the middle one; a good middle one and longer chains are the search's tests above.
    envs, out = chain_of_fake_interpreters(tmp_path, 3, slow_from=1), tmp_path / "bisect"
    command = [sys.executable, "-m", "lorabench", "bisect", "--envs", str(envs), "--out", str(out), "--pairs", "2"]
    done = subprocess.run([*command, "--", "bench"], cwd=ROOT, capture_output=True, text=True, env=os.environ)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "first slower environment: nightly-1 (after nightly-0), 3 sessions" in done.stdout, done.stdout
    record = json.loads((out / "bisect.json").read_text())
    assert record["verdicts"] == {"0": GOOD, "2": BAD, "1": BAD}
    assert " 0 regressed, " not in (out / "step-001" / "comparison.txt").read_text()  # its evidence, kept
    again = subprocess.run([*command, "--resume", "--", "bench"], cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 1 and "against" not in again.stderr, again.stderr  # no session ran again


def test_an_environment_whose_turn_fails_is_skipped_not_called_slower(tmp_path):
    """nightly-1 crashes (ab exits 1 for that: a finding of its own); nightly-2 is slower.
    The crash is no slowdown: the answer is the range of both, nightly-1 marked skipped."""
    envs, out = chain_of_fake_interpreters(tmp_path, 3, slow_from=2, crashing={1}), tmp_path / "bisect"
    command = [sys.executable, "-m", "lorabench", "bisect", "--envs", str(envs), "--out", str(out), "--pairs", "2"]
    done = subprocess.run([*command, "--", "bench"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "first slower environment: one of nightly-1 (skip), nightly-2 (those between not told)" in done.stdout
    assert json.loads((out / "bisect.json").read_text())["verdicts"] == {"0": GOOD, "2": BAD, "1": SKIP}


def test_a_step_whose_pairs_could_not_show_its_change_is_no_answer(tmp_path):
    """One pair a step: the last environment's 30 % is past the threshold but untestable
    ("too few builds"), and ab exits 0. That is no "no slowdown": the bisection says it
    cannot tell, exit 2."""
    envs, out = chain_of_fake_interpreters(tmp_path, 3, slow_from=1), tmp_path / "bisect"
    command = [sys.executable, "-m", "lorabench", "bisect", "--envs", str(envs), "--out", str(out), "--pairs", "1"]
    done = subprocess.run([*command, "--", "bench"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "no slowdown" not in done.stdout, done.stdout + done.stderr
    assert "nightly-2 has changes past the threshold that its pairs could not show either way" in done.stderr
    assert json.loads((out / "bisect.json").read_text())["verdicts"]["2"] == UNCLEAR


@pytest.mark.parametrize(
    "option, says",
    [
        (["--threshold", "5x"], "--threshold '5x': expected a percentage"),
        (["--alpha", "2"], "--alpha 2.0: a significance level lies between 0 and 1"),
        (["--pairs", "0"], "--pairs 0: run at least 1 pair"),
        (["--config", "nope.json"], "--config nope.json: no such file"),
    ],
)
def test_bad_input_is_refused_before_any_step(tmp_path, capsys, option, says):
    from lorabench.cli.main import main

    envs = chain_of_fake_interpreters(tmp_path, 3, slow_from=1)
    assert main(["bisect", "--envs", str(envs), "--out", str(tmp_path / "b"), *option, "--", "bench"]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "b" / "step-000").exists()


def test_a_mistyped_interpreter_in_the_chain_is_bad_input(tmp_path, capsys):
    from lorabench.cli.main import main

    envs = chain_of_fake_interpreters(tmp_path, 3, slow_from=1)
    envs.write_text(envs.read_text().replace("env1 ", "envl "))
    assert main(["bisect", "--envs", str(envs), "--out", str(tmp_path / "b"), "--", "bench"]) == 2
    err = capsys.readouterr().err
    assert "envl (nightly-1): no such interpreter; fix its line" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "lines, says",
    [("", "lists 0 environment(s); a chain needs 2 or more"), ("# only a comment\n/one/python\n", "lists 1")],
)
def test_a_chain_too_short_is_bad_input(tmp_path, capsys, lines, says):
    from lorabench.cli.main import main

    (tmp_path / "envs.txt").write_text(lines)
    assert main(["bisect", "--envs", str(tmp_path / "envs.txt"), "--out", str(tmp_path / "b"), "--", "bench"]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_an_envs_file_that_is_not_text_and_a_damaged_record_are_bad_input(tmp_path, capsys):
    from lorabench.cli.main import main

    (tmp_path / "envs.bin").write_bytes(b"\xff\xfe\x00\x81")
    assert main(["bisect", "--envs", str(tmp_path / "envs.bin"), "--out", str(tmp_path / "b"), "--", "bench"]) == 2
    err = capsys.readouterr().err
    assert "not a text file" in err and len(err.strip().splitlines()) == 1, err
    envs = chain_of_fake_interpreters(tmp_path, 3, slow_from=1)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "bisect.json").write_text('{"envs": [')  # cut short by a full disk
    assert main(["bisect", "--envs", str(envs), "--out", str(tmp_path / "b"), "--resume", "--", "bench"]) == 2
    err = capsys.readouterr().err
    assert "is not a bisection record" in err and len(err.strip().splitlines()) == 1, err
