import importlib.abc
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from lorabench.cli import main as cli
from lorabench.config import ConfigError, EngineSpec, engine_specs, online_cases, read_config_file, resolve_config
from lorabench.load import builtin
from lorabench.load.adapters import GENERATOR_VERSION
from lorabench.targets.vllm_args import engine_arg_names
from tests.helpers import write_json


def load(path: Path, needs_lora: bool = True, output: str | None = None):
    return resolve_config(
        path, read_config_file(path), needs_lora=needs_lora, output=output, engine_args=engine_arg_names
    )


def problems_of(path: Path, needs_lora: bool = True) -> str:
    with pytest.raises(ConfigError) as info:
        load(path, needs_lora)
    return str(info.value)


def test_engine_specs_are_the_cross_product_with_readable_ids(tiny_config):
    parsed = read_config_file(tiny_config(engine={"max_loras": [1, 2], "max_lora_rank": [8, 16], "max_cpu_loras": 4}))
    specs = engine_specs(parsed, with_lora_off=True)
    assert [s.id for s in specs] == [
        "lora-off-build0",
        "loras1-rank8-cpu4-build0",
        "loras1-rank16-cpu4-build0",
        "loras2-rank8-cpu4-build0",
        "loras2-rank16-cpu4-build0",
    ]
    assert specs[0] == EngineSpec(enable_lora=False)


def test_max_cpu_loras_defaults_to_max_loras(tiny_config):
    parsed = read_config_file(tiny_config(engine={"max_loras": 3, "max_lora_rank": 16, "max_cpu_loras": None}))
    assert [s.id for s in engine_specs(parsed, with_lora_off=False)] == ["loras3-rank16-cpu3-build0"]


