# The lorabench plugin itself is registered through the pytest11 entry point of the
# installed package; pytester is for the plugin's own tests in tests/.
import pytest

pytest_plugins = ["pytester"]

# `pytest` alone, the quick loop, runs on this many pytest-xdist workers (docs/measurements.md).
QUICK_LOOP_WORKERS = 2


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the number
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`pytest` alone runs the quick loop on 2 workers: on a 2-core host about half its time
    serially. Only then: a file or test named on the command line runs in this process, as
    do `pytest -m engine` (real engines take every core each; two at once would time each
    other) and `pytest bench` (benchmark cases refuse xdist). `-n 0` runs it serially."""
    quick_loop = (
        not hasattr(config, "workerinput")  # a worker's own command line is empty, as `pytest` alone's
        and config.args_source is pytest.Config.ArgsSource.TESTPATHS
        and config.option.markexpr == "not engine"
        and config.pluginmanager.hasplugin("xdist")
    )
    if quick_loop and config.option.numprocesses is None and not config.option.usepdb:
        config.option.numprocesses = QUICK_LOOP_WORKERS
