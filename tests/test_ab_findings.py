"""An A/B turn whose cases failed with their rows written (a finding, pytest exit 1) finished;
one whose case crashed, or any other exit, failed (lorabench.ab.process.findings_only)."""

from __future__ import annotations

import pytest

from lorabench.ab.process import findings_only


@pytest.mark.parametrize(
    ("rc", "rows", "last", "finished"),
    [
        (1, 1, "== 1 failed, 74 deselected in 32.7s ==", True),  # an isolation breach, its row written
        (1, 3, "1 failed, 2 passed in 9.1s", True),
        (1, 2, "1 failed, 2 passed in 9.1s", False),  # a case crashed before its row
        (1, 3, "1 failed, 2 passed, 1 error in 9.1s", False),
        (1, 0, "1 failed in 9.1s", False),
        (2, 1, "1 failed in 9.1s", False),
        (1, 1, "Killed", False),
    ],
)
def test_a_turn_finished_only_where_every_case_that_ran_wrote_its_row(tmp_path, rc, rows, last, finished):
    result, log = tmp_path / "pair-000.csv", tmp_path / "pair-000-base.log"
    result.write_text("a,b\n" + "1,2\n" * rows)
    log.write_text(f"pytest ...\n{last}\n")
    assert findings_only(rc, result, log) is finished
