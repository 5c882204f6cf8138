"""The models one endpoint serves: `GatewayConfig.models` read into one `GatewayConfig` per model.

A model's config is the gateway's own with that model's entry laid over it, so everything below the
HTTP edge (tokenizer, limits, admission, worker pool and its model check, the hold) is built per
model from a config of the same type as a one-model gateway's, and one model with no `models` list
is exactly the gateway it always was.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kembed.gateway.config import GatewayConfig

# What the endpoint's HTTP edge reads, the same for every model behind it (one port, one connection
# edge, one body cap read before the model is known, one API key).
EDGE_FIELDS = frozenset(
    {
        "host",
        "port",
        "processes",
        "api_key",
        "worker_auth_token",
        "max_request_bytes",
        "header_timeout_s",
        "body_timeout_s",
        "keep_alive_timeout_s",
        "max_header_bytes",
        "max_headers",
        "max_connections",
        "log_level",
        "models",
        "default_model",
    }
)
_LIST_FIELDS = frozenset({"worker_addresses", "served_model_names"})


def is_multi_model(config: GatewayConfig) -> bool:
    return bool(config.models.strip())


def model_configs(config: GatewayConfig) -> tuple[GatewayConfig, ...]:
    """One config per model, the default model first; ValueError naming what is wrong. Without a
    `models` list: the gateway's own config, alone."""
    if not is_multi_model(config):
        return (config,)
    try:
        entries = json.loads(config.models)
    except json.JSONDecodeError as error:
        raise ValueError(f"models must be a JSON list of objects: {error}") from None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ValueError('models must be a non-empty JSON list of objects, e.g. [{"model_dir": "..."}]')
    if config.processes > 1:
        # each process would keep per-model metrics in one shared multiprocess directory under the
        # same names; until they carry the model as a label there, several models run in one process
        raise ValueError("several models are served by one gateway process: set processes to 1")
    configs = [_model_config(config, entry, i) for i, entry in enumerate(entries)]
    names = [name for c in configs for name in c.served_model_names]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"models: two models are named {', '.join(repeated)}; give each its own `name`")
    default = config.default_model
    if default:
        chosen = next((c for c in configs if default in c.served_model_names), None)
        if chosen is None:
            raise ValueError(f"default_model {default!r} is none of the models' names: {', '.join(names)}")
        configs.remove(chosen)
        configs.insert(0, chosen)
    return tuple(configs)


def _model_config(config: GatewayConfig, entry: dict[str, Any], index: int) -> GatewayConfig:
    where = f"models[{index}]"
    entry = dict(entry)
    if "model_dir" not in entry:
        raise ValueError(f"{where} has no model_dir")
    name = entry.pop("name", None)
    if name is not None:
        if "served_model_names" in entry:
            raise ValueError(f"{where}: give name or served_model_names, not both")
        entry["served_model_names"] = [name]
    fields = {f.name: f for f in dataclasses.fields(GatewayConfig)}
    for key in entry:
        if key not in fields:
            raise ValueError(f"{where}: unknown field {key!r}")
        if key in EDGE_FIELDS:
            raise ValueError(f"{where}: {key} is the endpoint's, the same for every model")
    if not entry.get("worker_addresses") and not entry.get("worker_service"):
        # one model's default, 127.0.0.1:50051, would be every model's
        raise ValueError(f"{where} names no workers: give worker_addresses or worker_service")
    values: dict[str, Any] = {}
    for key, value in entry.items():
        default = getattr(config, key)
        if key in _LIST_FIELDS:
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ValueError(f"{where}: {key} must be a list of strings")
            values[key] = tuple(value)
        elif key == "model_dir":
            values[key] = Path(str(value))
        else:
            values[key] = _typed(where, key, value, default)
    values.setdefault("served_model_names", (values["model_dir"].name,))
    values.setdefault("worker_addresses", ())
    values.setdefault("worker_service", "")
    return dataclasses.replace(config, models="", default_model="", **values)


def _typed(where: str, key: str, value: Any, default: Any) -> Any:
    """`value` as the type of the field's `default` (an int where a float is asked is one); a string
    is read as the field's environment variable is (the operator writes a model's settings so)."""
    if isinstance(value, str) and not isinstance(default, str):
        try:
            if isinstance(default, bool):
                return value.strip().lower() in ("1", "true", "yes", "on")
            return type(default)(value)
        except ValueError:
            raise ValueError(f"{where}: {key} must be a {type(default).__name__}, got {value!r}") from None
    if isinstance(default, bool):
        is_valid = isinstance(value, bool)
    elif isinstance(default, float):
        is_valid = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        is_valid = isinstance(value, type(default)) and not isinstance(value, bool)
    if not is_valid:
        raise ValueError(f"{where}: {key} must be a {type(default).__name__}, got {value!r}")
    return type(default)(value)
