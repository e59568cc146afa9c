"""Read, validate and resolve a benchmark configuration (``config/common.json``).

Everything that can be checked without an engine is checked here, so a typo costs
seconds instead of an engine start-up. Problems are collected and reported together,
each naming the file, the field, the bad value and what to do about it.
"""

from __future__ import annotations

import csv
import difflib
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
)

from lorabench import builtin
from lorabench.adapters import Adapter, read_adapters_file, read_rank
from lorabench.results import COLUMNS, SAMPLE_COLUMNS, samples_path_for
from lorabench.trace import TraceParams
from lorabench.workload import pool_size

WORKLOADS = ("distinct", "uniform", "identical")
Workload = Literal["distinct", "uniform", "identical"]
DeviceType = Literal["cpu", "cuda", "npu"]
# vLLM rejects any other value of max_lora_rank when the engine starts.
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
LORA_KEYS = ("max_loras", "max_lora_rank", "max_cpu_loras")
# Set by lorabench itself: the measurements depend on them.
RESERVED_ENGINE_KEYS = {
    "model": "set the top-level 'model' field instead",
    "tokenizer": "set the top-level 'tokenizer' field instead",
    "enable_lora": "lorabench enables LoRA per engine configuration",
    "disable_log_stats": "lorabench needs per-request stats and turns them on",
    "enable_prefix_caching": "lorabench turns prefix caching off so rounds are comparable",
}
COMMENT_PREFIX = "//"


