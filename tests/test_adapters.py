import json

import pytest
from safetensors import safe_open

from lorabench.cli import main as cli
from lorabench.load import builtin
from lorabench.load.adapters import generate_dummy_adapters, module_shapes, read_adapters_file, read_rank

LLAMA_7B = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 32,
}


def test_module_shapes_follow_the_base_config():
    gqa = {**LLAMA_7B, "num_key_value_heads": 8}
    shapes = module_shapes(gqa, ["q_proj", "k_proj", "o_proj", "down_proj"])
    assert shapes == {
        "q_proj": ("self_attn", 4096, 4096),
        "k_proj": ("self_attn", 4096, 1024),
        "o_proj": ("self_attn", 4096, 4096),
        "down_proj": ("mlp", 11008, 4096),
    }
    with pytest.raises(ValueError, match="unknown target modules"):
        module_shapes(gqa, ["qkv_proj"])


def test_generated_adapters_have_peft_layout_names_and_ranks(tmp_path):
    base = builtin.ensure_model("tiny-llama") / "config.json"
    adapters = generate_dummy_adapters(
        base, tmp_path, count=3, ranks=[8, 16], target_modules=["q_proj", "v_proj"], prompts=["p0", "p1"], seed=1
    )
    assert [a.name for a in adapters] == ["dummy-lora-rank-8-0", "dummy-lora-rank-16-0", "dummy-lora-rank-8-1"]
    assert [read_rank(a.path) for a in adapters] == [8, 16, 8]
    listed = read_adapters_file(tmp_path / "adapters.json")
    assert [(a.name, a.path, a.prompt) for a in listed] == [(a.name, a.path, a.prompt) for a in adapters]
    assert [a.prompt for a in listed] == ["p0", "p1", "p0"]
    config = json.loads((adapters[1].path / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["target_modules"] == ["q_proj", "v_proj"] and config["peft_type"] == "LORA"
    with safe_open(str(adapters[1].path / "adapter_model.safetensors"), "pt") as f:
        keys = set(f.keys())
        a = f.get_tensor("base_model.model.model.layers.3.self_attn.v_proj.lora_A.weight")
        b = f.get_tensor("base_model.model.model.layers.3.self_attn.v_proj.lora_B.weight")
    assert len(keys) == 4 * 2 * 2  # layers x modules x (A, B)
    assert tuple(a.shape) == (16, 256) and tuple(b.shape) == (128, 16)  # 4 kv heads x 32


def test_generation_is_deterministic(tmp_path):
    base = builtin.ensure_model("tiny-llama") / "config.json"
    for out in ("one", "two"):
        generate_dummy_adapters(base, tmp_path / out, count=1, ranks=[8], target_modules=["q_proj"], prompts=[], seed=3)
    name = "dummy-lora-rank-8-0/adapter_model.safetensors"
    assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_read_adapters_file_errors(tmp_path):
    path = tmp_path / "adapters.json"
    path.write_text(json.dumps([{"name": "a", "path": "a"}, {"name": "a", "path": "b"}]))
    with pytest.raises(ValueError, match="repeats the adapter name 'a'"):
        read_adapters_file(path)
    path.write_text(json.dumps([{"name": "a", "pth": "a"}]))
    with pytest.raises(ValueError, match=r"entry \[0\] needs at least 'name' and 'path'"):
        read_adapters_file(path)
    path.write_text("[{")
    with pytest.raises(ValueError, match="adapters.json:1:3: invalid JSON"):
        read_adapters_file(path)
    path.write_text(json.dumps([{"name": "a", "path": "a", "same_as_base": "yes"}]))
    with pytest.raises(ValueError, match=r"entry \[0\] \(a\): same_as_base is 'yes': give true or false"):
        read_adapters_file(path)


def test_an_adapter_may_be_declared_to_answer_as_the_base_model(tmp_path):
    path = tmp_path / "adapters.json"
    path.write_text(json.dumps([{"name": "a", "path": "a", "same_as_base": True}, {"name": "b", "path": "b"}]))
    assert [a.same_as_base for a in read_adapters_file(path)] == [True, False]


def test_cli_generates_for_a_7b_config_without_the_model(tmp_path, capsys):
    """Rank 4, which the default ranks (8, 16) do not give: at rank 64 the two adapters were
    134 MB of random weights to draw and write, most of the quick loop's second here."""
    (tmp_path / "llama-7b").mkdir()
    (tmp_path / "llama-7b" / "config.json").write_text(json.dumps(LLAMA_7B))
    code = cli.main(
        [
            "adapters",
            "generate",
            "--base",
            str(tmp_path / "llama-7b"),
            "--out",
            str(tmp_path / "out"),
            "--count",
            "2",
            "--ranks",
            "4",
            "--target-modules",
            "q_proj,v_proj",
        ]
    )
    assert code == 0 and "wrote 2 adapters" in capsys.readouterr().out
    adapters = read_adapters_file(tmp_path / "out" / "adapters.json")
    assert [a.name for a in adapters] == ["dummy-lora-rank-4-0", "dummy-lora-rank-4-1"]
    with safe_open(str(adapters[0].path / "adapter_model.safetensors"), "pt") as f:
        assert tuple(f.get_tensor("base_model.model.model.layers.31.self_attn.q_proj.lora_B.weight").shape) == (
            4096,
            4,
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--base", "/no/such/model"], "no config.json there"),
        (["--base", "builtin:nope"], "built-in models are tiny-llama"),
        (["--base", "builtin:tiny-llama", "--target-modules", "qkv"], "unknown target modules"),
        (
            ["--base", "builtin:tiny-llama", "--count", "0"],
            "argument --count: expected a whole number above 0, got '0'",
        ),
        # A repeated rank named two adapters alike; an empty list or a rank of 0 failed in the generator.
        *(
            (["--base", "builtin:tiny-llama", "--ranks", ranks], f"list of ranks above 0, each once, got '{ranks}'")
            for ranks in ("8,8", ",", "-8", "0")
        ),
        (["--base", "builtin:tiny-llama", "--target-modules", ","], "list of module names, each once, got ','"),
        (["--base", "builtin:tiny-llama", "--seed", "-1"], "argument --seed: expected a whole number from 0 to"),
        (["--base", "builtin:tiny-llama", "--prompts", "missing.json"], "--prompts missing.json: No such file"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    """Exit 1 is a finding; bad input is 2, one line on stderr (--prompts missing.json was a traceback)."""
    assert cli.main(["adapters", "generate", "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("content", "message"), [("{not json", "not JSON"), ('{"a": 1}', "not a JSON list of strings")]
)
def test_cli_prompts_that_are_not_a_list_of_strings_are_refused(tmp_path, capsys, content, message):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(content)
    args = ["--base", "builtin:tiny-llama", "--prompts", str(prompts)]
    assert cli.main(["adapters", "generate", "--out", str(tmp_path / "o"), *args]) == 2
    assert f"lorabench adapters generate: --prompts {prompts}: {message}" in capsys.readouterr().err
