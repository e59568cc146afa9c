"""The benchmark configuration: read (``read``), resolved against the files it names
(``resolve``) and expanded into engine configurations and cases (``expand``)."""

from lorabench.config.expand import BenchConfig, EngineSpec, engine_specs
from lorabench.config.online_cases import OnlineCase, online_cases
from lorabench.config.read import ConfigError, read_config_file
from lorabench.config.resolve import resolve_config
from lorabench.config.schema import WORKLOADS, ConfigFile, DummyAdapterSpec

__all__ = [
    "WORKLOADS",
    "BenchConfig",
    "ConfigError",
    "ConfigFile",
    "DummyAdapterSpec",
    "EngineSpec",
    "OnlineCase",
    "engine_specs",
    "online_cases",
    "read_config_file",
    "resolve_config",
]