class ConfigError(Exception):
    """A configuration that cannot be run; the message lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


IntOrList = Union[PositiveInt, list[PositiveInt]]


class EngineArgs(BaseModel):
    """Keyword arguments for ``vllm.LLM``; the three LoRA knobs may be lists."""

    model_config = ConfigDict(extra="allow", frozen=True)

    max_loras: IntOrList = 4
    max_lora_rank: Union[LoraRank, list[LoraRank]] = 16
    max_cpu_loras: IntOrList | None = None

    @field_validator("max_loras", "max_lora_rank", "max_cpu_loras")
    @classmethod
    def _no_repeats(cls, value: Any) -> Any:
        return _unique(value)


class Matrix(_Strict):
    batch_sizes: list[PositiveInt] = Field(min_length=1)
    workloads: list[Workload] = Field(default=list(WORKLOADS), min_length=1)
    # Two tokens at least: decode time is measured between the first and the last.
    output_len: int = Field(ge=2)
    input_len: PositiveInt | None = None
    warmup_rounds: NonNegativeInt = 1
    rounds: PositiveInt = 3
    # Each engine configuration is built this many times per run. Builds of the same
    # code settle at speeds that differ more than rounds within one build do, and
    # `lorabench compare` needs at least two a side to tell that noise from a change.
    builds: PositiveInt = 2
    seed: int = 0

    @field_validator("batch_sizes", "workloads")
    @classmethod
    def _no_repeats(cls, value: Any) -> Any:
        return _unique(value)


def _unique(value: Any) -> Any:
    if isinstance(value, list) and len(set(value)) < len(value):
        repeated = sorted({v for v in value if value.count(v) > 1}, key=str)
        raise ValueError(f"{', '.join(map(str, repeated))} listed more than once: each value makes its own cases")
    return value


class DummyAdapterSpec(_Strict):
    count: PositiveInt = 8
    ranks: list[PositiveInt] = Field(default=[8, 16], min_length=1)
    target_modules: list[str] = Field(default=["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    seed: int = 0


class GeneratedAdapters(_Strict):
    generate: DummyAdapterSpec


class OnlineSuite(_Strict):
    """One sweep of synthetic traces, as in S-LoRA's experiment suites: every combination
    of the listed adapter counts, popularity exponents, burstiness and rates is a case."""

    name: str = Field(default="suite", pattern=r"^[A-Za-z0-9_.]+$")
    num_adapters: list[PositiveInt] = Field(min_length=1)
    alpha: list[PositiveFloat] = Field(default=[1.0], min_length=1)
    cv: list[PositiveFloat] = Field(default=[1.0], min_length=1)
    rate: list[PositiveFloat] = Field(min_length=1)
    duration: PositiveFloat = 300.0
    input_range: tuple[PositiveInt, PositiveInt] = (8, 64)
    output_range: tuple[PositiveInt, PositiveInt] = (8, 64)
    lengths: Literal["uniform", "longtail"] = "uniform"
    seed: int = 0

    @field_validator("input_range", "output_range")
    @classmethod
    def _ordered(cls, value: tuple[int, int]) -> tuple[int, int]:
        if value[0] > value[1]:
            raise ValueError(f"low {value[0]} is above high {value[1]}: write [low, high]")
        return value


class Online(_Strict):
    suites: list[OnlineSuite] = Field(min_length=1)
    # S-LoRA's target: first token within 6 s.
    slo_ttft_ms: PositiveFloat = 6000.0
    slo_tpot_ms: PositiveFloat = 200.0
    warmup_s: NonNegativeFloat = 0.0
    drain_timeout_s: PositiveFloat = 60.0


@dataclass(frozen=True)
class OnlineCase:
    suite: str
    params: TraceParams

    @property
    def id(self) -> str:
        p = self.params
        return f"{self.suite}-n{p.num_adapters}-a{p.alpha:g}-cv{p.cv:g}-r{p.rate:g}"


class ConfigFile(_Strict):
    """The JSON document as written; paths are still relative to its folder."""

    model: str
    tokenizer: str | None = None
    device: DeviceType | None = None
    adapters: str | GeneratedAdapters
    prompts: str
    results_dir: str = "results"
    output: str | None = None
    engine: EngineArgs = EngineArgs()
    env: dict[str, Union[str, int, float]] = {}
    matrix: Matrix
    online: Online | None = None

    def online_cases(self) -> list[OnlineCase]:
        cases = []
        for suite in self.online.suites if self.online else ():
            for n, alpha, cv, rate in itertools.product(suite.num_adapters, suite.alpha, suite.cv, suite.rate):
                params = TraceParams(
                    num_adapters=n, rate=rate, alpha=alpha, cv=cv, input_range=suite.input_range,
                    output_range=suite.output_range, lengths=suite.lengths, duration=suite.duration, seed=suite.seed,
                )
                cases.append(OnlineCase(suite.name, params))
        return cases

    def engine_specs(self, with_lora_off: bool) -> list[EngineSpec]:
        """The engine configurations to build: the cross product of the LoRA knobs."""
        specs = [EngineSpec(enable_lora=False)] if with_lora_off else []
        lists = [_as_list(getattr(self.engine, key)) for key in LORA_KEYS]
        for loras, rank, cpu in itertools.product(*lists):
            specs.append(EngineSpec(True, loras, rank, cpu if cpu is not None else loras))
        return specs

    def llm_kwargs(self) -> dict[str, Any]:
        """Engine arguments shared by every configuration (the LoRA knobs excluded)."""
        return {k: v for k, v in self.engine.model_dump().items() if k not in LORA_KEYS}


@dataclass(frozen=True)
class EngineSpec:
    """One engine configuration: what one ``vllm.LLM`` build is parametrized by."""

    enable_lora: bool
    max_loras: int | None = None
    max_lora_rank: int | None = None
    max_cpu_loras: int | None = None
    # Served through vLLM's async engine, for online replays: a build of its own.
    online: bool = False
    # Which of the run's builds of this configuration (matrix.builds) this is.
    build: int = 0

    @property
    def id(self) -> str:
        if not self.enable_lora:
            name = "lora-off"
        else:
            name = f"loras{self.max_loras}-rank{self.max_lora_rank}-cpu{self.max_cpu_loras}"
        return name + ("-online" if self.online else "") + f"-build{self.build}"

    def lora_kwargs(self) -> dict[str, Any]:
        if not self.enable_lora:
            return {"enable_lora": False}
        return {
            "enable_lora": True,
            "max_loras": self.max_loras,
            "max_lora_rank": self.max_lora_rank,
            "max_cpu_loras": self.max_cpu_loras,
        }


@dataclass(frozen=True)
class BenchConfig:
    """A validated configuration with every path resolved and every file read."""

    path: Path
    file: ConfigFile
    model: Path
    tokenizer: Path | None
    is_builtin_model: bool
    adapters: tuple[Adapter, ...]
    prompts: tuple[str, ...]
    results_dir: Path
    output: Path | None

    @property
    def matrix(self) -> Matrix:
        return self.file.matrix

    @property
    def devices_per_engine(self) -> int:
        extra = self.file.engine.model_extra or {}
        return int(extra.get("tensor_parallel_size", 1)) * int(extra.get("pipeline_parallel_size", 1))

    def llm_kwargs(self, spec: EngineSpec) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": str(self.model), "seed": self.matrix.seed}
        if self.tokenizer is not None:
            kwargs["tokenizer"] = str(self.tokenizer)
        if self.is_builtin_model:
            kwargs["load_format"] = "dummy"
        kwargs.update(self.file.llm_kwargs())
        kwargs.update(spec.lora_kwargs())
        kwargs.update(disable_log_stats=False, enable_prefix_caching=False)
        return kwargs


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _strip_comments(node: Any) -> Any:
    """Drop keys starting with ``//``: JSON has no comments, these stand in for them."""
    if isinstance(node, dict):
        return {k: _strip_comments(v) for k, v in node.items() if not k.startswith(COMMENT_PREFIX)}
    if isinstance(node, list):
        return [_strip_comments(v) for v in node]
    return node


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.isidentifier() or part in _UNION_TAGS or part[0].isupper():
            continue  # pydantic's name for a union member, not a field
        else:
            out += f".{part}" if out else part
    return out


