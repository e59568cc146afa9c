"""Why a capacity search stopped: the values of a row's ``search_stop`` column.

Declared here, beside the schema, so that what reads the column (compare, the history,
the recommendation) needs nothing of the search that writes it (``lorabench.measure.capacity``).
"""

BRACKETED = "bracketed"
ABOVE_RANGE = "above max_rate"
BELOW_RANGE = "below min_rate"
PROBE_LIMIT = "max_probes"
TIME_LIMIT = "max_time_s"
TOO_FEW = "too few requests"
FAILED = "requests failed"  # then ": " and the first error
BEHIND = "client fell behind"  # then ": " and how far (replay_summary.client_behind)
# The stops of a probe that decided nothing whatever it measured: the search found no SLO edge.
NO_VERDICT = (FAILED, BEHIND)