def test_relative_paths_resolve_against_the_config_folder(tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    model = tmp_path / "models" / "m"
    write_json(model / "config.json", {"max_position_embeddings": 64})
    (model / "model.safetensors").write_bytes(b"")
    adapter = tmp_path / "loras" / "a"
    write_json(adapter / "adapter_config.json", {"r": 8})
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    write_json(tmp_path / "loras" / "adapters.json", [{"name": "a", "path": "a", "prompt": "hi"}])
    write_json(tmp_path / "cfg" / "prompts.json", ["p"])
    path = write_json(
        tmp_path / "cfg" / "common.json",
        {
            "model": "../models/m",
            "adapters": "../loras/adapters.json",
            "prompts": "prompts.json",
            "results_dir": "../out",
            "output": "fixed.csv",
            "engine": {"max_loras": 1, "max_lora_rank": 8},
            "matrix": {"batch_sizes": [1], "workloads": ["identical"], "output_len": 2, "input_len": 8},
        },
    )
    config = load(path)
    assert config.model == model
    assert config.adapters[0].path == adapter and config.adapters[0].prompt == "hi"
    assert config.results_dir == tmp_path / "out"
    assert config.output == tmp_path / "cfg" / "fixed.csv"
    assert not config.is_builtin_model
    assert "load_format" not in config.llm_kwargs(EngineSpec(False))
    # --bench-output is relative to where pytest runs, not to the config
    assert load(path, output="x.csv").output == Path("/x.csv")


def test_builtin_model_and_generated_adapters(tiny_config):
    config = load(tiny_config())
    assert config.is_builtin_model and (config.model / "config.json").is_file()
    assert [a.name for a in config.adapters] == [
        "dummy-lora-rank-8-0",
        "dummy-lora-rank-16-0",
        "dummy-lora-rank-8-1",
        "dummy-lora-rank-16-1",
    ]
    assert all((a.path / "adapter_model.safetensors").is_file() for a in config.adapters)
    kwargs = config.llm_kwargs(EngineSpec(True, 2, 16, 4))
    # The built-in model ships real (random) weights, so vLLM loads them: no dummy loader.
    assert "load_format" not in kwargs and (config.model / "model.safetensors").is_file()
    assert kwargs["disable_log_stats"] is False and kwargs["enable_prefix_caching"] is False, "off unless asked"
    assert (kwargs["max_loras"], kwargs["max_lora_rank"], kwargs["max_cpu_loras"]) == (2, 16, 4)
    assert config.llm_kwargs(EngineSpec(False))["enable_lora"] is False
    assert "max_loras" not in config.llm_kwargs(EngineSpec(False))


def test_prefix_caching_is_a_configuration_of_its_own_and_off_unless_asked(tiny_config):
    """A list crosses the LoRA knobs, as the graph-mode settings do: each configuration named
    with -pc where caching is on, and vLLM told either way."""
    config = load(tiny_config(engine={"max_loras": 2, "enable_prefix_caching": [False, True]}))
    specs = engine_specs(config.file, with_lora_off=True)
    assert [s.name for s in specs] == ["lora-off", "loras2-rank16-cpu4", "lora-off-pc", "loras2-rank16-cpu4-pc"]
    assert [config.llm_kwargs(s)["enable_prefix_caching"] for s in specs] == [False, False, True, True]
    assert not any(s.enable_prefix_caching for s in engine_specs(load(tiny_config()).file, with_lora_off=True))


def test_comment_keys_are_ignored(tiny_config):
    path = tiny_config(**{"//": "a note"}, matrix={"//rounds": "why three", "rounds": 3})
    assert read_config_file(path).matrix.rounds == 3


def test_json_syntax_error_names_line_and_column(tmp_path):
    path = tmp_path / "common.json"
    path.write_text('{\n  "model": "x",\n  "prompts": "p.json"\n  "adapters": "a.json"\n}')
    message = problems_of(path)
    assert f"{path}:4:3: invalid JSON" in message


def test_a_config_or_prompts_file_that_is_not_utf8_is_one_line_with_the_fix(tiny_config, tmp_path):
    """An editor's UTF-16 save is bad input said in one line, not a decoding traceback."""
    path = tmp_path / "utf16.json"
    path.write_text('{"model": "x"}', encoding="utf-16")
    assert problems_of(path) == f"{path}: not UTF-8 text (byte 0): save it as UTF-8 JSON"
    config = tiny_config()
    prompts = config.parent / json.loads(config.read_text())["prompts"]
    prompts.write_bytes(b'["caf\xe9"]')
    assert problems_of(config) == f"{prompts}: not UTF-8 text (byte 5): save it as UTF-8 JSON"


def test_a_missing_adapters_file_is_one_line_not_every_section_counting_none(tiny_config, tmp_path):
    """Before: the file's own line, then "no adapters, but multi-LoRA cases were selected" and
    "only 0 adapters are configured" for each section that counts them."""
    online = {"suites": [{"num_adapters": [2], "rate": [2], "duration": 5}]}
    path = tiny_config(adapters=str(tmp_path / "nowhere" / "adapters.json"), online=online, working_set={"sizes": [2]})
    lines = problems_of(path).splitlines()
    assert len(lines) == 1 and "adapters.json" in lines[0] and "not found" in lines[0], lines


def test_unknown_key_suggests_the_closest(tiny_config):
    message = problems_of(tiny_config(matrix={"batch_size": [2]}))
    assert "unknown key 'matrix.batch_size'" in message and "did you mean 'batch_sizes'?" in message
    message = problems_of(tiny_config(adapter="x.json"))
    assert "unknown key 'adapter'" in message and "did you mean 'adapters'?" in message


def test_a_misspelt_required_key_is_one_problem_not_also_a_missing_field(tiny_config):
    """Renamed, not added: "missing required field 'matrix.batch_sizes': add it" beside the
    "did you mean" told the user to add what they had misspelt."""
    path = tiny_config()
    data = json.loads(path.read_text())
    data["matrix"]["batch_size"] = data["matrix"].pop("batch_sizes")
    data["adapter"] = data.pop("adapters")
    path.write_text(json.dumps(data))
    lines = problems_of(path).splitlines()
    assert len(lines) == 2 and not any("missing required field" in line for line in lines), lines
    assert "did you mean 'batch_sizes'?" in lines[-1] + lines[0] and "did you mean 'adapters'?" in "".join(lines)
    # A missing key with no misspelling near it is still said.
    del data["adapter"]
    path.write_text(json.dumps(data))
    assert "missing required field 'adapters'" in problems_of(path)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            {"engine": {"max_lora_rank": 24}},
            "field 'engine.max_lora_rank' has bad value 24: Input should be 1, 8, 16, 32, 64, 128, 256, 320 or 512",
        ),
        (
            {"engine": {"max_loras": 4, "max_cpu_loras": 2}},
            "'engine.max_cpu_loras' has bad value 2: it is below max_loras=4",
        ),
        ({"engine": {"max_loras": 0}}, "field 'engine.max_loras' has bad value 0"),
        (
            {"engine": {"max_num_seq": 4}},
            "unknown key 'engine.max_num_seq' (not a vllm.LLM argument): did you mean 'max_num_seqs'?",
        ),
        ({"engine": {"enable_lora": False}}, "'engine.enable_lora' cannot be set here"),
        ({"matrix": {"batch_sizes": [2, 0]}}, "field 'matrix.batch_sizes[1]' has bad value 0"),
        ({"matrix": {"rounds": 0}}, "field 'matrix.rounds' has bad value 0"),
        ({"matrix": {"output_len": 1}}, "field 'matrix.output_len' has bad value 1"),
        ({"matrix": {"workloads": ["distinct", "random"]}}, "field 'matrix.workloads[1]' has bad value 'random'"),
        (
            {"matrix": {"batch_sizes": [8]}},
            "the 'distinct' workload needs 8 adapters at batch size 8, but only 4 are configured",
        ),
        ({"matrix": {"input_len": 126}}, "input_len + output_len = 130 exceeds engine.max_model_len = 128"),
        ({"model": "builtin:huge-llama"}, "field 'model' has bad value 'builtin:huge-llama'"),
        ({"model": "no/such/model"}, "field 'model': directory"),
        ({"prompts": "missing.json"}, "field 'prompts': "),
        ({"adapters": "missing.json"}, "adapters file"),
        ({"device": "tpu"}, "field 'device' has bad value 'tpu'"),
        # Lax types are bad values too: true is not batch size 1, nor "4" the number 4.
        ({"matrix": {"batch_sizes": [True, 8]}}, "field 'matrix.batch_sizes[0]' has bad value True"),
        ({"matrix": {"rounds": "4"}}, "field 'matrix.rounds' has bad value '4'"),
        ({"matrix": {"seed": -1}}, "field 'matrix.seed' has bad value -1"),
        ({"env": {"VLLM_CPU_KVCACHE_SPACE": [1]}}, "field 'env.VLLM_CPU_KVCACHE_SPACE' has bad value [1]"),
        ({"env": {"Mixed_Case": None}}, "field 'env.Mixed_Case' has bad value None"),
        ({"env": {"A=B": "1"}}, "'A=B' is no variable's name: use letters, digits and _"),
        ({"env": {"A": "x\u0000"}}, "A's value holds a NUL character"),
        ({"engine": {"gpu_memory_utilization": float("nan")}}, "'engine.gpu_memory_utilization' has bad value nan"),
        ({"engine": {"compilation_config": {"x": [float("inf")]}}}, "'engine.compilation_config' has bad value {'x'"),
        (
            {"engine": {"worker_extension_cls": 5}},
            "field 'engine.worker_extension_cls' has bad value 5: give a class's",
        ),
        ({"matrix": {"skew_alpha": float("inf")}}, "field 'matrix.skew_alpha' has bad value inf"),
        ({"engine": {"max_model_len": "256"}}, "field 'engine.max_model_len' has bad value '256': give a whole number"),
    ],
)
def test_bad_values_are_named_with_file_field_and_value(tiny_config, override, expected):
    path = tiny_config(**override)
    message = problems_of(path)
    assert expected in message
    assert str(path.resolve()) in message or str(path) in message


