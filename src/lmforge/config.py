"""Typed configs: flat dataclasses saved as JSON, with checked ``key=value`` overrides.

Every config in lmforge is a ``@dataclass`` whose fields have simple types (int, float, bool,
str, optional or tuple/list of those).  :func:`from_dict` rejects unknown keys with the list of
valid ones; :func:`apply_overrides` parses ``--set key=value`` strings against the field types.
Values are validated by each dataclass's ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from .errors import ConfigError
from .utils import INT64, SEED_MAX

T = TypeVar("T")


def field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _unknown_key_message(cls, key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown config key '{key}' for {cls.__name__}{hint}; valid keys: {', '.join(sorted(valid))}"


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a JSON value or a command-line string to the field type ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, args, key)
    if origin in (list, tuple):
        inner = args[0] if args else Any
        items = [coerce(v, inner, key) for v in _as_list(value, key)]
        return tuple(items) if origin is tuple else items
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"'{key}' must be one of {', '.join(map(str, args))}, got {value!r}")
        return value
    scalar = _SCALARS.get(tp)
    return value if scalar is None else scalar(value, key)  # Any and other types: as given


def _coerce_union(value: Any, args: tuple[Any, ...], key: str) -> Any:
    """``X | None`` and other unions: ``none``/``null`` for an optional field, else the first type that fits."""
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
        if type(None) in args:
            return None
    errors = []
    for a in args:
        if a is type(None):
            continue
        try:
            return coerce(value, a, key)
        except ConfigError as e:
            errors.append(str(e))
    raise ConfigError(errors[0] if errors else f"bad value {value!r} for '{key}'")


def _as_list(value: Any, key: str) -> list | tuple:
    """A list from JSON (``[1, 2]``), a comma-separated string (``1,2``) or a list."""
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            try:
                value = json.loads(s)
            except json.JSONDecodeError as e:
                raise ConfigError(f"bad list value {value!r} for '{key}': {e.msg}") from None
        else:
            value = [v for v in s.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"'{key}' expects a list, got {value!r}")
    return value


def _to_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"'{key}' expects true/false, got {value!r}")


#: layer counts: a bound far above any model this toolkit trains, which keeps a typo from building (or hanging on)
#: millions of layers before anything fails
LAYER_KEYS = ("n_layer", "num_hidden_layers", "num_layers")
MAX_LAYERS = 1024


def _bounded(n: int, key: str) -> int:
    """``n`` if it fits the integer types torch and NumPy compute with (64 bits) and, for a layer count,
    :data:`MAX_LAYERS`; otherwise a one-line ConfigError."""
    low, high = (0, SEED_MAX) if key == "seed" else INT64  # the one seed range of every command and route
    if not low <= n <= high:
        raise ConfigError(f"'{key}' must be a whole number from {low} to {high}, got {n}")
    if key in LAYER_KEYS and n > MAX_LAYERS:
        raise ConfigError(f"'{key}' must be at most {MAX_LAYERS}, got {n}")
    return n


def _to_int(value: Any, key: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"'{key}' expects an integer, got {value!r}")
    if isinstance(value, int):
        return _bounded(value, key)
    if isinstance(value, float) and value.is_integer():
        return _bounded(int(value), key)
    if isinstance(value, str):
        try:
            n = int(value)  # exact for long integers, which float() would round
        except ValueError:
            try:
                f = float(value)
            except ValueError:
                raise ConfigError(f"'{key}' expects an integer, got {value!r}") from None
            if not f.is_integer():
                raise ConfigError(f"'{key}' expects an integer, got {value!r}") from None
            n = int(f)
        return _bounded(n, key)
    raise ConfigError(f"'{key}' expects an integer, got {value!r}")


def _to_float(value: Any, key: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"'{key}' expects a number, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"'{key}' expects a number, got {value!r}") from None
    if not math.isfinite(f):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    return f


def _to_str(value: Any, key: str) -> str:
    if isinstance(value, str):
        return value
    raise ConfigError(f"'{key}' expects a string, got {value!r}")


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def from_dict(cls: type[T], data: dict[str, Any], *, ignore: tuple[str, ...] = ()) -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and coercing types.

    Args:
        cls: the config dataclass.
        data: mapping of field name to value (e.g. a parsed ``config.json``).
        ignore: keys that may be present but are not fields (e.g. ``"model_type"``).
    """
    fields = field_types(cls)
    kwargs = {}
    for key, value in data.items():
        if key in ignore:
            continue
        if key not in fields:
            raise ConfigError(_unknown_key_message(cls, key, list(fields)))
        kwargs[key] = coerce(value, fields[key], key)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid {cls.__name__}: {e}") from None


