"""``lorabench bundle``: a run's files in one archive, settings kept and credentials hidden, bad input exits 2."""

from __future__ import annotations

import json
import tarfile

import pytest

from lorabench.cli.main import main
from lorabench.host.redact import is_secret_name, redact_tree, scrub_text
from lorabench.results.files import ResultWriter
from tests.helpers import make_row, make_sample


@pytest.fixture(autouse=True)
def _platform_known(monkeypatch):
    """The doctor's view in a bundle, without its seconds-long probe of vLLM's platform
    (tests/test_doctor.py runs that one)."""
    from lorabench.host import doctor as doctor_host

    monkeypatch.setattr(doctor_host, "probe_platform", lambda environ: doctor_host.Probe("cpu"))


@pytest.fixture
def run(tmp_path, tiny_config):
    """A finished run: one row with its samples, an engine log and the config kept at its start."""
    writer = ResultWriter(tmp_path / "results", None, "abc12345", False)
    writer.keep_config(
        tiny_config(env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "hf_in_config"}, engine={"hf_token": "hf_arg_1"}),
        "run-1",
    )
    writer.append(make_row(), [make_sample()])
    # vLLM logs its non-default arguments; a server's log may show the shell's token too.
    log = "INFO engine started\nINFO non-default args: {'hf_token': 'hf_arg_1', 'seed': 0}\nGET ?t=hf_secret 1\n"
    (writer.log_dir / "loras2-rank16-cpu4-build0.log").write_text(log)
    replays = writer.path.with_name(writer.path.stem + ".replays")
    replays.mkdir()
    (replays / "timeline.csv").write_text("t_s,kv_usage\n0.0,0.5\n")
    return writer


def members(path) -> dict[str, str]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


