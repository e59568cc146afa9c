"""Resolve a configuration's paths, read the files it names and check them before any engine starts.

Everything that can be checked without an engine is checked here, so a typo costs
seconds instead of an engine start-up: model and adapter folders, ranks against
``max_lora_rank``, adapters enough for each workload, lengths against the model's limit,
online suites, engine arguments against vLLM's own, and the result files.
"""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path

from lorabench.config.expand import BenchConfig, as_list, shape_of
from lorabench.config.generated import check_generation
from lorabench.config.read import ConfigError, check_against_vllm, read_json
from lorabench.config.schema import ConfigFile, GeneratedAdapters
from lorabench.config.traces import check_traces, length_limit
from lorabench.load import builtin
from lorabench.load.adapters import Adapter, read_adapters_file, read_rank
from lorabench.load.workload import pool_size
from lorabench.results.records import SAMPLE_COLUMNS, samples_path_for
from lorabench.results.schema import COLUMNS


def _resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def resolve_config(
    path: Path,
    parsed: ConfigFile,
    *,
    needs_lora: bool,
    output: str | None = None,
    engine_args: Callable[[], frozenset[str]] | None = None,
    runs: Collection[str] | None = None,
) -> BenchConfig:
    """Resolve paths, read the adapter and prompt files and check them against the matrix.

    Built-in models and generated adapters are materialized in the cache on first use.
    ``output`` comes from the command line, so it is relative to the working directory.
    ``runs``: the scenarios the selection runs (None: all). Every section is checked, but the
    problems of a section only other scenarios read (online, capacity, churn, working_set) are
    warnings naming the selection that would refuse them, not a refusal of this one.
    ``engine_args``: vLLM's engine argument names, from the caller that knows the engine
    (``lorabench.targets.vllm_args.engine_arg_names``), so config never reaches the engine
    layer itself; None leaves the engine arguments unchecked (a URL target's server has its own).
    """
    path = Path(path).resolve()
    base = path.parent
    problems = check_against_vllm(parsed, path, engine_args) if engine_args else []
    model, is_builtin = _model(path, parsed, problems)
    tokenizer = _resolve(base, parsed.tokenizer) if parsed.tokenizer else None
    if tokenizer is not None and not tokenizer.exists():
        problems.append(f"{path}: field 'tokenizer': {tokenizer} does not exist")
    prompts: list[str] = []
    try:
        prompts = _read_prompts(path, _resolve(base, parsed.prompts))
    except ConfigError as exc:
        problems += exc.problems
    adapters, warnings = _adapters_and_sections(path, parsed, model, prompts, problems, needs_lora, runs)
    results_dir, out_path = _outputs(path, parsed, output, problems)
    if problems:
        raise ConfigError(problems)
    return BenchConfig(
        path=path,
        file=parsed,
        model=model,
        tokenizer=tokenizer,
        is_builtin_model=is_builtin,
        adapters=tuple(adapters),
        prompts=tuple(prompts),
        results_dir=results_dir,
        output=out_path,
        warnings=tuple(warnings),
    )


def _adapters_and_sections(
    path: Path,
    parsed: ConfigFile,
    model: Path,
    prompts: list[str],
    problems: list[str],
    needs_lora: bool,
    runs: Collection[str] | None,
) -> tuple[list[Adapter], list[str]]:
    """The adapters, with the problems of what depends on them added to ``problems``; and
    the warnings of sections this selection does not run."""
    if not problems:  # a usable model: what would be generated for it is checked before it is
        problems += check_generation(path, parsed, model)
    generated_later = isinstance(parsed.adapters, GeneratedAdapters) and bool(problems)
    before = len(problems)
    adapters = _adapters(path, parsed, model, prompts, problems)
    by_section: dict[str, list[str]] = {}
    if generated_later:
        # Adapters are generated for a usable model only: what depends on them is checked once it is,
        # rather than reported now as "no adapters" on top of the model's own problem.
        count = parsed.adapters.generate.count
    elif len(problems) > before:  # the adapters file did not read: its problem is said once,
        count = sys.maxsize  # not again as "only 0 adapters are configured" by each section counting them
    else:
        problems += _check_adapters(path, parsed, adapters, needs_lora)
        count = len(adapters)
        by_section = _sections_needing_adapters(path, parsed, count, needs_lora)
    problems += _check_lengths(path, parsed, model)
    for section, found in check_traces(path, parsed, count, length_limit(parsed, model)).items():
        by_section[section] = by_section.get(section, []) + found
    refused, warnings = _by_selection(by_section, runs)
    problems += refused
    return adapters, warnings


