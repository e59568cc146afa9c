"""The fleet on a Ray cluster: Ray's own test cluster (``ray.cluster_utils.Cluster``), two
nodes of two "NPU" each, running the stand-in engine, which says it is on an NPU.

The cluster takes about 10 s to start and the timing test runs its grid twice, so these
tests are in the slow tier (``pytest -m engine``); the bad input that needs no cluster is
in the quick loop."""

import sys
from fnmatch import fnmatch
from pathlib import Path

import pandas as pd
import pytest

from lorabench.analysis.compare.load import keyed
from lorabench.fleet.ray_cluster import RayInputError, import_ray
from lorabench.targets.standin import write_config
from tests.helpers import ROOT, default_config, result_files

ON_AN_NPU = """
import os, signal, time
from pathlib import Path
import pytest
from lorabench.host.device import Platform
from lorabench.targets.standin import StandIn


class OnAnNpu(StandIn):
    \"\"\"Serves on the virtual clock, but each build takes {wall_build_s} s of the wall clock,
    its start and end appended to {builds_log!r}.\"\"\"

    def platform(self):
        return Platform("npu", "stand-in NPU")

    def engine(self, *args):
        engine = super().engine(*args)
        build = engine._build

        async def _build():
            started = time.time()
            time.sleep({wall_build_s})
            with open({builds_log!r}, "a") as log:
                log.write(f"{{started}} {{time.time()}}\\n")
            return await build()

        engine._build = _build
        return engine


def pytest_lorabench_backend(config):
    return OnAnNpu(virtual_clock=True)


KILL_ONCE = {kill!r}
SEEN = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    engine = item.callspec.params["engine"].id
    SEEN.append(engine)
    marker = Path(item.config.rootpath) / f"killed-{{engine}}"
    if item.config.getoption("bench_fleet_worker") and engine == KILL_ONCE and SEEN.count(engine) == 2:
        if not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("recorded", [None, "127.0.0.1:1"], ids=["none", "dead"])
@pytest.mark.timeout(60)  # a ray.init retrying a dead head for minutes fails here, not hangs the loop
def test_auto_without_a_cluster_says_how_to_start_or_name_one(pytester, monkeypatch, tmp_path, recorded):
    """Before the module's cluster starts (file order): auto finds a cluster running on this
    host. Ray's temp folder is the test's own, empty or recording a head that died without
    `ray stop` (there ray.init retried for minutes)."""
    pytest.importorskip("ray", reason="Ray is the [fleet] extra: pip install -e '.[fleet]'")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    if recorded:
        (tmp_path / "ray").mkdir()
        (tmp_path / "ray" / "ray_current_cluster").write_text(recorded)
    config = _bench(pytester)
    # In process: a subprocess spent ~2 s importing Ray and the plugin again. A failed join
    # leaves no Ray state here (not ray.is_initialized(), no thread, no child process).
    result = pytester.runpytest("--bench-config", config, "--bench-fleet", "auto")
    assert result.ret == 2
    if not recorded:
        assert result.errlines[-1:] == [
            "lorabench: --bench-fleet auto: no Ray cluster runs here or at RAY_ADDRESS; start one (ray start --head) "
            "or name it: --bench-fleet ray://HEAD:10001, or RAY_ADDRESS=HEAD:6379 with auto"
        ]
    else:  # Ray names this host by its address, not 127.0.0.1
        assert len(result.errlines) and fnmatch(
            result.errlines[-1],
            "lorabench: --bench-fleet auto: the Ray cluster recorded at *:1 (RAY_ADDRESS, or Ray's "
            "/tmp/ray/ray_current_cluster) does not answer: stopped without `ray stop`? Run ray stop, then start one "
            "(ray start --head) or name a live one: --bench-fleet ray://HEAD:10001",
        ), result.errlines[-1:]


@pytest.fixture(scope="module")
def cluster():
    """Two worker nodes of 2 NPU each beside a head with none: 4 fake devices."""
    pytest.importorskip("ray", reason="Ray is the [fleet] extra: pip install -e '.[fleet]'")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(2):
        cluster.add_node(num_cpus=2, resources={"NPU": 2})
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.fixture
def on_the_cluster(cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    # The acl module Ray asks for the NPU's name is CANN's; without it Ray logs a traceback, harmlessly.
    monkeypatch.setenv("RAY_LOG_TO_STDERR", "0")
    return cluster


def _bench(pytester, wall_build_s=0, kill="", **matrix):
    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
    log = str(pytester.path / "builds.log")
    pytester.makeconftest(ON_AN_NPU.format(wall_build_s=wall_build_s, kill=kill, builds_log=log))
    engine = {"max_loras": [1, 2, 3, 4], "max_cpu_loras": 4}
    return write_config(pytester.path, engine=engine, matrix={"batch_sizes": [2], "workloads": ["distinct"], **matrix})


def build_times(log: Path) -> list[tuple[float, float]]:
    """Each build's (start, end) on the wall clock, as the stand-in wrote them."""
    return [(float(a), float(b)) for a, b in (line.split() for line in log.read_text().splitlines())]


