"""The change a comparison reports is the one its test is on: the ratio of the builds'
geometric means (docs/compare.md#output-and-exit-status), so that a verdict's direction and
its threshold are those of the tested difference."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from lorabench.analysis.compare import WITHIN, compare, load_run
from tests.test_compare import LATENCIES, real_run

CASE = ["workload", "batch_size", "max_loras", "input_len", "output_len"]


def test_one_wild_build_does_not_turn_a_regression_into_an_improvement():
    """Base: one batch case's e2e 4 times slower on its last build, a stall; the other three
    builds as measured. New: every latency 1.7 times the measured. The arithmetic means say
    2 % faster ("within threshold"); the builds' logs, which the test is on, say 20 % slower."""
    base, new = real_run(), real_run()
    for metric in LATENCIES:
        new[metric] *= 1.7
    new["output_tokens_per_s"] /= 1.7
    batch = base[base["scenario"] == "multilora"]
    spiked = batch.index[(batch[CASE] == batch[CASE].iloc[0]).all(axis=1)]
    assert len(spiked) == base["build"].nunique() == 4
    base.loc[spiked, "e2e_ms"] *= np.where(base.loc[spiked, "build"] == 3, 4.0, 1.0)

    result = compare(load_run(Path("base.csv"), [base]), load_run(Path("new.csv"), [new]))

    (finding,) = [f for f in result.findings if f.metric == "e2e_ms" and f.base == base.loc[spiked, "e2e_ms"].mean()]
    assert finding.new < finding.base, "the arithmetic means point the other way, as planted"
    geometric = np.exp(np.log(new.loc[spiked, "e2e_ms"]).mean() - np.log(base.loc[spiked, "e2e_ms"]).mean())
    assert math.isclose(finding.ratio, geometric) and 18 < finding.change_pct < 22
    assert finding.verdict != WITHIN
