"""What an engine's processes said when it failed: the line that names the reason."""

from __future__ import annotations

from lorabench.host.processes import root_cause


def test_the_root_cause_of_an_exception_whose_message_starts_on_the_next_line():
    log = (
        "RuntimeError: \n"
        "        An attempt has been made to start a new process before the\n"
        "        current process has finished its bootstrapping phase.\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert root_cause(log) == "RuntimeError: An attempt has been made to start a new process before the"
    assert root_cause("ValueError: rank 24 is not supported\n") == "ValueError: rank 24 is not supported"
