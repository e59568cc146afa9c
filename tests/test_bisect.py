"""lorabench bisect: the search finds the planted slowdown in a chain within 6 A/B
sessions wherever it is, says so when there is none, skips what cannot run, resumes; and
one chain of stand-in interpreters runs end to end through real ``lorabench ab`` sessions."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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
    assert stop == "none found" and sessions == [0, 15]


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


def bisect_here(monkeypatch, capsys, *args, ab_in_process=True):
    """``python -m lorabench bisect ARGS -- bench`` from the repository's root, run in this
    process (an interpreter of its own imports pandas and scipy again: most of a second on a
    slow host). Each step's ``lorabench ab`` session is the real one, on the command line
    bisect built, its streams into the step's log and its status bisect's verdict; it runs in
    this process too, as tests/test_ab.py runs its sessions, unless ``ab_in_process`` is false:
    then as bisect starts it, a ``python -m lorabench ab`` process (the end-to-end test below).
    Either way each turn is a stand-in interpreter's process. Returns the status and streams."""
    from lorabench.cli.main import main

    if ab_in_process:
        import lorabench.ab.bisect as module

        def run(command, stdout, stderr):
            assert command[:4] == [sys.executable, "-m", "lorabench", "ab"], command
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                return subprocess.CompletedProcess(command, main(command[3:]))

        monkeypatch.setattr(module, "subprocess", SimpleNamespace(run=run))  # bisect's alone, not the turns'
    monkeypatch.chdir(ROOT)
    status = main(["bisect", *map(str, args), "--", "bench"])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, status, out, err)


