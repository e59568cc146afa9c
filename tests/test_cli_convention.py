"""The command line's one convention (docs/cli.md#exit-status), walked over every
subcommand the parser has: bad input exits 2 with one line on stderr and no traceback,
--help exits 0, every option has help without markup and shows its default, and an option
name means one thing in every subcommand that has it.

The subcommands come from the parser itself, so a new one without a bad-input case here
fails ``test_every_subcommand_has_a_bad_input_case``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata

import pytest

from lorabench.cli.main import BAD_INPUT, build_parser, main
from tests.helpers import ROOT


def parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under ``parser`` (itself first), by its words after ``lorabench``."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


def subcommands() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """The parsers that run something: those without subcommands of their own."""
    return {
        path: p
        for path, p in parsers(build_parser())
        if path and not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
    }


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options a user reads about: not -h, --version or the hidden old spellings."""
    return [
        a
        for a in parser._actions
        if a.help != argparse.SUPPRESS
        and not isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))
    ]


# One bad input a subcommand meets before it does anything: a file that is not there.
BAD_INPUT_CASES = {
    ("ab",): ["--base-python", "{tmp}/no/python", "--new-python", "{tmp}/no/python", "--out", "{tmp}/ab"],
    ("adapters", "generate"): ["--base", "{tmp}/no-model", "--out", "{tmp}/adapters"],
    ("compare",): ["{tmp}/base.csv", "{tmp}/new.csv"],
    ("report",): ["{tmp}/run.csv", "--out", "{tmp}/page"],
    ("trace", "generate"): ["--out", "{tmp}/t.jsonl", "-n", "2", "-R", "1", "--adapters", "{tmp}/adapters.json"],
    ("trace", "stats"): ["{tmp}/t.jsonl"],
    ("trace", "import"): ["azure", "{tmp}/azure.csv", "--out", "{tmp}/t.jsonl"],
    ("doctor",): ["--config", "{tmp}/config.json"],
    ("bundle",): ["{tmp}/run.csv", "--out", "{tmp}/run.tar.gz"],
    ("serve-command",): ["--config", "{tmp}/config.json"],
    ("bisect",): ["--envs", "{tmp}/envs.txt", "--out", "{tmp}/bisect"],
    ("history", "add"): ["--db", "{tmp}/h.db", "{tmp}/run.csv"],
    ("history", "accept"): ["--db", "{tmp}/h.db", "-k", "bs8", "--reason", "dropped"],
    ("history", "show"): ["--db", "{tmp}/h.db"],
    ("history", "check"): ["--db", "{tmp}/h.db"],
    ("history", "report"): ["--db", "{tmp}/h.db", "--out", "{tmp}/page"],
}


def test_every_subcommand_has_a_bad_input_case():
    assert sorted(subcommands()) == sorted(BAD_INPUT_CASES)


def assert_bad_input(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert main(argv) == BAD_INPUT, argv
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err, (argv, out, err)
    assert err.startswith("lorabench") and err.count("\n") == 1, (argv, err)


@pytest.mark.parametrize("path", sorted(BAD_INPUT_CASES), ids=" ".join)
def test_bad_input_exits_2_with_one_line(path, tmp_path, capsys):
    assert_bad_input(capsys, [*path, *(arg.format(tmp=tmp_path) for arg in BAD_INPUT_CASES[path])])


@pytest.mark.parametrize("path", sorted(BAD_INPUT_CASES), ids=" ".join)
def test_an_unknown_option_exits_2_with_one_line(path, capsys):
    """argparse's own errors printed the usage first: one line now, as every bad input."""
    assert_bad_input(capsys, [*path, "--no-such-option"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "{run}", "--out", "{file}"], "lorabench report: --out {file}: a file is there; give a folder"),
        (["compare", "{run}", "{run}", "--report", "{file}"], "lorabench compare: --report {file}: a file is there"),
        (
            ["compare", "{run}", "{run}", "--plot", "{tmp}/no/x.png"],
            "lorabench compare: --plot {tmp}/no/x.png: no folder",
        ),
    ],
)
def test_an_output_path_that_cannot_be_written_is_bad_input(tmp_path, capsys, args, message):
    """They were tracebacks with exit 1, the plot's after the comparison was printed."""
    names = {"run": ROOT / "tests" / "data" / "default-run.csv", "file": tmp_path / "a-file", "tmp": tmp_path}
    (tmp_path / "a-file").write_text("")
    assert_bad_input(capsys, [arg.format(**names) for arg in args])
    assert main([arg.format(**names) for arg in args]) == BAD_INPUT
    assert message.format(**names) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["compare", "{run}", "{run}", "--noise-from", "{tmp}/gone"],
            "--noise-from {tmp}/gone: no such file or folder",
        ),
        (["compare", "a", "b", "--results-dir", "{tmp}/gone"], "--results-dir {tmp}/gone: no such folder"),
        (["trace", "generate", "--out", "{tmp}/no/t.jsonl", "-n", "2", "-R", "1"], "--out {tmp}/no/t.jsonl: No such"),
        (["bisect", "--envs", "{tmp}/gone", "--out", "{tmp}/b"], "one interpreter or environment a line, oldest first"),
        (["adapters", "generate", "--base", "{readme}", "--out", "{tmp}/a"], "give --base a model folder"),
    ],
)
def test_a_bad_input_line_names_what_was_given_and_the_fix(tmp_path, capsys, args, message):
    """A new user's: --noise-from said "1 result file there" of a file that did not exist, a
    missing --results-dir said no run was in it, trace generate named its temporary file, and
    two lines gave no fix."""
    names = {"run": ROOT / "tests" / "data" / "default-run.csv", "readme": ROOT / "README.md", "tmp": tmp_path}
    assert_bad_input(capsys, [arg.format(**names) for arg in args])
    assert main([arg.format(**names) for arg in args]) == BAD_INPUT
    assert message.format(**names) in capsys.readouterr().err


