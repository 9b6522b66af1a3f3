"""The run configuration, by concern: its `schema` (typed sections, parsed by tyro, each field's
bounds beside it), the `bounds` check of single fields, `presets` per algorithm and task family,
the `rules` between fields (`validate`), and `files` (``config.json``, ``--config``).
"""

from gmi_drl.algos import ModelConfig
from gmi_drl.config.bounds import FieldError, field_errors
from gmi_drl.config.files import from_dict, load_config_file, overlay, to_dict
from gmi_drl.config.presets import PRESETS, preset, task_family
from gmi_drl.config.rules import validate
from gmi_drl.config.schema import (AlgoUnion, AsyncConfig, CheckpointConfig, ConfigError,
                                   EnvConfig, GMIConfig, InvalidConfig, LogConfig, NormConfig,
                                   RayConfig, TrainConfig)
from gmi_drl.telemetry.profiler import ProfilerConfig

__all__ = ["AlgoUnion", "AsyncConfig", "CheckpointConfig", "ConfigError", "EnvConfig",
           "FieldError", "GMIConfig", "InvalidConfig", "LogConfig", "ModelConfig", "NormConfig",
           "PRESETS", "ProfilerConfig", "RayConfig", "TrainConfig", "field_errors", "from_dict",
           "load_config_file", "overlay", "preset", "task_family", "to_dict", "validate"]
