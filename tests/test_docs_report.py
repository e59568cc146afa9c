"""docs/report.md's table of the summary's headings names every heading the summary can
print, and only those: the summary and the page that explains it cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from lorabench.results.files import SUMMARY_COLUMNS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "report.md"


def _documented() -> dict[str, str]:
    """heading -> column, from the table under "The summary"."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## The summary", 1)[1].split("\n#", 1)[0]
    pairs = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        headings, columns = (re.findall(r"`([^`]+)`", c) for c in cells)
        assert len(headings) == len(columns[: len(headings)]), line
        pairs.update(zip(headings, columns))
    return pairs


def test_every_summary_heading_is_explained() -> None:
    documented = _documented()
    printed = {title: key for key, title in SUMMARY_COLUMNS}
    assert {h: documented.get(h) for h in printed} == printed
    assert set(documented) <= set(printed), "report.md explains a heading the summary never prints"