def _outputs(path: Path, parsed: ConfigFile, output: str | None, problems: list[str]) -> tuple[Path, Path | None]:
    """The results folder and the fixed output file, if any: ``output`` from the command line
    is relative to the working directory, the config's fields to the config's folder."""
    base = path.parent
    if output is not None:
        out_path: Path | None = Path(output).resolve()
    else:
        out_path = _resolve(base, parsed.output) if parsed.output else None
    results_dir = _resolve(base, parsed.results_dir)
    problems += _check_outputs(path, results_dir, out_path, output is not None)
    return results_dir, out_path


def _model(path: Path, parsed: ConfigFile, problems: list[str]) -> tuple[Path, bool]:
    """The model folder (a built-in one made now), and whether it is built in."""
    if parsed.model.startswith(builtin.PREFIX):
        try:
            return builtin.ensure_model(parsed.model[len(builtin.PREFIX) :]), True
        except KeyError:
            raise ConfigError(
                [
                    f"{path}: field 'model' has bad value {parsed.model!r}: "
                    f"built-in models are {', '.join(builtin.PREFIX + m for m in builtin.MODELS)}"
                ]
            ) from None
    model = _resolve(path.parent, parsed.model)
    if not model.is_dir():
        problems.append(f"{path}: field 'model': directory {model} does not exist: point it at a local model folder")
    elif not (model / "config.json").is_file():
        problems.append(f"{path}: field 'model': {model} has no config.json: point it at a Hugging Face model folder")
    else:
        problems += _check_weights(path, parsed, model)
    return model, False


def _adapters(path: Path, parsed: ConfigFile, model: Path, prompts: list[str], problems: list[str]) -> list[Adapter]:
    if isinstance(parsed.adapters, GeneratedAdapters):
        if problems:
            return []
        spec = parsed.adapters.generate
        return builtin.ensure_dummy_adapters(
            model, prompts, count=spec.count, ranks=spec.ranks, target_modules=spec.target_modules, seed=spec.seed
        )
    try:
        return read_adapters_file(_resolve(path.parent, parsed.adapters))
    except ValueError as exc:
        problems.append(f"{path}: field 'adapters': {exc}")
        return []


# What vLLM's default loaders read; a folder with none of these fails inside the engine.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def _check_weights(path: Path, parsed: ConfigFile, model: Path) -> list[str]:
    """A folder with config.json and no weights runs only with random weights of its shape."""
    load_format = (parsed.engine.model_extra or {}).get("load_format", "auto")
    if load_format == "dummy" or any(next(model.glob(p), None) for p in WEIGHT_PATTERNS):
        return []
    return [
        f"{path}: field 'model': {model} has a config.json but no weight files ({', '.join(WEIGHT_PATTERNS)}): "
        'add the weights, or set engine.load_format to "dummy" to benchmark random weights of this shape'
    ]


def _writable_dir(folder: Path) -> bool:
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    return existing is not None and existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def _check_outputs(path: Path, results_dir: Path, output: Path | None, from_cli: bool) -> list[str]:
    """Result files are written after an engine has run: check now that they can be."""
    field = "--bench-output" if from_cli else "field 'output'"
    if output is None:
        if not _writable_dir(results_dir):
            return [
                f"{path}: field 'results_dir': cannot create result files in {results_dir}: choose a writable folder"
            ]
        return []
    if output.is_dir() or not _writable_dir(output.parent):
        return [f"{path}: {field}: cannot write the CSV file {output}: name a file in a writable folder"]
    for file, columns in ((output, COLUMNS), (samples_path_for(output), SAMPLE_COLUMNS)):
        if file.is_file() and file.stat().st_size:
            with file.open(encoding="utf-8", newline="") as f:
                header = next(csv.reader(f), [])
            if tuple(header) != columns:
                return [
                    f"{path}: {field}: {file} exists and is not a lorabench results file of this version "
                    "(other columns): name a new file, or leave 'output' unset for a new file per run"
                ]
    return []