@pytest.mark.parametrize(
    ("generate", "expected"),
    [
        (
            {"ranks": [8, 100000]},
            "field 'adapters.generate.ranks' has bad value 100000: it is above engine.max_lora_rank=16",
        ),
        ({"ranks": [8, 8]}, "field 'adapters.generate.ranks' has bad value [8, 8]: 8 listed more than once"),
        (
            {"target_modules": ["q_proj", "qkv"]},
            "field 'adapters.generate.target_modules': unknown target modules ['qkv']",
        ),
        ({"target_modules": ["q_proj", "q_proj"]}, '"q_proj" listed more than once'),
        ({"seed": -1}, "field 'adapters.generate.seed' has bad value -1"),
    ],
)
def test_generated_adapters_are_checked_before_any_is_written(tiny_config, generate, expected):
    """Ranks [8, 100000] wrote 11 GB of adapters before the rank check read them back."""
    path = tiny_config(adapters={"generate": {"count": 2, **generate}})
    folder = builtin.cache_dir() / "adapters"
    before = set(folder.iterdir()) if folder.is_dir() else set()
    message = problems_of(path)
    assert expected in message and message.count("\n") == 0, message
    assert (set(folder.iterdir()) if folder.is_dir() else set()) == before, "nothing generated for a refused config"


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("[]", "does not give a Llama-like decoder's shape (TypeError: "),
        ('{"hidden_size": 64, "num_attention_heads": 0, "intermediate_size": 8}', "(ZeroDivisionError: "),
        ('{"hidden_size": "64", "num_attention_heads": 4, "intermediate_size": 8}', "(TypeError: "),
        ("{not json", "field 'model': "),
    ],
)
def test_generated_adapters_for_a_model_of_no_readable_shape_are_one_line(tiny_config, tmp_path, shape, expected):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(shape)
    path = tiny_config(model=str(model), engine={"load_format": "dummy"}, adapters={"generate": {"count": 2}})
    message = problems_of(path)
    assert expected in message and "\n" not in message, message