def test_a_chain_of_interpreters_is_bisected_through_real_ab_sessions_and_resumed(tmp_path, monkeypatch, capsys):
    # Three environments, the last two slower: A/A of the first, the last against it, then
    # the middle one; a good middle one and longer chains are the search's tests above.
    envs, out = chain_of_fake_interpreters(tmp_path, 3, slow_from=1), tmp_path / "bisect"
    command = ["--envs", envs, "--out", out, "--pairs", "2"]
    done = bisect_here(monkeypatch, capsys, *command, ab_in_process=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "first slower environment: nightly-1 (after nightly-0), 3 sessions" in done.stdout, done.stdout
    record = json.loads((out / "bisect.json").read_text())
    assert record["verdicts"] == {"0": GOOD, "2": BAD, "1": BAD}
    assert " 0 regressed, " not in (out / "step-001" / "comparison.txt").read_text()  # its evidence, kept
    again = bisect_here(monkeypatch, capsys, *command, "--resume", ab_in_process=False)
    assert again.returncode == 1 and "against" not in again.stderr, again.stderr  # no session ran again


def test_an_environment_whose_turn_fails_is_skipped_not_called_slower(tmp_path, monkeypatch, capsys):
    """nightly-1 crashes (ab exits 1 for that: a finding of its own); nightly-2 is slower.
    The crash is no slowdown: the answer is the range of both, nightly-1 marked skipped."""
    envs, out = chain_of_fake_interpreters(tmp_path, 3, slow_from=2, crashing={1}), tmp_path / "bisect"
    done = bisect_here(monkeypatch, capsys, "--envs", envs, "--out", out, "--pairs", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "first slower environment: one of nightly-1 (skip), nightly-2 (those between not told; " in done.stdout
    assert json.loads((out / "bisect.json").read_text())["verdicts"] == {"0": GOOD, "2": BAD, "1": SKIP}


def test_a_step_whose_pairs_could_not_show_its_change_is_no_answer(tmp_path, monkeypatch, capsys):
    """One pair a step: the last environment's 30 % is past the threshold but untestable
    ("too few builds"), and ab exits 0. That is no "no slowdown": the bisection says it
    cannot tell, exit 2."""
    envs, out = chain_of_fake_interpreters(tmp_path, 3, slow_from=1), tmp_path / "bisect"
    done = bisect_here(monkeypatch, capsys, "--envs", envs, "--out", out, "--pairs", "1")
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


# --kind: each step judged by one kind of change, read from what its session's comparison found.

KINDS_ASKABLE = [
    "slowdown",
    "output",
    "hit-rate",
    "unfinished",
    "unmeasured",
    "churn",
    "isolation",
    "capacity-not-found",
]


def stand_in_ab(monkeypatch, findings, *, untested=lambda i: 0, failed_side=lambda i: None):
    """Each step's ``lorabench ab`` session, stood in for where bisect starts it: it leaves the
    record a real session leaves (``ab.json``: what its comparison found, by kind; changes past
    the threshold its pairs could not show; the side whose turn failed) and exits as ``ab``
    does, 1 for any finding. ``findings(i)``: environment i's counts by kind against the first.
    Returns the environments whose sessions ran, in order."""
    import lorabench.ab.bisect as module

    ran = []

    def run(command, **_):
        assert command[2:4] == ["lorabench", "ab"], command
        folder = Path(command[command.index("--out") + 1])
        i = int(Path(command[command.index("--new-python") + 1]).parent.name)
        found = {kind: 0 for kind in KINDS_ASKABLE} | findings(i)
        record = {"turns": [], "sides": {}, "found": found, "past_threshold_untested": untested(i)}
        if failed_side(i):
            record["failed_side"] = failed_side(i)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "ab.json").write_text(json.dumps(record))
        ran.append(i)
        return subprocess.CompletedProcess(command, 1 if any(found.values()) else 0)

    monkeypatch.setattr(module.subprocess, "run", run)
    return ran


def chain_file(folder, count):
    """A chain of ``count`` interpreters (empty files: the stand-in sessions never start them)."""
    lines = []
    for i in range(count):
        (folder / "envs" / str(i)).mkdir(parents=True)
        (folder / "envs" / str(i) / "python").touch()
        lines.append(f"{folder / 'envs' / str(i) / 'python'} env{i:02d}")
    (folder / "envs.txt").write_text("\n".join(lines) + "\n")
    return folder / "envs.txt"


def run_bisect(folder, *options, out="b"):
    from lorabench.cli.main import main

    config = str(ROOT / "config" / "common.json")
    args = ["bisect", "--envs", str(folder / "envs.txt"), "--out", str(folder / out), "--config", config]
    return main([*args, *options, "--", "bench"])


def outputs_from_3_slower_from_10(i):
    return {"output": int(i >= 3), "slowdown": 2 * (i >= 10)}


def test_a_slowdown_is_found_past_an_earlier_output_change_and_an_output_change_past_a_later_slowdown(
    tmp_path, monkeypatch, capsys
):
    """The issue's chain: outputs change from env03, timings from env10. ab exits 1 for both,
    so steering by its status found env03 as "first slower". Each kind finds its own."""
    chain_file(tmp_path, 16)
    ran = stand_in_ab(monkeypatch, outputs_from_3_slower_from_10)
    assert run_bisect(tmp_path, out="slow") == 1  # slowdown, by default
    out, err = capsys.readouterr()
    assert "first slower environment: env10 (after env09)" in out, out
    assert "evidence: timings slower than env00's" in out, out
    record = json.loads((tmp_path / "slow" / "bisect.json").read_text())
    assert record["kind"] == "slowdown" and record["verdicts"]["7"] == GOOD and record["verdicts"]["9"] == GOOD
    (line,) = [line for line in err.splitlines() if "env07 against env00" in line]
    assert line.startswith("lorabench bisect: env07 against env00: good") and "1 changed adapter output" in line, err
    assert ran[:3] == [0, 15, 7] and len(ran) <= 6

    ran.clear()
    assert run_bisect(tmp_path, "--kind", "output", out="output") == 1
    out, err = capsys.readouterr()
    assert "first environment with an output change: env03 (after env02)" in out, out
    assert "evidence: greedy output digests differ from env00's" in out, out
    record = json.loads((tmp_path / "output" / "bisect.json").read_text())
    assert record["kind"] == "output" and record["verdicts"]["15"] == BAD and record["verdicts"]["2"] == GOOD
    (line,) = [line for line in err.splitlines() if "env15 against env00" in line]
    assert "env15 against env00: bad: 1 changed adapter output" in line and "2 slower metrics" in line, err
    assert ran[:2] == [0, 15] and len(ran) <= 6

    assert run_bisect(tmp_path, "--kind", "hit-rate", out="hit-rate") == 0  # the other findings do not count
    assert "no fallen prefix hit rate: env15 against env00" in capsys.readouterr().out


def test_a_kind_the_first_environment_finds_against_itself_cannot_be_bisected(tmp_path, monkeypatch, capsys):
    """Outputs that differ between two sessions of one environment: nothing to bisect for an
    output change (exit 2), and no obstacle to bisecting a slowdown."""
    chain_file(tmp_path, 4)
    stand_in_ab(monkeypatch, lambda i: {"output": 1, "slowdown": int(i >= 2)})
    assert run_bisect(tmp_path, "--kind", "output", out="output") == 2
    err = capsys.readouterr().err
    assert "env00 has changed adapter outputs against itself: not repeatable on this selection" in err, err
    assert run_bisect(tmp_path, out="slow") == 1
    assert "first slower environment: env02 (after env01)" in capsys.readouterr().out


@pytest.mark.parametrize("kind", KINDS_ASKABLE)
def test_each_kind_is_judged_by_its_own_findings_alone(tmp_path, monkeypatch, capsys, kind):
    """Every other kind of finding from env02 on, the asked one from env05 on: env05."""
    chain_file(tmp_path, 8)
    stand_in_ab(monkeypatch, lambda i: {k: int(i >= (5 if k == kind else 2)) for k in KINDS_ASKABLE})
    assert run_bisect(tmp_path, "--kind", kind) == 1
    out = capsys.readouterr().out
    assert ": env05 (after env04)" in out and "evidence: " in out, out
    assert json.loads((tmp_path / "b" / "bisect.json").read_text())["kind"] == kind


def test_the_kinds_cover_every_finding_that_fails_a_comparison_once():
    """Each of ab's exit-1 findings counts under one kind, so none is lost to every --kind:
    every list a comparison holds, given one entry (a regressed metric, a regressed capacity
    bound, a changed output, ...), counts once exactly where it fails the comparison."""
    from dataclasses import fields
    from types import SimpleNamespace

    from lorabench.ab.kinds import KINDS, found_in
    from lorabench.analysis.compare.analysis import REGRESSED, Comparison

    assert sorted(KINDS) == sorted(KINDS_ASKABLE)
    one = SimpleNamespace(verdict=REGRESSED, change=-1)
    lists = [f.name for f in fields(Comparison) if f.name == "findings" or f.default_factory is list]
    assert {"findings", "digest_changes", "hit_rate_falls", "unmeasured", "capacity_bounds"} <= set(lists)
    failing = []
    for name in lists:
        result = Comparison(**{"base": None, "new": None, "findings": [], name: [one]})
        assert sum(found_in(result).values()) == result.failed, name  # 1 where it fails, else 0
        failing += [name] * result.failed
    assert len(failing) >= 10 and not any(found_in(Comparison(None, None, [])).values()), failing


def test_only_a_slowdown_step_is_unclear_and_a_step_whose_base_side_failed_is_skipped(tmp_path, monkeypatch, capsys):
    """env01's base side failed after pairs that found a changed output (ab exits 1): for a
    slowdown that is no verdict, skipped. env03 has timing changes its pairs could not show:
    unclear for a slowdown, but nothing to an output search."""
    chain_file(tmp_path, 4)
    stand_in_ab(
        monkeypatch,
        lambda i: {"output": int(i >= 1), "slowdown": int(i == 2)},
        untested=lambda i: 3 * (i == 3),
        failed_side=lambda i: "base" if i == 1 else None,
    )
    assert run_bisect(tmp_path, out="slow") == 2
    err = capsys.readouterr().err
    assert "env03 has changes past the threshold that its pairs could not show either way" in err, err
    assert run_bisect(tmp_path, "--kind", "output", out="output") == 1
    assert "first environment with an output change: env01 (after env00)" in capsys.readouterr().out
    stand_in_ab(
        monkeypatch,
        lambda i: {"output": int(i >= 1), "slowdown": int(i >= 2)},
        failed_side=lambda i: "base" if i == 1 else None,
    )
    assert run_bisect(tmp_path, out="skip") == 1
    assert json.loads((tmp_path / "skip" / "bisect.json").read_text())["verdicts"] == {
        "0": GOOD,
        "3": BAD,
        "1": SKIP,
        "2": BAD,
    }


def test_resume_keeps_the_kind_and_refuses_another(tmp_path, monkeypatch, capsys):
    chain_file(tmp_path, 16)
    ran = stand_in_ab(monkeypatch, outputs_from_3_slower_from_10)
    assert run_bisect(tmp_path, "--kind", "output") == 1
    capsys.readouterr()
    ran.clear()
    assert run_bisect(tmp_path, "--resume") == 2  # slowdown, by default
    err = capsys.readouterr().err
    assert "--kind slowdown" in err and "add --kind output to continue it" in err, err
    assert len(err.strip().splitlines()) == 1 and not ran
    assert run_bisect(tmp_path, "--kind", "output", "--resume") == 1 and not ran
    assert "first environment with an output change: env03 (after env02)" in capsys.readouterr().out
    record = tmp_path / "b" / "bisect.json"
    record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "kind"}))
    assert run_bisect(tmp_path, "--kind", "output", "--resume") == 2 and not ran
    err = capsys.readouterr().err
    assert "started before --kind" in err and len(err.strip().splitlines()) == 1, err


