"""The DeepSpeed-compatible config layer: schema, loading, the batch triad, clear errors.

Importable without torch.distributed or Ray.
"""

from autotune.config.autotuning import AutotuningConfig, EngineName, TunerType
from autotune.config.errors import ConfigError, ConfigWarning
from autotune.config.json_file import read_json
from autotune.config.knobs import KNOBS, SEARCHABLE_KEYS, Knob
from autotune.config.loader import Config, load_config
from autotune.config.overrides import overlay, set_key
from autotune.config.rules import resolve_batch_triad
from autotune.config.schema import (
    AMPConfig,
    BF16Config,
    DeepSpeedConfig,
    FlopsProfilerConfig,
    FP16Config,
    OffloadDevice,
    OffloadOptimizerConfig,
    OffloadParamConfig,
    OptimizerConfig,
    SchedulerConfig,
    ZeroConfig,
)
from autotune.config.sizes import format_size, parse_size
from autotune.metric import Metric

__all__ = [
    "KNOBS",
    "SEARCHABLE_KEYS",
    "AMPConfig",
    "AutotuningConfig",
    "BF16Config",
    "Config",
    "ConfigError",
    "ConfigWarning",
    "DeepSpeedConfig",
    "EngineName",
    "FP16Config",
    "FlopsProfilerConfig",
    "Knob",
    "Metric",
    "OffloadDevice",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "OptimizerConfig",
    "SchedulerConfig",
    "TunerType",
    "ZeroConfig",
    "format_size",
    "load_config",
    "overlay",
    "parse_size",
    "read_json",
    "resolve_batch_triad",
    "set_key",
]