def test_a_churn_suite_is_checked_as_an_online_one_before_any_engine(tiny_config):
    """A missing trace file or requests too long for the model: found after the engine built."""
    suites = [{"name": "c", "trace": "missing.jsonl", "rate": [2], "duration": 3}]
    suites += [{"name": "d", "num_adapters": [2], "rate": [2], "duration": 3, "input_range": [8, 200]}]
    message = problems_of(tiny_config(churn={"suites": suites, "adapters": 1}))
    assert "field 'churn.suites[0].trace': " in message and "missing.jsonl: not a readable lorabench trace" in message
    assert "field 'churn.adapters'" not in message, "a file that does not read is said once, by its suite"
    assert (
        "field 'churn.suites[1].input_range': the longest request, 264 tokens, exceeds engine.max_model_len" in message
    )


def test_a_churn_suite_replaying_a_file_needs_its_adapters_and_the_churned_ones(tiny_config, tmp_path):
    """The working set is the file's header's adapters: 3 here, and 2 churned after them."""
    trace = tmp_path / "t.jsonl"
    assert cli.main(["trace", "generate", "-n", "3", "-R", "5", "--duration", "4", "--out", str(trace)]) == 0
    churn = {"suites": [{"name": "c", "trace": str(trace), "rate": [2], "duration": 3}], "adapters": 2}
    message = problems_of(tiny_config(churn=churn))
    assert "field 'churn.adapters' has bad value 2: with a trace of 3 adapters it needs 5, but only 4" in message


def test_missing_required_field(tmp_path):
    path = write_json(tmp_path / "c.json", {"model": "builtin:tiny-llama", "prompts": "p.json"})
    message = problems_of(path)
    assert "missing required field 'adapters'" in message and "missing required field 'matrix'" in message


def test_every_problem_is_reported_at_once(tiny_config):
    message = problems_of(tiny_config(engine={"max_lora_rank": 24}, matrix={"rounds": 0, "batch_size": 3}))
    assert "max_lora_rank" in message and "matrix.rounds" in message and "matrix.batch_size" in message


def test_empty_adapters_only_matter_for_multilora(tmp_path, tiny_config):
    write_json(tmp_path / "none.json", [])
    path = tiny_config(adapters="none.json")
    assert "no adapters, but multi-LoRA cases were selected" in problems_of(path, needs_lora=True)
    assert load(path, needs_lora=False).adapters == ()


def test_adapter_without_weights_or_config(tmp_path, tiny_config):
    (tmp_path / "a").mkdir()
    write_json(tmp_path / "b" / "adapter_config.json", {"r": 8})
    write_json(tmp_path / "adapters.json", [{"name": "a", "path": "a"}, {"name": "b", "path": "b"}])
    message = problems_of(tiny_config(adapters="adapters.json", matrix={"workloads": ["identical"]}))
    assert "adapter 'a':" in message and "has no adapter_config.json" in message
    assert "adapter 'b':" in message and "has no weights" in message


