"""scripts/screenshots.py writes the pages the docs' pictures are shot from, each holding what
the picture is there to show, and skips the shots where Chromium is missing; the summary
sample in docs/images/ is what the plugin prints for the script's rows today."""

from __future__ import annotations

import re

from tests.helpers import ROOT, load_script


def test_the_pages_hold_the_planted_changes_and_no_chromium_skips_the_shots(tmp_path, capsys):
    script = load_script("screenshots")
    images, work = tmp_path / "images", tmp_path / "work"
    assert script.main(["--out", str(images), "--keep", str(work), "--chromium", str(tmp_path / "no-chromium")]) == 0
    assert "no screenshots" in capsys.readouterr().out and not list(images.glob("*.png"))

    history = (work / "history-page" / "index.html").read_text()
    summary = history.split("<h2>Summary</h2>")[1].split("<h2>Charts</h2>")[0]
    assert re.findall(r"<li><b>([A-Z ]+)</b>", summary) == ["REGRESSION", "OUTPUT CHANGED", "WATCH"]
    assert "since run run-022: vllm_version 0.32.0 -&gt; 0.33.0" in summary and "adapter a1" in summary

    report = (work / "report-page" / "index.html").read_text()
    headline = report.split("<h2>Headline</h2>")[1].split("</section>")[0]
    assert "<b>distinct bs8 on loras2-rank16-cpu12</b>" in headline and "choose loras8-rank16-cpu12" in headline
    assert "OUTPUT DIGESTS MISMATCH: loras8-rank16-cpu12-build1" in headline
    assert "results/20261201T020000Z-e905ef9a.csv" in report, "the page names the run's file, not the scratch folder"

    text = (images / "summary.txt").read_text()
    assert text.startswith("engine builds: 4 (") and "wrong out" in text and "by adapter rank: rank 8" in text


def test_the_docs_summary_sample_is_what_the_plugin_prints_today():
    script = load_script("screenshots")
    sample = (ROOT / "docs" / "images" / "summary.txt").read_text()
    assert sample == script.summary_text(script.batch_rows()), "rerun scripts/screenshots.py"
