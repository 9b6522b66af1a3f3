"""The run configuration as files: `to_dict` / `from_dict` (what ``config.json`` and
checkpoints hold), `load_config_file` (``--config``), and `overlay` (a resumed run's
``config.json`` over its checkpoint's config).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing

from gmi_drl.algos import ALGORITHMS, ModelConfig, algo_name
from gmi_drl.config.bounds import field_errors
from gmi_drl.config.schema import (AsyncConfig, CheckpointConfig, ConfigError, EnvConfig,
                                   GMIConfig, LogConfig, NormConfig, RayConfig, TrainConfig)
from gmi_drl.telemetry.profiler import ProfilerConfig


_NESTED = {"env": EnvConfig, "model": ModelConfig, "norm": NormConfig, "log": LogConfig,
           "checkpoint": CheckpointConfig, "gmi": GMIConfig, "profile": ProfilerConfig,
           "ray": RayConfig, "async_": AsyncConfig}


def to_dict(cfg: TrainConfig) -> dict:
    """The config as plain, strict-JSON data (what config.json and checkpoints hold); the
    algorithm's fields sit under its name: ``{"algo": {"ppo": {...}}, ...}``. An infinite
    float ("no bound", as ``max_grad_norm`` takes it) is the string ``"inf"``: JSON has no
    infinity, and Python's ``Infinity`` token is refused by jq and most other readers."""
    data = dataclasses.asdict(cfg)
    data["algo"] = {algo_name(cfg.algo): data["algo"]}
    return _inf_as_text(data)


def _inf_as_text(data: dict) -> dict:
    return {k: _inf_as_text(v) if isinstance(v, dict)
            else ("inf" if v > 0 else "-inf") if isinstance(v, float) and math.isinf(v)
            else v for k, v in data.items()}


def _inf_from_text(cls, fields: dict) -> dict:
    """``fields`` of dataclass ``cls`` with ``"inf"`` read back as a float where the field is one
    (`to_dict` writes it so); every other value as given, for `field_errors` to judge."""
    hints = typing.get_type_hints(cls)
    return {k: float(v) if hints.get(k) is float and v in ("inf", "-inf") else v
            for k, v in fields.items()}


def load_config_file(path: str) -> TrainConfig:
    """The config in JSON file ``path``: a run's ``config.json`` (`to_dict`) or a file with it
    under ``"config"`` (``tuned.json`` of `gmi-drl tune`); ``config`` is set to ``path``.

    Raises:
        ConfigError: a file that is missing, not JSON, or holds no config of this version.
    """
    import json

    try:
        data = json.loads(open(path).read())
    except OSError as e:
        raise ConfigError(f"--config {path}: {e.strerror}") from None
    except ValueError as e:
        raise ConfigError(f"--config {path} is not JSON ({e}); pass a run's config.json or "
                          "tuned.json from gmi-drl tune") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path} holds no config object")
    # tuned.json holds the config under "config"; a run's config.json has a "config" field of
    # its own (the --config it was made from: a path or null)
    inner = data.get("config")
    try:
        cfg = from_dict(inner if isinstance(inner, dict) and "algo" in inner else data)
    except ConfigError as e:
        raise ConfigError(f"--config {path}: {str(e).removeprefix('config file: ')}") from None
    cfg.config, cfg.resume, cfg.run_dir = path, None, None
    return cfg


def overlay(base: dict, top: dict) -> dict:
    """``top``'s fields over ``base``'s, section by section (`to_dict` dicts; an ``algo``
    section that names another algorithm replaces the whole section): a resumed run's
    config.json over its checkpoint's config, so a field the file leaves out keeps the run's
    value."""
    out = dict(base)
    for key, value in top.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        if nested and key == "algo" and value.keys() != base[key].keys():
            nested = False
        out[key] = overlay(base[key], value) if nested else value
    return out


def from_dict(data: dict) -> TrainConfig:
    """Inverse of `to_dict`, with the field types checked (`field_errors`; their bounds are
    `validate`'s: a flag given after ``--config`` may still fix one).

    Raises:
        ConfigError: unknown fields (with the nearest known name), a field of the wrong type,
            no or an unknown algorithm, or a section that is no object.
    """
    algo = data.get("algo") if isinstance(data, dict) else None
    if isinstance(algo, dict) and len(algo) > 1:
        raise ConfigError(f"the config's \"algo\" section names {len(algo)} algorithms "
                          f"({', '.join(map(repr, algo))}): it holds one, "
                          "{\"<name>\": {...fields}}")
    if not (isinstance(algo, dict) and len(algo) == 1):
        raise ConfigError("the config has no \"algo\": {\"<name>\": {...}} section: a config file "
                          "is a whole run config (a run's config.json, or tuned.json from "
                          "gmi-drl tune), not a few fields; give single fields as flags")
    (name, fields), = algo.items()
    if name not in ALGORITHMS:
        raise ConfigError(f"algo {name!r} is none of {list(ALGORITHMS)}")
    if not isinstance(fields, dict):
        raise ConfigError(f"algo.{name} must be an object of fields, not {fields!r}")
    errors = _unknown_fields(ALGORITHMS[name][0], fields, f"algo.{name}")
    errors += _unknown_fields(TrainConfig, {k: v for k, v in data.items() if k != "algo"}, "")
    for key, cls in _NESTED.items():
        if key in data:
            if not isinstance(data[key], dict):
                errors.append(f"{key} must be an object of fields, not {data[key]!r}")
            else:
                errors += _unknown_fields(cls, data[key], key)
    if errors:
        raise ConfigError("config file: " + "; ".join(errors))
    rest = {k: _NESTED[k](**_inf_from_text(_NESTED[k], v)) if k in _NESTED else v
            for k, v in data.items() if k != "algo"}
    algo_cls = ALGORITHMS[name][0]
    cfg = TrainConfig(algo=algo_cls(**_inf_from_text(algo_cls, fields)),
                      **_inf_from_text(TrainConfig, rest))
    # checked here too, not only in validate: a config becomes the CLI parser's defaults,
    # which warns about a mistyped default before validate could say what is wrong
    errors = [e.message for e in field_errors(cfg) if e.kind != "bound"]
    if errors:
        raise ConfigError("config file: " + "; ".join(errors))
    return cfg


def _unknown_fields(cls, given: dict, where: str) -> list[str]:
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    out = []
    for key in given:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(known)})"
            out.append(f"unknown field {where + '.' if where else ''}{key}{hint}")
    return out