def test_a_config_with_several_problems_is_one_line_each(tmp_path, capsys):
    """serve-command printed them under a heading, indented: one line each, as under pytest."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": 3}')
    assert main(["serve-command", "--config", str(bad)]) == BAD_INPUT
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) > 1 and all(line.startswith(f"lorabench serve-command: {bad}: ") for line in lines), lines


def test_help_exits_0_without_markup(capsys):
    for path, _ in parsers(build_parser()):
        assert main([*path, "--help"]) == 0, path
        out = capsys.readouterr().out
        assert out.startswith("usage: lorabench") and "``" not in out, (path, out)


def test_every_option_has_help_without_markup_and_shows_its_default():
    for path, parser in parsers(build_parser()):
        assert "``" not in (parser.description or ""), path
        formatter = parser._get_formatter()
        for action in options(parser):
            where = f"lorabench {' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
            assert action.help, f"{where}: no help"
            assert "``" not in action.help, f"{where}: markup in its help"
            default = action.default
            if default is not None and default is not False and default != [] and action.option_strings:
                assert "default" in formatter._expand_help(action), f"{where}: default {default!r} not shown"


def test_an_option_name_means_one_thing_in_every_subcommand():
    """`trace generate --adapters` took a file and `trace import --adapters` a number."""
    seen: dict[str, dict[tuple, list[str]]] = {}
    for path, parser in subcommands().items():
        for action in options(parser):
            choices = tuple(action.choices) if action.choices else None
            # A type by its name, not its identity: a module imported again (tests that break an
            # import take lorabench's modules out of sys.modules) makes a second `seed` function.
            kind = f"{getattr(action.type, '__module__', '')}.{getattr(action.type, '__qualname__', action.type)}"
            meaning = (action.dest, kind, action.nargs, choices, type(action).__name__, action.metavar)
            for option in action.option_strings:
                seen.setdefault(option, {}).setdefault(meaning, []).append(" ".join(path))
    differing = {option: meanings for option, meanings in seen.items() if len(meanings) > 1}
    assert not differing, differing


def test_version_names_lorabench_and_vllm_without_importing_vllm():
    code = "import sys; from lorabench.cli.main import main; main(['--version']); print('vllm' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    version, imported = done.stdout.splitlines()
    assert version.startswith(f"lorabench {metadata.version('pytest-lorabench')}; "), version
    assert " vllm" in version and imported == "False", done.stdout


def test_pytest_bench_with_a_bad_config_exits_2_one_line_a_problem(tmp_path):
    """pytest's usage error exited 4; lorabench's bad input is 2 under pytest too."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": 3}')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "pytest", "bench", "--bench-config", str(bad), "-p", "no:cacheprovider", "-q"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == BAD_INPUT, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines and all(line.startswith(f"lorabench: {bad}: ") for line in lines), done.stderr
    assert "field 'model' has bad value 3" in done.stderr and "Traceback" not in done.stdout + done.stderr


def test_pytest_options_show_their_defaults_without_markup():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, cwd=ROOT, env=env, check=True
    )
    group = done.stdout.split("multi-LoRA benchmarks on vLLM:")[1].split("\n\n")[0]
    assert "--bench-config=PATH" in group and "(default: config/common.json)" in " ".join(group.split())
    assert "``" not in group
