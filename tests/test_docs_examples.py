"""The examples of docs/own-model.md read as lorabench reads them, so they cannot go stale."""

from __future__ import annotations

import json
from pathlib import Path

from lorabench.config.schema import ConfigFile
from lorabench.load.adapters import read_adapters_file

PAGE = Path(__file__).resolve().parents[1] / "docs" / "own-model.md"


def _json_blocks() -> list[str]:
    parts = PAGE.read_text(encoding="utf-8").split("```json\n")[1:]
    return [part.split("\n```", 1)[0] for part in parts]


def test_the_adapters_json_example_reads(tmp_path: Path) -> None:
    example = next(b for b in _json_blocks() if b.lstrip().startswith("["))
    (tmp_path / "adapters.json").write_text(example, encoding="utf-8")
    adapters = read_adapters_file(tmp_path / "adapters.json")
    assert [(a.name, a.path, a.same_as_base) for a in adapters] == [
        ("sql", tmp_path / "sql-lora", False),
        ("summarize", Path("/data/loras/summarize-v2"), False),
        ("tiny-finetune", tmp_path / "tiny-finetune", True),
    ]
    assert adapters[0].prompt and not adapters[1].prompt


def test_the_config_examples_are_fields_of_the_config() -> None:
    # A block that starts with a key is a fragment of the config's object.
    top, engine = (
        json.loads(b if b.lstrip().startswith("{") else f"{{{b}}}")
        for b in _json_blocks()
        if not b.lstrip().startswith("[")
    )
    assert set(top) <= set(ConfigFile.model_fields)
    assert engine == {"engine": {"load_format": "dummy"}}