def most_at_once(builds: list[tuple[float, float]]) -> int:
    """The most builds in progress at one moment."""
    events = sorted([(start, 1) for start, _ in builds] + [(end, -1) for _, end in builds])
    running = peak = 0
    for _, step in events:  # an end sorts before a start at the same moment
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.engine
def test_eight_configurations_on_four_npus_run_four_at_a_time(pytester, on_the_cluster):
    """Each build takes 15 s of the wall clock (an engine on an NPU takes about a minute);
    everything else runs on the stand-in's virtual clock. The builds' own start and end
    times say that four ran at once, never more, and that all eight took two waves: under
    three builds' time from the first start to the last end, whatever this host's process
    start-up costs. (A worker's fixed cost, four at once on two cores, was 3-7 s a task on
    the Intel Xeon host, docs/lab/2026-11-measurements.md: well inside a build.) Then the
    same session without the fleet or the sleeps runs the same cases."""
    build_s = 15
    config = _bench(pytester, wall_build_s=build_s, builds=2)
    fleet = pytester.runpytest_subprocess("--bench-config", config, "--bench-fleet", "auto", timeout=600)
    assert fleet.ret == 0, fleet.stdout.str()
    fleet.stdout.fnmatch_lines(["fleet: 8 engine builds on the Ray cluster (auto)*"])
    builds = build_times(pytester.path / "builds.log")
    span = max(end for _, end in builds) - min(start for start, _ in builds)
    assert len(builds) == 8 and most_at_once(builds) == 4 and span < 3 * build_s, builds
    (pytester.path / "results").rename(pytester.path / "fleet-results")
    sequential = pytester.runpytest_subprocess("--bench-config", _bench(pytester, builds=2), timeout=600)
    assert sequential.ret == 0, sequential.stdout.str()

    (csv,) = result_files(pytester.path / "fleet-results")
    rows, seq = pd.read_csv(csv), pd.read_csv(result_files(pytester.path / "results")[0])
    assert len(rows) == len(seq) == 8 and rows["run_id"].nunique() == 1

    def keys(frame):
        return sorted(keyed(frame)["_key"] + frame["build"].astype(str))

    assert keys(rows) == keys(seq)
    # Each ran on one NPU of one of the two nodes, and all four NPUs were used.
    assert rows["fleet_devices"].str.fullmatch(r"\S+:[0-9a-f]{8} npu [01]").all()
    assert rows["fleet_devices"].value_counts().tolist() == [2, 2, 2, 2]


@pytest.mark.engine
def test_a_worker_killed_on_a_node_loses_no_row_and_its_configuration_runs_again(pytester, on_the_cluster):
    config = _bench(pytester, kill="loras1-rank8-cpu4-build0", batch_sizes=[2, 4])
    result = pytester.runpytest_subprocess("--bench-config", config, "--bench-fleet", "auto", timeout=300)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*loras1-rank8-cpu4-build0: its worker on * was killed by SIGKILL*queued again*"])
    rows = pd.read_csv(result_files(pytester.path / "results")[0])
    cases = rows.groupby("engine_id")["test_id"].agg(list)
    assert len(cases) == 4 and all(len(c) == len(set(c)) == 2 for c in cases)


@pytest.mark.engine
def test_an_engine_wider_than_any_node_is_refused(pytester, on_the_cluster):
    config = _bench(pytester)
    config.write_text(config.read_text().replace('"max_num_seqs": 16', '"max_num_seqs": 16, "tensor_parallel_size": 3'))
    result = pytester.runpytest_subprocess("--bench-config", config, "--bench-fleet", "auto", timeout=120)
    assert result.ret == 2
    assert result.errlines[-1:] == [
        "lorabench: --bench-fleet auto: each engine needs 3 NPU (engine.tensor_parallel_size x pipeline_parallel_size) "
        "and no node of the cluster has more than 2; declare them when starting its nodes (ray start --resources "
        "'{\"NPU\": 8}') or lower the engine's"
    ]


def test_a_ray_address_where_nothing_answers_is_bad_input(pytester):
    config = _bench(pytester)
    result = pytester.runpytest("--bench-config", config, "--bench-fleet", "ray://127.0.0.1:1")
    assert result.ret == 2
    result.stderr.fnmatch_lines(
        ["lorabench: --bench-fleet ray://127.0.0.1:1: nothing answers there (*); give the head's*"]
    )
    assert not (pytester.path / "results").exists()


def test_without_ray_the_option_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(RayInputError, match=r"Ray is not installed in this environment; install it with pip install"):
        import_ray("auto")


@pytest.mark.engine
def test_a_real_cpu_engine_runs_as_a_ray_task(pytester, on_the_cluster):
    """The real vLLM on the test cluster: the default config's case as a task asking for one
    of a node's CPUs, its row in the run with the node named."""
    pytester.makepyfile(test_multilora=(ROOT / "bench" / "test_multilora.py").read_text())
    selection = [
        "--bench-config",
        default_config(pytester.path),
        "--bench-builds",
        "1",
        "-k",
        "identical and bs4 and loras2",
    ]
    result = pytester.runpytest_subprocess(*selection, "--bench-fleet", "auto", timeout=600)
    result.assert_outcomes(passed=1)
    rows = pd.read_csv(result_files(pytester.path / "results")[0])
    assert list(rows["engine_id"]) == ["loras2-rank16-cpu12-build0"] and (rows["e2e_ms"] > 0).all()
    assert rows["fleet_devices"].str.fullmatch(r"\S+:[0-9a-f]{8} cpu").all()
