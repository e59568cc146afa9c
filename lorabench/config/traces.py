"""Checks of the traces a config replays: the online suites' and the capacity search's shapes.

Each shape must have the adapters it labels requests with, requests that fit the model,
and room to measure after its warm-up. An imported trace's file must read, and each rate
it is replayed at must leave requests in its window; a capacity search's rates are not
known before it runs, so its trace is checked whole from ``start`` on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from lorabench.config.schema import ConfigFile
from lorabench.config.trace_sections import Churn, TraceShape
from lorabench.load.traces.data import TraceData, header_adapters
from lorabench.load.traces.data import load as load_trace
from lorabench.load.traces.transforms import from_start, replay_window

# An imported suite's window replays ``round(rate * duration)`` requests; a product further
# than this share from a whole number would replay another rate than the row says.
WHOLE = 1e-6

Limit = tuple[int | None, str]


def length_limit(parsed: ConfigFile, model: Path) -> Limit:
    """The model's longest request in tokens, and where that figure comes from."""
    limit = (parsed.engine.model_extra or {}).get("max_model_len")
    if limit is not None:
        return limit, "engine.max_model_len"
    try:
        limit = json.loads((model / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, json.JSONDecodeError):
        return None, ""
    return limit, f"{model / 'config.json'} max_position_embeddings"


def check_traces(path: Path, parsed: ConfigFile, configured: int, limit: Limit) -> dict[str, list[str]]:
    """The problems of the sections that replay traces, by the scenario that runs each."""
    found: dict[str, list[str]] = {"online": [], "capacity": [], "churn": []}
    if parsed.online is not None:
        for i, suite in enumerate(parsed.online.suites):
            field = f"online.suites[{i}]"
            found["online"] += _check_shape(path, field, suite, configured, limit, suite.rate, suite.duration)
            if parsed.online.warmup_s >= suite.duration:
                found["online"].append(
                    f"{path}: field 'online.warmup_s' has bad value {parsed.online.warmup_s}: it leaves nothing of "
                    f"suite '{suite.name}' ({suite.duration:g} s) to measure"
                )
    if parsed.churn is not None:  # its working set is the first adapters; the churn ones come after
        for i, suite in enumerate(parsed.churn.suites):
            field = f"churn.suites[{i}]"
            found["churn"] += _check_shape(path, field, suite, configured, limit, suite.rate, suite.duration)
        found["churn"] += _check_churned(path, parsed.churn, configured)
    block = parsed.capacity
    if block is not None:
        for i, shape in enumerate(block.shapes):
            field = f"capacity.shapes[{i}]"
            found["capacity"] += _check_shape(
                path, field, shape, configured, limit, (), block.probe_duration_s, min_rate=block.min_rate
            )
    return found


def _check_churned(path: Path, churn: Churn, configured: int) -> list[str]:
    """A churn case cycles adapters after its trace's working set (a synthetic suite's
    ``num_adapters``, a trace file's header): the config must have them all."""
    sizes = []
    for suite in churn.suites:
        if suite.trace is None:
            sizes += suite.num_adapters or []
            continue
        try:
            sizes.append(len(header_adapters((path.parent / suite.trace).resolve())))
        except (OSError, KeyError, TypeError, ValueError):
            continue  # the suite's own check says why the file does not read
    largest = max(sizes, default=0)
    if largest + churn.adapters <= configured:
        return []
    return [
        f"{path}: field 'churn.adapters' has bad value {churn.adapters}: with a trace of {largest} adapters it "
        f"needs {largest + churn.adapters}, but only {configured} are configured: add adapters or lower it"
    ]


def _check_shape(
    path: Path,
    field: str,
    shape: TraceShape,
    configured: int,
    limit: Limit,
    rates: Sequence[float],
    duration: float,
    min_rate: float | None = None,
) -> list[str]:
    if shape.trace is not None:
        return _check_imported(path, field, shape, configured, limit, rates, duration, min_rate)
    problems = []
    if max(shape.num_adapters) > configured:
        problems.append(
            f"{path}: field '{field}.num_adapters' has bad value {max(shape.num_adapters)}: only "
            f"{configured} adapters are configured: add adapters or lower it"
        )
    total = shape.input_range[1] + shape.output_range[1]
    if limit[0] is not None and total > limit[0]:
        problems.append(
            f"{path}: field '{field}.input_range': the longest request, {total} tokens, exceeds {limit[1]} = {limit[0]}"
        )
    return problems


def _check_imported(
    path: Path,
    field: str,
    shape: TraceShape,
    configured: int,
    limit: Limit,
    rates: Sequence[float],
    duration: float,
    min_rate: float | None,
) -> list[str]:
    """The file reads, its adapters map onto the config's first N (by position: the
    trace's i-th onto the config's i-th), ``start`` is before its last request, every
    rate's window exists and its requests fit the model (the whole trace from ``start``
    when no rate is given: a capacity search's, whose probes at ``min_rate`` must find
    ``min_rate * duration`` requests)."""
    file = (path.parent / shape.trace).resolve()
    where = f"{path}: field '{field}.trace'"
    try:
        data = load_trace(file)
    except ValueError as exc:
        return [f"{where}: {exc}"]
    problems = []
    if len(data.adapters) > configured:
        problems.append(
            f"{where}: {file.name} labels requests with {len(data.adapters)} adapters, only {configured} are "
            "configured (its i-th adapter replays as the config's i-th): add adapters or import with fewer"
        )
    if not len(data):
        return [*problems, f"{where}: {file.name} holds no request: write it again with more"]
    if shape.shared_prefixes and data.hash_ids is None:
        problems.append(
            f"{path}: field '{field}.shared_prefixes' has bad value true: {file.name} was imported without hash ids: "
            "import it again keeping them (mooncake's hash_ids, or a csv's --prefix-column), or drop 'shared_prefixes'"
        )
    if shape.start > data.arrival_s[-1]:
        return [
            *problems,
            f"{path}: field '{field}.start' has bad value {shape.start:g}: {file.name}'s last request arrives at "
            f"{data.arrival_s[-1]:g} s: start before it",
        ]
    return problems + _check_windows(path, field, shape, data, limit, rates, duration, min_rate)


def _check_windows(
    path: Path,
    field: str,
    shape: TraceShape,
    data: TraceData,
    limit: Limit,
    rates: Sequence[float],
    duration: float,
    min_rate: float | None,
) -> list[str]:
    """Each rate's window exists and fits the model; without rates, the trace from ``start`` on."""
    problems, windows = [], []
    for rate in rates:
        asked, sent = rate * duration, round(rate * duration)
        if abs(asked - sent) > WHOLE * asked:
            problems.append(
                f"{path}: field '{field}.rate' has bad value {rate:g}: over {duration:g} s it is {asked:g} "
                f"requests, and a replay sends {sent} ({sent / duration:g} req/s): "
                "pick a rate and duration whose product is a whole number of requests"
            )
            continue
        try:
            windows.append((f" at rate {rate:g}", replay_window(data, shape.start, duration, rate)))
        except ValueError as exc:
            problems.append(f"{path}: field '{field}.rate' has bad value {rate:g}: {exc}")
    if not rates:
        rest = from_start(data, shape.start)
        windows.append(("", rest))
        if min_rate is not None and len(rest) / duration <= min_rate:
            problems.append(
                f"{path}: field '{field}.trace': from {shape.start:g} s on it holds {len(rest)} requests, too few "
                f"for a {duration:g} s probe at {min_rate:.3g} requests/s (the lowest rate a probe can judge): "
                "import a longer trace or an earlier start"
            )
    for said, kept in windows:
        longest = int((kept.input_len + kept.output_len).max())
        if limit[0] is not None and longest > limit[0]:
            problems.append(
                f"{path}: field '{field}.trace': the longest request{said}, {longest} tokens, exceeds "
                f"{limit[1]} = {limit[0]}: import it again with --max-model-len {limit[0]}"
            )
    return problems