def to_dict(cfg) -> dict[str, Any]:
    """Plain JSON-ready dict of a config dataclass (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def parse_overrides(pairs: list[str] | None) -> dict[str, str]:
    """Split ``["a=1", "b=x"]`` into a dict; a pair without ``=`` is a config error."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ConfigError(f"override '{pair}' is not of the form key=value")
        k, v = pair.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def apply_overrides(cfg: T, pairs: list[str] | dict[str, Any] | None) -> T:
    """Return a copy of ``cfg`` with ``key=value`` overrides applied and validated."""
    overrides = pairs if isinstance(pairs, dict) else parse_overrides(pairs)
    if not overrides:
        return cfg
    fields = field_types(type(cfg))
    changes = {}
    for k, v in overrides.items():
        if k not in fields:
            raise ConfigError(_unknown_key_message(type(cfg), k, list(fields)))
        changes[k] = coerce(v, fields[k], k)
    try:
        return dataclasses.replace(cfg, **changes)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid {type(cfg).__name__}: {e}") from None


# Names that the families give the same thing (GPT-2's, BERT's and ELMo's / word2vec's field names): a
# ``--set`` key that another family uses is answered with this family's name for it.
FIELD_SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("n_layer", "num_hidden_layers", "num_layers"),
    ("n_embd", "hidden_size", "projection_dim", "vector_size", "d_model"),
    ("n_head", "num_attention_heads"),
    ("n_inner", "intermediate_size"),
    ("n_positions", "max_position_embeddings", "seq_len"),
    ("seq_len", "max_seq_length", "n_positions", "block_size"),
    ("resid_pdrop", "hidden_dropout_prob", "dropout"),
    ("attn_pdrop", "attention_probs_dropout_prob"),
    ("activation_function", "hidden_act"),
    ("layer_norm_epsilon", "layer_norm_eps"),
)


def synonyms_in(cls, key: str) -> list[str]:
    """The fields of dataclass ``cls`` that mean what ``key`` means in another family (``n_layer`` ->
    ``["num_hidden_layers"]`` for BERT's config); empty when ``key`` is a field of ``cls`` or unknown."""
    fields = field_types(cls)
    if key in fields:
        return []
    found: list[str] = []
    for group in FIELD_SYNONYMS:
        if key in group:
            found += [name for name in group if name in fields and name not in found]
    return found


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A mapping from a JSON, TOML or YAML file (by its suffix; YAML needs PyYAML), with one-line errors.

    Args:
        path: ``*.json``, ``*.toml`` or ``*.yaml`` / ``*.yml`` (any other suffix is read as JSON).
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        return load_json(p)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    text = p.read_text(encoding="utf-8")
    if suffix == ".toml":
        import tomllib  # the standard library's from Python 3.11 on; lmforge still runs on 3.10 without TOML

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p} is not valid TOML ({e}); fix it") from None
    else:
        try:
            import yaml  # PyYAML: optional, only for YAML run files
        except ImportError:
            raise ConfigError(f"{p} is YAML, which needs PyYAML (pip install pyyaml); or write it as TOML or JSON") \
                from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{p} is not valid YAML ({str(e).splitlines()[0]}); fix it") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a table of key = value settings")
    return data


def load_json(path: str | Path) -> dict[str, Any]:
    """Read a JSON object from ``path`` with a one-line error when missing or malformed."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p} is not valid JSON ({e}); fix or regenerate it") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a JSON object")
    return data
