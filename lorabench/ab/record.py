"""An A/B session's record, ``OUT/ab.json``: written whole after every turn, read back by
``--resume``, which keeps the complete pairs of the same session and refuses another."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from lorabench.ab.plan import BASE, NEW, ABError


def finished_turns(out: Path, record: dict) -> list[dict]:
    """The turns of the complete pairs of the session in ``out``, which must have run the
    same sides, versions, config and selection as ``record``. A pair left half done moves
    to ``superseded/``, so that it runs again with its two turns back to back."""
    earlier = read_record(out / "ab.json")
    for key in ("config", "pytest_args"):
        if earlier.get(key) != record[key]:
            raise ABError(f"--resume: {key} is {record[key]!r}, the session in {out} ran {earlier.get(key)!r}")
    # A sequential session's looks were made at alpha / looks: its design may not change midway.
    then = earlier.get("design", {"sequential": False})
    if then != record["design"]:
        raise ABError(f"--resume: the design is {record['design']}, the session in {out} ran {then}")
    if "sequential" in earlier:
        record["sequential"] = earlier["sequential"]
    if earlier.get("config_sha256", record["config_sha256"]) != record["config_sha256"]:
        raise ABError(
            f"--resume: {record['config']} changed since the session in {out} ran it; its pairs would mix two "
            "matrices: put the config back, or start a new --out"
        )
    for name, now in record["sides"].items():
        for key, value in now.items():
            then = earlier.get("sides", {}).get(name, {}).get(key)
            if then != value:
                raise ABError(f"--resume: the {name} side's {key} is {value!r}, the session in {out} had {then!r}")
    sides_done: dict[int, set[str]] = {}
    for turn in earlier.get("turns", []):
        sides_done.setdefault(turn["pair"], set()).add(turn["side"])
    complete = {pair for pair, done in sides_done.items() if done == {BASE, NEW}}
    superseded = out / "superseded" / time.strftime("%Y%m%dT%H%M%S")
    for name in (BASE, NEW):
        for path in (out / name).glob("pair-[0-9][0-9][0-9].*"):
            if int(path.name[5:8]) not in complete:
                (superseded / name).mkdir(parents=True, exist_ok=True)
                path.rename(superseded / name / path.name)
    print(f"lorabench ab: resuming {out}: {len(complete)} complete pairs kept", file=sys.stderr)
    return [turn for turn in earlier.get("turns", []) if turn["pair"] in complete]


def read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        turns = record.get("turns", []) if isinstance(record, dict) else None
        if not isinstance(turns, list) or not all(isinstance(t, dict) and {"pair", "side"} <= t.keys() for t in turns):
            raise ValueError("no list of turns with their pair and side")
        sides = record.get("sides", {})
        if not isinstance(sides, dict) or not all(isinstance(s, dict) for s in sides.values()):
            raise ValueError("its sides are not records")
    except (OSError, ValueError) as exc:
        raise ABError(f"--resume: {path}: not a session record ({exc}); start again with a new --out") from None
    return record


def write_record(path: Path, record: dict) -> None:
    """Replace the session record whole or not at all: ``--resume`` reads it, so a crash or
    a full disk while writing must leave the previous record, never half of a new one."""
    try:
        _replace_whole(path, json.dumps(record, indent=2))
    except OSError as exc:
        raise ABError(
            f"{path}: cannot write the session record ({exc}); the previous one is kept: "
            "mend that, then continue with --resume"
        ) from None


def _replace_whole(path: Path, text: str) -> None:
    """A temporary file beside ``path``, on disk before it takes the name."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as sink:
            sink.write(text)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def note(out: Path, **fields: object) -> None:
    """Add ``fields`` to the session's record (what the comparison found, for bisect)."""
    path = out / "ab.json"
    write_record(path, {**read_record(path), **fields})