def test_top_level_must_be_an_object(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps([1, 2]))
    assert "the top level must be a JSON object" in problems_of(path)


def test_output_files_are_checked_before_any_engine(tiny_config, tmp_path):
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("a,b\n1,2\n")
    message = problems_of(tiny_config(output="foreign.csv"))
    assert "field 'output'" in message and "is not a lorabench results file" in message
    foreign.unlink()
    (tmp_path / "foreign.samples.csv").write_text("a,b\n1,2\n")  # a row would be lost when its samples fail
    message = problems_of(tiny_config(output="foreign.csv"))
    assert "foreign.samples.csv exists and is not a lorabench results file" in message
    (tmp_path / "blocker").write_text("")
    message = problems_of(tiny_config(results_dir="blocker/results"))
    assert "field 'results_dir': cannot create result files" in message
    path = tiny_config()
    with pytest.raises(ConfigError, match="--bench-output: cannot write the CSV file"):
        load(path, output=str(tmp_path))


def test_adapter_entries_must_be_strings(tmp_path, tiny_config):
    write_json(tmp_path / "adapters.json", [{"name": "a", "path": "a", "prompt": 3}])
    assert "name, path and prompt must be strings" in problems_of(tiny_config(adapters="adapters.json"))


ONLINE = {
    "warmup_s": 1,
    "suites": [
        {
            "name": "s",
            "num_adapters": [2, 4],
            "alpha": [0.3, 1],
            "rate": [2],
            "duration": 5,
            "input_range": [8, 32],
            "output_range": [4, 8],
        }
    ],
}


def test_online_suites_are_a_cross_product_with_readable_ids(tiny_config):
    cases = online_cases(read_config_file(tiny_config(online=ONLINE)))
    assert [c.id for c in cases] == ["s-n2-a0.3-cv1-r2", "s-n2-a1-cv1-r2", "s-n4-a0.3-cv1-r2", "s-n4-a1-cv1-r2"]
    assert cases[0].params.input_range == (8, 32) and cases[0].params.duration == 5


@pytest.mark.parametrize(
    ("suite", "expected"),
    [
        (
            {"num_adapters": [5]},
            "field 'online.suites[0].num_adapters' has bad value 5: only 4 adapters are configured",
        ),
        ({"input_range": [64, 8]}, "low 64 is above high 8"),
        ({"input_range": [8, 121]}, "the longest request, 129 tokens, exceeds engine.max_model_len = 128"),
        ({"rate": [0]}, "field 'online.suites[0].rate[0]' has bad value 0"),
        ({"rate": [2, 2.0]}, "field 'online.suites[0].rate' has bad value [2, 2.0]: 2.0 listed more than once"),
        ({"rate": [float("nan")]}, "field 'online.suites[0].rate[0]' has bad value nan"),
        (
            {"num_adapters": [2, 2]},
            "field 'online.suites[0].num_adapters' has bad value [2, 2]: 2 listed more than once",
        ),
        ({"duration": 1}, "'online.warmup_s' has bad value 1.0: it leaves nothing of suite 's'"),
        ({"lengths": "pareto"}, "field 'online.suites[0].lengths' has bad value 'pareto'"),
        ({"name": "has space"}, "field 'online.suites[0].name' has bad value 'has space'"),
    ],
)
def test_bad_online_suites(tiny_config, suite, expected):
    online = {**ONLINE, "suites": [{**ONLINE["suites"][0], **suite}]}
    assert expected in problems_of(tiny_config(online=online))


