"""The history page as a nightly's reader opens it: the summary of what changed first, worst
first, each linked to its chart; dates and releases on the axes; unchanged series folded."""

from __future__ import annotations

import re

import pandas as pd

from lorabench.cli.main import main
from tests.test_history import write_digests, write_runs


def planted_store(tmp_path):
    """30 nights of two cases: bs2's ttft_ms 1.5 times slower from night 22, bs8's one night
    1.3 times slower (the last), and adapter a1's output changed on the last night."""
    paths = write_runs(tmp_path, 30, step_at=22, factor=1.5, seed=7)
    for i, path in enumerate(paths):
        rows = pd.read_csv(path)
        if i >= 22:  # the step is bs2's only
            rows.loc[rows.batch_size == 8, "ttft_ms"] /= 1.5
        if i == 29:
            rows.loc[rows.batch_size == 8, "ttft_ms"] *= 1.3
        rows.to_csv(path, index=False)
        write_digests(path, "d-new" if i == 29 else "d-old")
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, paths)])
    return db


def test_the_page_opens_on_a_summary_of_the_planted_changes_worst_first(tmp_path, capsys):
    db = planted_store(tmp_path)
    out = tmp_path / "page"
    args = ["--metric", "ttft_ms", "--metric", "decode_ms"]
    assert main(["history", "report", "--db", str(db), "--out", str(out), *args]) == 0
    page = (out / "index.html").read_text()
    summary = page.split("<h2>Summary</h2>")[1].split("<h2>Charts</h2>")[0]
    kinds = re.findall(r"<li><b>([A-Z ]+)</b>", summary)
    assert kinds == ["REGRESSION", "OUTPUT CHANGED", "WATCH"], summary
    assert "bs2" in summary.split("OUTPUT CHANGED")[0] and "since run run-022" in summary
    assert "vllm_version 0.32.0 -&gt; 0.33.0" in summary
    for anchor in re.findall(r'href="#(s[0-9a-f]+)"', summary):  # each links to its chart
        assert f'<figure id="{anchor}"' in page
    folded = page.split("<details>")[1]
    assert "2 series with no change point" in folded and folded.count("<figure ") == 2  # decode_ms: flat
    assert "2026-11-01 (vLLM 0.32.0)" in page and "2026-11-02 (vLLM 0.33.0)" in page  # dates, releases
    assert page.count('stroke-dasharray="3,3"') == 4  # the new release marked on every chart


def test_a_page_with_nothing_changed_says_so(tmp_path):
    db = tmp_path / "h.db"
    main(["history", "add", "--db", str(db), *map(str, write_runs(tmp_path, 8))])
    assert main(["history", "report", "--db", str(db), "--out", str(tmp_path / "p")]) == 0
    assert "Nothing changed: no regression" in (tmp_path / "p" / "index.html").read_text()
