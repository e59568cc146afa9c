"""The online cases a config asks for: each trace shape (synthetic, or an imported trace
file) at each rate, with the trace columns each case fills (``lorabench.results.schema``,
group "trace")."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from lorabench.config.schema import ConfigFile
from lorabench.config.trace_sections import TraceShape
from lorabench.load.traces import data as trace_data
from lorabench.load.traces import synthetic as trace
from lorabench.load.traces import transforms
from lorabench.load.traces.synthetic import TraceParams, TraceRequest

# The trace columns (lorabench.results.schema, group "trace") every online case fills...
ONLINE_TRACE_COLUMNS = frozenset(
    {"trace_suite", "trace_num_adapters", "trace_rate", "trace_duration_s", "trace_warmup_s"}
)
# ...those a synthetic trace fills with its parameters...
SYNTHETIC_TRACE_COLUMNS = frozenset(
    {"trace_alpha", "trace_cv", "trace_lengths", "trace_input_range", "trace_output_range", "trace_seed"}
)
# ...and those an imported trace fills with its file.
IMPORTED_TRACE_COLUMNS = frozenset({"trace_file", "trace_sha256", "trace_start_s"})
# Filled by some online cases only: the scenario's maybe_columns.
MAYBE_TRACE_COLUMNS = SYNTHETIC_TRACE_COLUMNS | IMPORTED_TRACE_COLUMNS


@dataclass(frozen=True)
class OnlineCase:
    """One synthetic trace to replay: it owns where its requests come from and the columns that say so."""

    suite: str
    params: TraceParams

    @property
    def shape_id(self) -> str:
        """The trace without its rate: what a capacity search varies the rate of."""
        p = self.params
        return f"{self.suite}-n{p.num_adapters}-a{p.alpha:g}-cv{p.cv:g}"

    @property
    def id(self) -> str:
        return f"{self.shape_id}-r{self.params.rate:g}"

    def at(self, rate: float, duration: float) -> OnlineCase:
        return replace(self, params=replace(self.params, rate=rate, duration=duration))

    @property
    def num_adapters(self) -> int:
        return self.params.num_adapters

    @property
    def duration(self) -> float:
        return self.params.duration

    @property
    def seed(self) -> int:
        """The seed of the trace, and of its prompts' tokens."""
        return self.params.seed

    def located(self, config_dir: Path) -> OnlineCase:
        """A synthetic trace names no file: itself."""
        return self

    def requests(self, adapters: Sequence[str]) -> list[TraceRequest]:
        return trace.generate(self.params, adapters)

    def fields(self, warmup_s: float) -> dict[str, Any]:
        p = self.params
        return {
            "trace_suite": self.suite,
            "trace_num_adapters": p.num_adapters,
            "trace_rate": p.rate,
            "trace_alpha": p.alpha,
            "trace_cv": p.cv,
            "trace_duration_s": p.duration,
            "trace_lengths": p.lengths,
            "trace_input_range": f"{p.input_range[0]}-{p.input_range[1]}",
            "trace_output_range": f"{p.output_range[0]}-{p.output_range[1]}",
            "trace_seed": p.seed,
            "trace_warmup_s": warmup_s,
        }


@dataclass(frozen=True)
class ImportedCase:
    """One replay of an imported trace (``lorabench trace import``): from ``start`` seconds on,
    time-scaled so that ``duration`` seconds of it arrive at mean rate ``rate``.

    The trace's adapters go, in its header's order, to the adapters ``requests`` is given:
    the config's first N. Its file is read when first needed, once ``located`` has made
    its path absolute, so collecting the case reads nothing."""

    suite: str
    trace: Path
    rate: float
    duration: float
    start: float = 0.0
    # False: the trace's hash ids are not replayed as shared prefixes (TraceShape.shared_prefixes).
    shared_prefixes: bool | None = None

    @property
    def shape_id(self) -> str:
        start = f"-s{self.start:g}" if self.start else ""
        return f"{self.suite}-{self.trace.stem}{start}"

    @property
    def id(self) -> str:
        return f"{self.shape_id}-r{self.rate:g}"

    def at(self, rate: float, duration: float) -> ImportedCase:
        """The same trace at another rate, sharing the file this case has read already
        (a capacity search asks for one per probe)."""
        moved = replace(self, rate=rate, duration=duration)
        if "data" in self.__dict__:
            moved.__dict__["data"] = self.__dict__["data"]
        return moved

    @cached_property
    def data(self) -> trace_data.TraceData:
        return trace_data.load(self.trace)

    @property
    def num_adapters(self) -> int:
        return len(self.data.adapters)

    @property
    def seed(self) -> int:
        """The seed of the prompts' tokens: a trace has lengths, not content."""
        return 0

    def located(self, config_dir: Path) -> ImportedCase:
        """The case with its trace's path resolved against the config file's folder."""
        return replace(self, trace=config_dir / self.trace)

    def requests(self, adapters: Sequence[str]) -> list[TraceRequest]:
        if len(adapters) < self.num_adapters:
            raise ValueError(f"the trace needs {self.num_adapters} adapters, {len(adapters)} are available")
        window = transforms.replay_window(self.data, self.start, self.duration, self.rate)
        if self.shared_prefixes is False:
            window = replace(window, hash_ids=None)
        return replace(window, adapters=list(adapters[: self.num_adapters])).requests()

    def fields(self, warmup_s: float) -> dict[str, Any]:
        return {
            "trace_suite": self.suite,
            "trace_num_adapters": self.num_adapters,
            "trace_rate": self.rate,
            "trace_duration_s": self.duration,
            "trace_warmup_s": warmup_s,
            "trace_file": self.trace.name,
            "trace_sha256": trace_data.file_sha256(self.trace),
            "trace_start_s": self.start,
        }


def trace_cases(shape: TraceShape, rates: Sequence[float], duration: float) -> list[OnlineCase | ImportedCase]:
    """Every combination of a synthetic shape's lists with each rate; each rate of an imported one."""
    if shape.trace is not None:
        return [
            ImportedCase(shape.name, Path(shape.trace), r, duration, shape.start, shape.shared_prefixes) for r in rates
        ]
    combinations = itertools.product(shape.num_adapters, shape.alpha, shape.cv, rates)
    return [
        OnlineCase(
            shape.name,
            TraceParams(
                num_adapters=n,
                rate=rate,
                alpha=alpha,
                cv=cv,
                input_range=shape.input_range,
                output_range=shape.output_range,
                lengths=shape.lengths,
                duration=duration,
                seed=shape.seed,
            ),
        )
        for n, alpha, cv, rate in combinations
    ]


def online_cases(file: ConfigFile) -> list[OnlineCase | ImportedCase]:
    """Every case of every online suite."""
    suites = file.online.suites if file.online else ()
    return [case for suite in suites for case in trace_cases(suite, suite.rate, suite.duration)]
