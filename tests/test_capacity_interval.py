"""The capacity search's interval on the SLO edge (lorabench.measure.capacity.boundary_interval,
docs/capacity.md): it covers the true edge of engines whose edge is known in at least 90 % of
searches, where the bracket of passing and failing rates does far less often; an unbounded side
is said as such. The 200-search figures are scripts/bench_capacity_interval.py's (the lab log)."""

from __future__ import annotations

from lorabench.measure.capacity import Probe, boundary_interval
from tests.helpers import load_script


def probe(rate, met, n=40, unfinished=0):
    return Probe(rate, n, met, unfinished, 0.9)


def test_the_interval_covers_a_known_edge_in_90_percent_of_searches_where_the_bracket_does_not():
    figures = load_script("bench_capacity_interval").coverage(100, steepness=6.0, duration=5.0, seed=500)
    assert figures["interval covers"] >= 0.9, figures
    assert figures["bracket covers"] < 0.8, figures
    assert figures["median width (high / low)"] < 2, figures


def test_the_interval_lies_around_the_rate_where_attainment_meets_the_target():
    low, high = boundary_interval([probe(2, 40), probe(4, 39), probe(8, 20), probe(16, 2)])
    assert 4 < low < high < 8


def test_a_side_no_probe_bounds_is_open_and_a_growing_queue_bounds_the_edge_from_above():
    low, high = boundary_interval([probe(2, 40), probe(4, 40)])
    assert low is not None and high is None, "every probe passed: nothing bounds the edge above"
    low, high = boundary_interval([probe(2, 10), probe(4, 2)])
    assert low is None and high is not None, "every probe failed: nothing bounds it below"
    low, high = boundary_interval([probe(2, 40), probe(4, 40), probe(8, 40, unfinished=3)])
    assert high == 8, "requests left unfinished at 8 req/s: the edge is below, whatever they met"
    assert boundary_interval([probe(2, 3, n=3)]) == (None, None), "an undecided probe says nothing"
