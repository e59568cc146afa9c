"""``--bench-fleet-check``: the session measures interference instead of running the grid
(``lorabench.fleet.check`` says how and how it is judged). Its workers' rows stay in their
folders, out of any run: they measure the node, not the configuration."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from lorabench.fleet.check import METRICS, PAIRS, ROLE_ENV, lines, pair_ratio, verdict
from lorabench.fleet.devices import Slot
from lorabench.fleet.tasks import ROWS_FILE, Attempt, Callbacks, Fleet, Task


def probe_of(tasks: Sequence[Task]) -> Task:
    """The configuration checked: the session's first with LoRA, else its first."""
    return next((t for t in tasks if not t.engine_id.startswith("lora-off")), tasks[0])


def run_check(
    slots: Sequence[Slot],
    tasks: Sequence[Task],
    launch: Callable[[Sequence[Slot], list[Task], Path], Fleet],
    folder: Path,
    say: Callable[[str], None],
    pairs: int = PAIRS,
) -> list[str]:
    """Alone and beside, ``pairs`` times, in alternating order; the summary's lines."""
    probe = probe_of(tasks)
    alone = [replace(probe, env=((ROLE_ENV, "alone"),))]
    beside = [replace(probe, copy=k, env=((ROLE_ENV, "beside"),)) for k in range(len(slots))]
    ratios: dict[str, list[float]] = {m: [] for m in METRICS}
    for pair in range(pairs):
        order = [("alone", slots[:1], alone), ("beside", slots, beside)]
        measured = {}
        for side, used, copies in order if pair % 2 == 0 else order[::-1]:
            say(f"fleet check: pair {pair + 1} of {pairs}, {probe.engine_id} {side}")
            measured[side], lonely = _phase(launch(used, copies, folder / f"pair{pair + 1}-{side}"), len(copies) - 1)
            if lonely:
                say(
                    f"fleet check: pair {pair + 1}: {lonely} case(s) of {probe.engine_id} measured while not every "
                    "neighbour ran (one died, or had not started or had ended): left out of the pair"
                )
        for metric in METRICS:
            ratio = pair_ratio(measured["alone"].get(metric, {}), measured["beside"].get(metric, {}))
            if ratio is not None:
                ratios[metric].append(ratio)
    verdicts = [v for v in (verdict(m, ratios[m]) for m in METRICS) if v is not None]
    return lines(probe.engine_id, len(slots) - 1, verdicts, on_the_cpu=slots[0].device_type == "cpu")


def _phase(fleet: Fleet, neighbours: int) -> tuple[dict[str, dict[str, float]], int]:
    """Run one side; the probe's (copy 0's) latencies by metric and case, and how many of
    its cases were left out: beside, a case counts only if each of the ``neighbours`` other
    copies ran on the node while it was measured (a copy that died, and its retry that ran
    after, would have it measured alone and called "beside")."""
    probes: list[Attempt] = []

    def ended(attempt: Attempt, final: bool) -> None:
        if not attempt.task.copy and (attempt.folder / ROWS_FILE).is_file():
            probes.append(attempt)

    fleet.on = Callbacks(report=lambda data: None, say=fleet.on.say, ended=ended, lost=fleet.on.lost)
    fleet.run()
    measured: dict[str, dict[str, float]] = {}
    lonely = 0
    for attempt in probes:
        rows = pd.read_csv(attempt.folder / ROWS_FILE)
        crowded = [_beside_all(attempt, fleet.attempts, case, neighbours) for case in rows["test_id"]]
        lonely += crowded.count(False)
        rows = rows[crowded]
        for metric in METRICS:
            if metric in rows:
                kept = rows.dropna(subset=[metric])
                measured.setdefault(metric, {}).update(zip(kept["test_id"], kept[metric]))
    return measured, lonely


def _beside_all(probe: Attempt, attempts: Sequence[Attempt], case: str, neighbours: int) -> bool:
    """Whether every other copy (1 .. ``neighbours``) ran beside ``probe`` while ``case`` was measured."""
    start, stop = probe.windows.get(case, (probe.started, probe.ended or time.time()))
    beside = {a.task.copy for a in attempts if a.task.copy and probe.beside(a, start, stop)}
    return beside >= set(range(1, neighbours + 1))