def test_a_model_folder_without_weights_runs_only_with_dummy_weights(tmp_path, tiny_config):
    """config.json alone is how a big base is benchmarked with random weights; without
    load_format "dummy" vLLM would fail deep inside the engine instead."""
    from lorabench.load import builtin

    model = tmp_path / "llama-shape"
    write_json(model / "config.json", builtin.MODELS["tiny-llama"])
    problems = problems_of(tiny_config(model=str(model)))
    assert f"field 'model': {model} has a config.json but no weight files" in problems
    assert 'set engine.load_format to "dummy"' in problems
    config = load(tiny_config(model=str(model), engine={"load_format": "dummy"}))
    assert config.llm_kwargs(EngineSpec(False))["load_format"] == "dummy"
    (model / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert load(tiny_config(model=str(model))).model == model


def test_new_workloads_sections_and_their_checks(tiny_config):
    path = tiny_config(
        matrix={"workloads": ["skewed", "mixed"], "skew_alpha": 1.2, "mixed_base_share": 0.25},
        residency={"requests": 4},
        working_set={"sizes": [1, 3], "cycles": 1},
    )
    config = load(path)
    assert config.shape.skew_alpha == 1.2 and config.shape.base_share == 0.25
    assert [a.rank for a in config.adapters] == [8, 16, 8, 16], "ranks are read when the config is resolved"
    problems = problems_of(tiny_config(working_set={"sizes": [1, 9]}))
    assert "field 'working_set.sizes' has bad value 9: only 4 adapters are configured" in problems
    assert "field 'matrix.mixed_base_share' has bad value 1.0" in problems_of(
        tiny_config(matrix={"mixed_base_share": 1.0})
    )
    problems = problems_of(tiny_config(residency={"requests": 0, "tiers": ["slot"]}))
    assert "field 'residency.requests' has bad value 0" in problems
    assert "unknown key 'residency.tiers'" in problems


class BrokenImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds one module and fails to run it, as a vLLM built for another torch fails."""

    def __init__(self, name: str, error: Exception) -> None:
        self.name, self.error = name, error

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == self.name else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise self.error


def break_import(monkeypatch, name: str, error: Exception) -> None:
    """The module and every submodule out of ``sys.modules`` for the test: where an earlier
    test of the worker imported the real vLLM (a cold names cache does), a submodule left
    there would be read instead of the broken import."""
    for loaded in [key for key in sys.modules if key == name or key.startswith(f"{name}.")]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setattr(sys, "meta_path", [BrokenImport(name, error), *sys.meta_path])


def test_a_vllm_that_fails_to_import_is_a_config_problem(tiny_config, monkeypatch):
    # vLLM itself, as a build for another CUDA fails (its _C extension): breaking only
    # arg_utils would import the real vLLM first, seconds of torch for nothing.
    error = ImportError("libcudart.so.12: cannot open shared object file")
    break_import(monkeypatch, "vllm", error)
    message = problems_of(tiny_config())
    assert (
        "engine arguments cannot be checked: vLLM is installed but does not import (ImportError: libcudart.so.12: "
        "cannot open shared object file): run python -c 'import vllm' to see why"
    ) in message


def test_without_vllm_the_engine_arguments_go_unchecked(tiny_config, monkeypatch):
    """Not installed at all: nothing to check against, and the engine build says what to install."""
    break_import(monkeypatch, "vllm", ModuleNotFoundError("No module named 'vllm'", name="vllm"))
    config = load(tiny_config(engine={"max_num_seq": 4}))  # a typo vLLM's own names would have caught
    assert config.file.engine.model_extra["max_num_seq"] == 4


def test_generated_adapters_are_found_again_in_the_cache(tiny_config):
    """Their folder is keyed by the adapter spec's fields, as before they were passed one by
    one: adapters generated by an earlier version are used, not made again."""
    path = tiny_config()
    config = load(path)
    spec = read_config_file(path).adapters.generate
    model_config = (config.model / "config.json").read_text()
    key = builtin._digest(model_config, spec.model_dump(), list(config.prompts), GENERATOR_VERSION)
    assert {a.path.parent.name for a in config.adapters} == {f"{config.model.name}-{key}"}


def test_a_missing_model_folder_is_one_problem_not_one_per_thing_its_adapters_would_feed(tmp_path, tiny_config):
    """Adapters are generated for a usable model only; "no adapters" and the suites' counts
    would be knock-on errors of the model's own problem."""
    path = tiny_config(
        model=str(tmp_path / "no-such-model"),
        adapters={"generate": {"count": 4, "ranks": [8]}},
        online={"suites": [{"num_adapters": [4], "rate": [1], "duration": 2}]},
    )
    with pytest.raises(ConfigError) as info:
        load(path)
    (problem,) = info.value.problems
    assert "field 'model': directory" in problem and "no-such-model does not exist" in problem
