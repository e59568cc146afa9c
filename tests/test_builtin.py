import json

from lorabench.load import builtin


def test_tokenizer_is_built_identically_every_time(tmp_path):
    builtin.write_tokenizer(tmp_path / "a")
    builtin.write_tokenizer(tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def test_tokenizer_round_trips_text_and_decodes_every_id(tmp_path):
    from tokenizers import Tokenizer

    builtin.write_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == builtin.VOCAB_SIZE == builtin.MODELS["tiny-llama"]["vocab_size"]
    ids = tok.encode("héllo, wörld").ids
    assert len(ids) == len("héllo, wörld".encode()), "one token per byte"
    assert tok.decode(ids) == "héllo, wörld"
    assert tok.decode([builtin.VOCAB_SIZE - 1]) != ""


def test_model_is_made_once_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LORABENCH_CACHE_DIR", str(tmp_path))
    first = builtin.ensure_model("tiny-llama")
    assert first.parent == tmp_path / "models"
    assert json.loads((first / "config.json").read_text())["num_hidden_layers"] == 4
    stamp = (first / "config.json").stat().st_mtime_ns
    assert builtin.ensure_model("tiny-llama") == first
    assert (first / "config.json").stat().st_mtime_ns == stamp
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.endswith(".tmp")]
