"""The release chain's table (docs/releases.md): a row per vLLM release from the runs
``scripts/releases.sh`` made, and, with ``--order DB``, the history store's stack ids in
release order (what ``lorabench history --order`` reads).

    python scripts/releases_table.py results/releases/vllm-*.csv
    python scripts/releases_table.py --order results/releases/history.sqlite

Each figure is one build's (the chain runs ``--bench-builds 1``) on the built-in tiny model:
what a release moved on this CPU, not what it does on an NPU.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

import pandas as pd
from packaging.version import Version

from lorabench.results.records import digests_path_for, is_companion

# The case each column reads: decode of the no-LoRA batch on the LoRA-off build, LoRA's
# overhead on 8 distinct adapters, a load from disk, all on the loras8 configuration.
BATCH = 8


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="*", type=Path, help="the chain's result files, one a release")
    parser.add_argument("--order", type=Path, metavar="DB", help="print DB's stack ids, oldest vLLM first")


def _one(rows: pd.DataFrame, column: str) -> float | None:
    values = rows[column].dropna()
    return float(values.median()) if len(values) else None


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def row(run: pd.DataFrame) -> dict[str, str]:
    """One release's figures; blank where the run has no such case."""
    by = run.groupby("scenario")
    empty = run.iloc[0:0]
    no_lora, multi = by.get_group("no_lora") if "no_lora" in by.groups else empty, by.get_group("multilora")
    base = no_lora[(no_lora.enable_lora != True) & (no_lora.batch_size == BATCH)]  # noqa: E712 - NaN-safe
    distinct = multi[(multi.workload == "distinct") & (multi.batch_size == BATCH) & (multi.num_adapters == BATCH)]
    residency = by.get_group("residency") if "residency" in by.groups else empty
    disk = residency[(residency.tier == "disk") & (residency.max_loras == residency.max_loras.max())]
    iso = by.get_group("isolation") if "isolation" in by.groups else empty
    broken = int(iso.isolation_broken.sum()) if len(iso) else None
    reload = int(iso.isolation_reload_broken.sum()) if len(iso) else None
    return {
        "vLLM": str(run.vllm_version.iloc[0]),
        "torch": str(run.torch_version.iloc[0]),
        "no-LoRA decode ms": _ms(_one(base, "decode_ms_p50")),
        "LoRA overhead": "" if (v := _one(distinct, "lora_overhead")) is None else f"{v:.2f}",
        "load from disk ms": _ms(_one(disk, "disk_load_ms")),
        "isolation breaches": "" if broken is None else str(broken),
        "reload in place": "" if reload is None else ("BROKEN" if reload else "ok"),
    }


def digests(path: Path) -> dict[tuple[str, str], str]:
    """(configuration, adapter) -> the digest of its greedy answer."""
    table = pd.read_csv(path)
    config = table.engine_id.str.replace(r"-build\d+$", "", regex=True)
    return dict(zip(zip(config, table.adapter), table.digest))


def changed(before: dict, after: dict) -> str:
    common = sorted(set(before) & set(after))
    if not common:
        return ""
    moved = sum(before[k] != after[k] for k in common)
    return f"{moved} of {len(common)}"


def table(paths: list[Path]) -> list[str]:
    paths = [p for p in paths if not is_companion(p)]  # a glob of the folder matches its digests files too
    runs = sorted(((pd.read_csv(p), p) for p in paths), key=lambda r: Version(str(r[0].vllm_version.iloc[0])))
    rows, previous = [], None
    for run, path in runs:
        line = row(run)
        answers = digests(digests_path_for(path)) if digests_path_for(path).is_file() else None
        line["answers changed vs previous"] = changed(previous, answers) if previous and answers else ""
        previous = answers or previous
        rows.append(line)
    heads = list(rows[0])
    return ["| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"] + [
        "| " + " | ".join(r[h] for h in heads) + " |" for r in rows
    ]


def order(db: Path) -> list[str]:
    """``stack_id vllm_version`` lines, oldest vLLM first."""
    with sqlite3.connect(db) as conn:
        stacks = {sid: json.loads(stack) for sid, stack in conn.execute("SELECT DISTINCT stack_id, stack FROM runs")}
    ranked = sorted(stacks.items(), key=lambda s: Version(s[1].get("vllm_version", "0")))
    return [f"{sid} vllm {stack.get('vllm_version', '?')}" for sid, stack in ranked]


def main(args: argparse.Namespace) -> int:
    if args.order:
        print("\n".join(order(args.order)))
        return 0
    if not args.runs:
        print("releases_table: give the chain's result files, or --order DB", file=sys.stderr)
        return 2
    print("\n".join(table(args.runs)))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
