"""What a case is across runs: the columns cases are matched on, the metrics compared, and
a case's label.

Without pandas, so that the history's commands (``lorabench history show`` of one case
answers in well under a second) and compare, which builds its tables on these, share them.
"""

from __future__ import annotations

from lorabench.results.naming import engine_name
from lorabench.results.schema import CASE_KEY, COMPARED, OPTIONAL_COLUMNS

# metric -> True when higher is better: the directions the result schema declares.
METRICS = COMPARED
# What every lorabench result file has had.
CORE_METRICS = ("ttft_ms", "prefill_ms", "decode_ms", "e2e_ms", "output_tokens_per_s")
# Metrics a build that measured all it should can leave blank: no request of its trace was
# sent while an adapter loaded, so it has no TTFT during loads to divide (docs/compare.md).
OCCASIONAL = ("ttft_load_ratio",)
# A search's max_rate bounds what it can find, not what it measures: searches under
# different ones are matched, and where one stopped at its max_rate the capacity is judged
# as the bound it is (compare.capacity).
MATCH_KEY = tuple(c for c in CASE_KEY if c != "capacity_max_rate")
REQUIRED_KEY = tuple(c for c in MATCH_KEY if c not in OPTIONAL_COLUMNS)
KEY_SEP = "\x1f"  # joins a case's key values into one index label


def case_of(key: str) -> dict[str, str]:
    """A case's key values by column, from its joined key."""
    return dict(zip(MATCH_KEY, key.split(KEY_SEP)))


def case_label(case: dict[str, str]) -> str:
    """A case in a few words: its scenario, engine configuration and shape."""
    lora = engine_name(
        *(case[c] for c in ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras")),
        case.get("enforce_eager"),
        case.get("graph_config"),
        case.get("enable_prefix_caching"),
        case.get("engine_variant"),
    )
    if case.get("trace_suite"):
        churn = f" churn{case['churn_rate']}" if case.get("churn_rate") else ""
        return (
            f"{case['scenario']} {lora} {case['trace_suite']} n{case['trace_num_adapters']} "
            f"a{case['trace_alpha']} cv{case['trace_cv']} r{case['trace_rate']}{churn}"
        )
    where = "".join(
        f" {prefix}{case[column]}" for column, prefix in (("tier", ""), ("working_set", "ws")) if case.get(column)
    )
    return f"{case['scenario']} {lora}{where} bs{case['batch_size']} in{case['input_len']} out{case['output_len']}"