def test_a_bad_kind_is_one_line(tmp_path, capsys):
    chain_file(tmp_path, 3)
    assert run_bisect(tmp_path, "--kind", "slower") == 2
    err = capsys.readouterr().err
    assert "--kind: invalid choice: 'slower'" in err and "output" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "b").exists()


def chain_with_outputs(folder, count, slow_from, changed_from):
    """The stand-in interpreter's chain, whose turns also record one adapter's greedy-output
    digest beside their results: another from ``changed_from`` on."""
    fake = write_fake_python(folder)
    lines = []
    for i in range(count):
        wrapper = folder / f"env{i}"
        scale, digest = 1.3 if i >= slow_from else 1.0, "changed" if i >= changed_from else "first"
        wrapper.write_text(
            f'#!/bin/sh\nFAKE_SCALE={scale} "{fake}" "$@" || exit $?\nprevious=""\nfor arg in "$@"; do\n'
            '  [ "$previous" = --bench-output ] && printf "model,device_type,adapter,digest\\n'
            f'm,cpu,a1,{digest}\\n" > "${{arg%.csv}}.digests.csv"\n  previous="$arg"\ndone\nexit 0\n'
        )
        wrapper.chmod(0o755)
        lines.append(f"{wrapper} nightly-{i}")
    (folder / "envs.txt").write_text("\n".join(lines) + "\n")
    return folder / "envs.txt"


def test_real_ab_sessions_record_what_they_found_and_a_changed_output_does_not_steer_a_slowdown(
    tmp_path, monkeypatch, capsys
):
    """nightly-1 answers differently, nightly-2 also runs slower: through real ab sessions
    (each exits 1), the slowdown is nightly-2's."""
    envs, out = chain_with_outputs(tmp_path, 3, slow_from=2, changed_from=1), tmp_path / "bisect"
    done = bisect_here(monkeypatch, capsys, "--envs", envs, "--out", out, "--pairs", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "first slower environment: nightly-2 (after nightly-1), 3 sessions" in done.stdout, done.stdout
    assert json.loads((out / "bisect.json").read_text())["verdicts"] == {"0": GOOD, "2": BAD, "1": GOOD}
    found = json.loads((out / "step-001" / "ab.json").read_text())["found"]
    assert found["output"] == 1 and found["slowdown"] == 0, found
    assert "OUTPUT CHANGED: adapter a1" in (out / "step-001" / "comparison.txt").read_text()