_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict"}


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The valid keys of the object that holds ``loc``'s last part."""
    model: Any = ConfigFile
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            continue
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), model)
    return list(getattr(model, "model_fields", {}))


def _describe(error: dict[str, Any], file: Path) -> str:
    loc = tuple(error["loc"])
    field = _loc(loc)
    if error["type"] == "extra_forbidden":
        key = loc[-1]
        close = difflib.get_close_matches(str(key), _fields_at(loc), n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(_fields_at(loc))}"
        return f"{file}: unknown key '{field}': {hint} (or prefix it with '//' to keep it as a comment)"
    if error["type"] == "missing":
        return f"{file}: missing required field '{field}': add it (see config/common.json for an example)"
    return f"{file}: field '{field}' has bad value {error.get('input')!r}: {error['msg']}"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError([f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"]) from None


def read_config_file(path: Path) -> ConfigFile:
    """Parse and schema-check one config file; no other file is touched."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{path}: config file not found: pass an existing file with --bench-config"])
    raw = _read_json(path)
    if not isinstance(raw, dict):
        raise ConfigError([f"{path}: the top level must be a JSON object, got {type(raw).__name__}"])
    try:
        parsed = ConfigFile.model_validate(_strip_comments(raw))
    except ValidationError as exc:
        # A value that matches no member of a union is reported once per member; keep the first.
        first = {_loc(tuple(e["loc"])): e for e in reversed(exc.errors())}
        # ...and a list with one bad item is reported at the item, not at the list.
        deepest = [f for f in first if not any(g.startswith((f + "[", f + ".")) for g in first)]
        problems = [_describe(first[f], path) for f in reversed(deepest)]
        raise ConfigError(problems) from None
    problems = _check_engine_args(parsed, path)
    if problems:
        raise ConfigError(problems)
    return parsed


def _check_engine_args(parsed: ConfigFile, path: Path) -> list[str]:
    problems = []
    for key, why in RESERVED_ENGINE_KEYS.items():
        if key in (parsed.engine.model_extra or {}):
            problems.append(f"{path}: field 'engine.{key}' cannot be set here: {why}")
    for spec in parsed.engine_specs(with_lora_off=False):
        if spec.max_cpu_loras < spec.max_loras:
            problems.append(
                f"{path}: field 'engine.max_cpu_loras' has bad value {spec.max_cpu_loras}: it is below "
                f"max_loras={spec.max_loras}; vLLM needs max_cpu_loras >= max_loras"
            )
    return problems


def _check_against_vllm(parsed: ConfigFile, path: Path) -> list[str]:
    """Catch typos in engine arguments by comparing them with vLLM's own EngineArgs."""
    try:
        from vllm.engine.arg_utils import EngineArgs as VllmEngineArgs
    except Exception:  # vLLM missing or broken: the engine build will say so itself
        return []
    known = set(VllmEngineArgs.__dataclass_fields__)
    problems = []
    for key in parsed.engine.model_extra or {}:
        if key not in known and key not in RESERVED_ENGINE_KEYS:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean '{close[0]}'?" if close else "see vllm.EngineArgs for the valid names"
            problems.append(f"{path}: unknown key 'engine.{key}' (not a vllm.LLM argument): {hint}")
    return problems


def _resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def resolve_config(path: Path, parsed: ConfigFile, *, needs_lora: bool, output: str | None = None) -> BenchConfig:
    """Resolve paths, read the adapter and prompt files and check them against the matrix.

    Built-in models and generated adapters are materialized in the cache on first use.
    """
    path = Path(path).resolve()
    base = path.parent
    problems = _check_against_vllm(parsed, path)

    is_builtin = parsed.model.startswith(builtin.PREFIX)
    if is_builtin:
        try:
            model = builtin.ensure_model(parsed.model[len(builtin.PREFIX):])
        except KeyError:
            raise ConfigError([
                f"{path}: field 'model' has bad value {parsed.model!r}: "
                f"built-in models are {', '.join(builtin.PREFIX + m for m in builtin.MODELS)}"
            ]) from None
    else:
        model = _resolve(base, parsed.model)
        if not model.is_dir():
            problems.append(f"{path}: field 'model': directory {model} does not exist: point it at a local model folder")
        elif not (model / "config.json").is_file():
            problems.append(f"{path}: field 'model': {model} has no config.json: point it at a Hugging Face model folder")
        else:
            problems += _check_weights(path, parsed, model)
    tokenizer = _resolve(base, parsed.tokenizer) if parsed.tokenizer else None
    if tokenizer is not None and not tokenizer.exists():
        problems.append(f"{path}: field 'tokenizer': {tokenizer} does not exist")

    prompts: list[str] = []
    prompts_path = _resolve(base, parsed.prompts)
    try:
        prompts = _read_prompts(prompts_path)
    except ConfigError as exc:
        problems += exc.problems

    adapters: list[Adapter] = []
    if isinstance(parsed.adapters, GeneratedAdapters):
        if not problems:
            adapters = builtin.ensure_dummy_adapters(model, parsed.adapters.generate, prompts)
    else:
        try:
            adapters = read_adapters_file(_resolve(base, parsed.adapters))
        except ValueError as exc:
            problems.append(f"{path}: field 'adapters': {exc}")
    problems += _check_adapters(path, parsed, adapters, needs_lora)
    problems += _check_lengths(path, parsed, model)
    problems += _check_online(path, parsed, adapters, model)
    if output is not None:  # from the command line: relative to the working directory
        out_path: Path | None = Path(output).resolve()
    else:
        out_path = _resolve(base, parsed.output) if parsed.output else None
    results_dir = _resolve(base, parsed.results_dir)
    problems += _check_outputs(path, results_dir, out_path, output is not None)
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
    )


# What vLLM's default loaders read; a folder with none of these fails inside the engine.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def _check_weights(path: Path, parsed: ConfigFile, model: Path) -> list[str]:
    """A folder with config.json and no weights runs only with random weights of its shape."""
    load_format = (parsed.engine.model_extra or {}).get("load_format", "auto")
    if load_format == "dummy" or any(next(model.glob(p), None) for p in WEIGHT_PATTERNS):
        return []
    return [
        f"{path}: field 'model': {model} has a config.json but no weight files ({', '.join(WEIGHT_PATTERNS)}): "
        "add the weights, or set engine.load_format to \"dummy\" to benchmark random weights of this shape"
    ]


def _writable_dir(folder: Path) -> bool:
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    return existing is not None and existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def _check_outputs(path: Path, results_dir: Path, output: Path | None, from_cli: bool) -> list[str]:
    """Result files are written after an engine has run: check now that they can be."""
    field = "--bench-output" if from_cli else "field 'output'"
    if output is None:
        if not _writable_dir(results_dir):
            return [f"{path}: field 'results_dir': cannot create result files in {results_dir}: choose a writable folder"]
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


def _read_prompts(path: Path) -> list[str]:
    if not path.is_file():
        raise ConfigError([f"{path}: prompts file not found: fix the 'prompts' field"])
    prompts = _read_json(path)
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ConfigError([f"{path}: expected a non-empty JSON list of non-empty strings"])
    return prompts


def _check_adapters(path: Path, parsed: ConfigFile, adapters: list[Adapter], needs_lora: bool) -> list[str]:
    problems = []
    if needs_lora and not adapters:
        return [f"{path}: field 'adapters': no adapters, but multi-LoRA cases were selected: add adapters or run -k no_lora"]
    for adapter in adapters:
        try:
            rank = read_rank(adapter.path)
        except ValueError as exc:
            problems.append(f"{path}: adapter '{adapter.name}': {exc}")
            continue
        for max_rank in _as_list(parsed.engine.max_lora_rank):
            if rank > max_rank:
                problems.append(
                    f"{path}: adapter '{adapter.name}' has rank {rank}, above engine.max_lora_rank={max_rank}: "
                    f"raise max_lora_rank to at least {rank} or drop the adapter"
                )
    biggest = max(parsed.matrix.batch_sizes)
    for workload in parsed.matrix.workloads if needs_lora else ():
        need = pool_size(workload, biggest)
        if len(adapters) < need:
            problems.append(
                f"{path}: field 'matrix.batch_sizes': the '{workload}' workload needs {need} adapters "
                f"at batch size {biggest}, but only {len(adapters)} are configured: add adapters or lower the batch size"
            )
    return problems


def _length_limit(parsed: ConfigFile, model: Path) -> tuple[int | None, str]:
    limit = (parsed.engine.model_extra or {}).get("max_model_len")
    if limit is not None:
        return limit, "engine.max_model_len"
    try:
        limit = json.loads((model / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, json.JSONDecodeError):
        return None, ""
    return limit, f"{model / 'config.json'} max_position_embeddings"


def _check_lengths(path: Path, parsed: ConfigFile, model: Path) -> list[str]:
    input_len = parsed.matrix.input_len
    limit, source = _length_limit(parsed, model)
    if input_len is None or limit is None:
        return []
    total = input_len + parsed.matrix.output_len
    if total > limit:
        return [
            f"{path}: field 'matrix.input_len': input_len + output_len = {total} exceeds {source} = {limit}: "
            f"shorten the requests or raise the limit"
        ]
    return []


def _check_online(path: Path, parsed: ConfigFile, adapters: list[Adapter], model: Path) -> list[str]:
    problems = []
    limit, source = _length_limit(parsed, model)
    for i, suite in enumerate(parsed.online.suites if parsed.online else ()):
        field = f"online.suites[{i}]"
        if max(suite.num_adapters) > len(adapters):
            problems.append(
                f"{path}: field '{field}.num_adapters' has bad value {max(suite.num_adapters)}: only "
                f"{len(adapters)} adapters are configured: add adapters or lower it"
            )
        total = suite.input_range[1] + suite.output_range[1]
        if limit is not None and total > limit:
            problems.append(
                f"{path}: field '{field}.input_range': the longest request, {total} tokens, exceeds {source} = {limit}"
            )
        if parsed.online.warmup_s >= suite.duration:
            problems.append(
                f"{path}: field 'online.warmup_s' has bad value {parsed.online.warmup_s}: it leaves nothing of "
                f"suite '{suite.name}' ({suite.duration:g} s) to measure"
            )
    return problems