def test_a_bundle_holds_the_run_and_hides_its_secrets(run, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("MY_API_KEY", "key-of-mine")
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", str(run.path), "--out", str(out)]) == 0
    stem = run.path.stem
    files = members(out)
    assert set(files) == {
        f"{stem}/{stem}.csv",
        f"{stem}/{stem}.samples.csv",
        f"{stem}/{stem}.replays/timeline.csv",
        f"{stem}/logs/loras2-rank16-cpu4-build0.log",
        f"{stem}/logs/config.json",
        f"{stem}/logs/config.source",
        f"{stem}/logs/config.run",
        f"{stem}/doctor.txt",
        f"{stem}/environment.json",
    }
    assert json.loads(files[f"{stem}/logs/config.json"])["model"] == "builtin:tiny-llama"
    assert "resolves: 4 adapters" in files[f"{stem}/doctor.txt"]
    environment = json.loads(files[f"{stem}/environment.json"])
    assert environment["VLLM_CPU_KVCACHE_SPACE"] == "1"
    everything = "".join(files.values())
    assert "hf_secret" not in everything and "hf_in_config" not in everything and "hf_arg" not in everything
    assert "key-of-mine" not in everything
    assert "{'hf_token': '(redacted)', 'seed': 0}" in files[f"{stem}/logs/loras2-rank16-cpu4-build0.log"]
    kept = json.loads(files[f"{stem}/logs/config.json"])
    assert kept["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "(redacted)"}
    assert kept["engine"]["hf_token"] == "(redacted)" and kept["engine"]["max_loras"] == [1, 2]
    assert f"{stem}/doctor.txt" in capsys.readouterr().out


def test_a_bundle_keeps_settings_named_like_secrets_and_hides_credentials(tmp_path, tiny_config, monkeypatch):
    """Finding 9 of issue 27: ``tokenizer`` and ``max_num_batched_tokens`` matched a name
    pattern for secrets, so the model path and 131072 became '(redacted)' in every log, and
    every variable off a fixed list (VLLM_USE_V1) in the config and the environment."""
    monkeypatch.setenv("VLLM_USE_V1", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    engine = {"tokenizer": "/models/x", "max_num_batched_tokens": 131072, "api_key": "served-key-1"}
    writer = ResultWriter(tmp_path / "results", None, "abc12345", False)
    writer.keep_config(tiny_config(env={"VLLM_USE_V1": "1", "HF_TOKEN": "hf_abc"}, engine=engine), "run-1")
    writer.append(make_row(), [make_sample()])
    log = (
        "INFO vllm serve --tokenizer /models/x --api-key served-key-1 --max-num-batched-tokens 131072\n"
        "INFO non-default args: {'tokenizer': '/models/x', 'max_num_batched_tokens': 131072}\n"
        "DEBUG env HF_TOKEN=hf_abc VLLM_USE_V1=1\n"
        "DEBUG request headers: Authorization: Bearer x\n"
        "INFO pulling from https://user:pw@host/models/x\n"
    )
    (writer.log_dir / "serve-build0.log").write_text(log)
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", str(writer.path), "--out", str(out)]) == 0
    files = members(out)
    stem = writer.path.stem
    kept = files[f"{stem}/logs/serve-build0.log"]
    assert "--tokenizer /models/x" in kept and "--max-num-batched-tokens 131072" in kept
    assert "{'tokenizer': '/models/x', 'max_num_batched_tokens': 131072}" in kept
    assert "HF_TOKEN=(redacted) VLLM_USE_V1=1" in kept and "--api-key (redacted)" in kept
    assert "Authorization: (redacted)" in kept and "https://(redacted)@host/models/x" in kept
    everything = "".join(files.values())
    assert "hf_abc" not in everything and "served-key-1" not in everything and "pw@" not in everything
    assert "Bearer x" not in everything
    config = json.loads(files[f"{stem}/logs/config.json"])
    assert config["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_V1": "1", "HF_TOKEN": "(redacted)"}
    assert config["engine"]["tokenizer"] == "/models/x" and config["engine"]["max_num_batched_tokens"] == 131072
    assert config["engine"]["api_key"] == "(redacted)"
    environment = json.loads(files[f"{stem}/environment.json"])
    assert environment["VLLM_USE_V1"] == "1" and environment["TOKENIZERS_PARALLELISM"] == "false"
    assert environment["HF_TOKEN"] == "(redacted)"


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY", "hf_token", "api_key", "apiKey"]
    + ["Authorization", "X-Api-Key", "DB_PASSWORD", "client_secret", "token", "--api-key"],
)
def test_credential_names_are_secret(name):
    assert is_secret_name(name)
    assert scrub_text(f"{name}=abcdef1 next=1") == f"{name}=(redacted) next=1"


@pytest.mark.parametrize(
    "name",
    ["tokenizer", "max_num_batched_tokens", "VLLM_USE_V1", "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD", "HF_TOKEN_PATH"]
    + ["TOKENIZERS_PARALLELISM", "max_tokens", "skip_tokenizer_init", "cache_key"],
)
def test_settings_are_not_secret(name):
    assert not is_secret_name(name)
    assert scrub_text(f"{name}=/models/abcdef1") == f"{name}=/models/abcdef1"


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("token hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345 used", "token (redacted) used"),
        ("key sk-proj-abcdefghijklmnop1234", "key (redacted)"),
        ('-H "Authorization: Basic dXNlcjpwdw=="', '-H "Authorization: (redacted)"'),
        ("headers={'Authorization': 'Bearer abc'}", "headers={'Authorization': '(redacted)'}"),
        ("sent Bearer abc.def", "sent Bearer (redacted)"),
        ("git clone https://ghp_abc@github.com/o/r", "git clone https://(redacted)@github.com/o/r"),
        ("HF_HUB_DISABLE_IMPLICIT_TOKEN=1 the hf_config", "HF_HUB_DISABLE_IMPLICIT_TOKEN=1 the hf_config"),
        ("GET /v1/models?token=abc&x=1", "GET /v1/models?token=(redacted)&x=1"),
    ],
)
def test_credentials_are_told_by_their_shape(text, scrubbed):
    assert scrub_text(text) == scrubbed


