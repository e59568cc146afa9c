"""A trace file is written whole or not at all.

A file written in place and stopped midway (a full disk, a ^C) would be a shorter trace
that reads without a word; so the lines go to a temporary file in the same folder, on
disk before ``os.replace`` gives it the name. The header counts the requests, and
``data.load`` refuses a file whose lines do not match it (one cut or edited later).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def write_whole(path: Path, chunks: Iterable[str]) -> None:
    """``chunks`` joined as the file at ``path``; a file already there is replaced only
    once the new one is complete, and stays as it was if writing fails."""
    path = Path(path)
    # Named, not from mkstemp: the file gets the permissions any file written here gets.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("w", encoding="utf-8", newline="\n") as sink:
            for chunk in chunks:
                sink.write(chunk)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
