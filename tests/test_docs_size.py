"""The user pages stay short enough to read (issue 50: README plus docs/, the lab log apart,
at 25,000 words or fewer, counted as ``wc -w`` counts). What was measured while building goes
to docs/lab/, which is not counted."""

from __future__ import annotations

from tests.helpers import ROOT

LIMIT = 25_000


def test_the_user_pages_are_25000_words_or_fewer():
    pages = [ROOT / "README.md", *(p for p in (ROOT / "docs").rglob("*.md") if "lab" not in p.parts)]
    words = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").split()) for p in pages}
    longest = sorted(words.items(), key=lambda kv: -kv[1])[:3]
    assert sum(words.values()) <= LIMIT, f"{sum(words.values())} words; the longest pages: {longest}"