def test_a_config_keeps_every_setting(tmp_path):
    config = {"engine": {"tokenizer": "/m", "hf_token": "hf_q", "enforce_eager": True}, "env": {"VLLM_API_KEY": "k"}}
    config["urls"] = ["https://u:p@h/x"]
    assert redact_tree(config) == {
        "engine": {"tokenizer": "/m", "hf_token": "(redacted)", "enforce_eager": True},
        "env": {"VLLM_API_KEY": "(redacted)"},
        "urls": ["https://(redacted)@h/x"],
    }


def test_a_run_that_finished_nothing_is_bundled_from_its_logs_folder(tmp_path):
    logs = tmp_path / "20261124T000000Z-abc.logs"
    logs.mkdir()
    (logs / "lora-off-build0.log").write_text("RuntimeError: out of memory\n")
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", str(logs), "--out", str(out)]) == 0
    assert "20261124T000000Z-abc/logs/lora-off-build0.log" in members(out)


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("missing.csv", "no such file"),
        ("other.csv", "not a lorabench result file"),
        ("folder", "not a run's logs folder"),
        ("run.samples.csv", "a run's samples file; give its result file, "),
    ],
)
def test_bad_input_exits_2_and_says_why(tmp_path, capsys, what, message):
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "run.samples.csv").write_text("run_id,scenario,engine_id\nr,multilora,e\n")  # what a samples file has
    (tmp_path / "folder").mkdir()
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", str(tmp_path / what), "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "b.tar.gz.tmp").exists()


def test_the_bundle_never_overwrites_the_run_and_says_what_it_lacks(run, tmp_path, capsys):
    assert main(["bundle", str(run.path), "--out", str(run.path)]) == 2
    assert main(["bundle", str(run.path), "--out", str(run.log_dir / "b.tar.gz")]) == 2
    assert "one of the run's own files or folders" in capsys.readouterr().err
    assert run.path.read_text().startswith("timestamp,")
    lone = tmp_path / "elsewhere" / run.path.name
    lone.parent.mkdir()
    lone.write_text(run.path.read_text())
    assert main(["bundle", str(lone), "--out", str(tmp_path / "lone.tar.gz")]) == 0
    assert "no engine logs or config: no <run>.logs folder beside it (--logs DIR)" in capsys.readouterr().out


def test_a_numeric_credential_in_a_config_is_hidden_and_a_flag_is_kept():
    # A JSON config's "api_key": 12345678901 is a number, not a flag: it leaked as it stood.
    tree = redact_tree({"api_key": 12345678901, "pin_password": 4.5e9, "hf_token": True, "use_auth_token": 1})
    assert tree == {"api_key": "(redacted)", "pin_password": "(redacted)", "hf_token": True, "use_auth_token": 1}


@pytest.mark.parametrize("quote", ["'", '"'])
def test_a_quoted_credential_with_spaces_is_hidden_whole(quote):
    # password: "my long pass" hid "my" and left "long pass" in the log.
    text = f"password: {quote}my long pass{quote}, next={quote}kept value{quote}"
    assert scrub_text(text) == f"password: {quote}(redacted){quote}, next={quote}kept value{quote}"
    assert scrub_text('{"Authorization": "Bearer abc def"}') == '{"Authorization": "(redacted)"}'


def test_a_run_written_with_bench_output_bundles_its_logs(tmp_path, tiny_config, capsys):
    """``--bench-output results/first.csv`` put its logs in results/<time>-<commit>.logs, and
    its bundle had no engine log and no config (docs/npu.md's bundle did just that)."""
    fixed = tmp_path / "results" / "first.csv"
    writer = ResultWriter(tmp_path / "results", fixed, "abc12345", False)
    writer.keep_config(tiny_config(), "run-1")
    writer.append(make_row(), [make_sample()])
    (writer.log_dir / "loras2-rank16-cpu4-build0.log").write_text("INFO engine started\n")
    assert writer.log_dir == tmp_path / "results" / "first.logs"
    assert main(["bundle", str(fixed), "--out", str(tmp_path / "b.tar.gz")]) == 0
    names = members(tmp_path / "b.tar.gz")
    assert any(n.endswith("loras2-rank16-cpu4-build0.log") for n in names), sorted(names)
    assert "no engine logs" not in capsys.readouterr().out