def _read_prompts(config: Path, path: Path) -> list[str]:
    if not path.is_file():
        raise ConfigError([f"{config}: field 'prompts': {path} not found: point it at a JSON list of prompts"])
    prompts = read_json(path)
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ConfigError([f"{config}: field 'prompts': {path} is not a non-empty JSON list of non-empty strings"])
    return prompts


def _check_adapters(path: Path, parsed: ConfigFile, adapters: list[Adapter], needs_lora: bool) -> list[str]:
    problems = []
    if needs_lora and not adapters:
        return [
            f"{path}: field 'adapters': no adapters, but multi-LoRA cases were selected: add adapters or run -k no_lora"
        ]
    for i, adapter in enumerate(adapters):
        try:
            rank = read_rank(adapter.path)
        except ValueError as exc:
            problems.append(f"{path}: adapter '{adapter.name}': {exc}")
            continue
        adapters[i] = replace(adapter, rank=rank)
        for max_rank in as_list(parsed.engine.max_lora_rank):
            if rank > max_rank:
                problems.append(
                    f"{path}: adapter '{adapter.name}' has rank {rank}, above engine.max_lora_rank={max_rank}: "
                    f"raise max_lora_rank to at least {rank} or drop the adapter"
                )
    biggest = max(parsed.matrix.batch_sizes)
    for workload in parsed.matrix.workloads if needs_lora else ():
        need = pool_size(workload, biggest, shape_of(parsed))
        if len(adapters) < need:
            problems.append(
                f"{path}: field 'matrix.batch_sizes': the '{workload}' workload needs {need} adapters "
                f"at batch size {biggest}, but only {len(adapters)} are configured: "
                "add adapters or lower the batch size"
            )
    return problems


def _by_selection(by_section: dict[str, list[str]], runs: Collection[str] | None) -> tuple[list[str], list[str]]:
    """A section's problems refuse the run when the selection runs its scenario, saying so and how
    to leave it out; otherwise they are warnings that say which selection would refuse them."""
    refused, warnings = [], []
    for section, found in by_section.items():
        if runs is None:
            refused += found
        elif section in runs:
            refused += [f"{p} (this selection runs {section}; -k 'not {section}' leaves it out)" for p in found]
        else:
            warnings += [f"{p} (not run by this selection; -k {section} would refuse it)" for p in found]
    return refused, warnings


def _sections_needing_adapters(
    path: Path, parsed: ConfigFile, configured: int, needs_lora: bool
) -> dict[str, list[str]]:
    """The working_set section's adapter count (churn's is checked with its traces)."""
    found: dict[str, list[str]] = {"working_set": []}
    if parsed.working_set and needs_lora and max(parsed.working_set.sizes) > configured:
        found["working_set"].append(
            f"{path}: field 'working_set.sizes' has bad value {max(parsed.working_set.sizes)}: only "
            f"{configured} adapters are configured: add adapters or lower it"
        )
    return found


def _check_lengths(path: Path, parsed: ConfigFile, model: Path) -> list[str]:
    input_len = parsed.matrix.input_len
    limit, source = length_limit(parsed, model)
    if input_len is None or limit is None:
        return []
    prefix = parsed.matrix.shared_prefix_len
    if prefix > limit:
        return [
            f"{path}: field 'matrix.shared_prefix_len' has bad value {prefix}: longer than {source} = {limit}: "
            "shorten it (and input_len)"
        ]
    total = input_len + parsed.matrix.output_len
    if total > limit:
        return [
            f"{path}: field 'matrix.input_len': input_len + output_len = {total} exceeds {source} = {limit}: "
            f"shorten the requests or raise the limit"
        ]
    return []
