"""One way to build a settings dataclass from a mapping: probe `Settings` (probes/core/runner.py),
`TrainConfig` (workbench/config.py) and `FinetuneConfig` (workbench/drivers/finetune.py) all come through
`build_dataclass`.

Values arrive from YAML files, from `--set key=value` and from command-line options, so a value
may be a string where the field wants a number, a flag or a list. Each value is coerced by its
field's annotation (`typing.get_type_hints`, so `from __future__ import annotations` is fine):

    int      an int, a whole float (3.0) or a numeric string ("3", "1e4"); not a bool, not 2.5
    float    a number or a numeric string (YAML 1.1 reads `5e-4` as a string)
    bool     a bool or "true"/"false"/"yes"/"no"/"1"/"0" (any case)
    str      a string, a number written as one (YAML reads `name: 2024` as an int) or a path
    list / tuple   a list, a tuple or a comma-separated string; items coerced by the item type
             (`tuple[str, ...]`, `list[int]`, or one type per position: `tuple[float, float]`)
    dict     a mapping
    X | None None, or an X
    a dataclass    a mapping, built recursively (errors name the dotted key: `corpus.seed`)

Unknown keys are refused with the known ones listed and, when one is close, a suggestion
(difflib); a field without a default must be given. Every error is a ConfigError that starts
with `source` (the file, the CLI option or "settings") and names the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import types
import typing
from collections.abc import Mapping
from typing import Any

from workbench.errors import ConfigError

# Field metadata {"key": False}: a field the object fills in itself (e.g. TrainConfig.source),
# never read from the mapping.
NOT_A_KEY = {"key": False}


class _Clear:
    """The type of `CLEAR` (one instance)."""

    def __repr__(self) -> str:
        return "CLEAR"


# An override value meaning "set this key to None" (a command line's explicit `KEY=null`), told
# apart from None, which `apply_overrides` reads as "not given" (a flag left out changes nothing).
CLEAR = _Clear()


def explicit_nulls(value: Any) -> Any:
    """A value given explicitly (a command line's YAML) with its nulls, at any depth of mappings, as
    `CLEAR`: `apply_overrides` then sets them to None instead of leaving the keys as they were."""
    if value is None:
        return CLEAR
    if isinstance(value, Mapping):
        return {k: explicit_nulls(v) for k, v in value.items()}
    return value


def _cleared(value: Any) -> Any:
    """`value` with every `CLEAR` in it (at any depth of mappings) as None: what a key is set to."""
    if value is CLEAR:
        return None
    if isinstance(value, Mapping):
        return {k: _cleared(v) for k, v in value.items()}
    return value

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def settings_hash(settings: Mapping[str, Any], length: int = 16) -> str:
    """The identity of a settings dict: the first `length` hex digits of the sha256 of its JSON with
    sorted keys. Each config's hash (training, fine-tuning, distillation) is this over the fields
    that change its results, so equal settings give equal folders and resumes find their work."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:length]


def settable_fields(cls) -> dict[str, dataclasses.Field]:
    """The fields of dataclass `cls` a mapping may set, by name."""
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("key", True)}


def build_dataclass(cls, values: Mapping[str, Any] | None, source: str, prefix: str = ""):
    """`cls(**values)` with each value coerced by its field's annotation (module docstring).

    `source` names where the values came from, `prefix` the dotted path of a nested dataclass
    (both only for messages). Raises ConfigError for an unknown key, a missing required key or a
    value of the wrong type.
    """
    values = dict(values or {})
    fields = settable_fields(cls)
    unknown = [k for k in values if k not in fields]
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {[prefix + str(k) for k in unknown]}"
                          f"{_suggestion(unknown, fields)}; known: {', '.join(sorted(fields))}")
    missing = [n for n, f in fields.items() if n not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{source}: {prefix}{missing[0]}: required key is missing")
    hints = typing.get_type_hints(cls)
    return cls(**{k: coerce_value(v, hints[k], source, prefix + k) for k, v in values.items()})


def _suggestion(unknown: list, known: Mapping[str, Any]) -> str:
    """The hint " (did you mean 'steps'?)": for each unknown key, its closest known one (difflib)."""
    close = [(str(k), difflib.get_close_matches(str(k), list(known), n=1)) for k in unknown]
    hints = [f"{m[0]!r}" + (f" for {k!r}" if len(unknown) > 1 else "") for k, m in close if m]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


def coerce_value(value: Any, hint: Any, source: str, key: str) -> Any:
    """`value` as the annotation `hint` wants it, or a ConfigError naming `source` and `key`."""
    def fail(expected: str):
        raise ConfigError(f"{source}: {key}: expected {expected}, got {value!r}")

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        arms = [a for a in args if a is not type(None)]
        return coerce_value(value, arms[0], source, key)
    if value is None and hint is not Any:
        raise ConfigError(f"{source}: {key}: cannot be empty")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        fail("true/false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        number = _number(value)
        if number is None or not number.is_integer():
            fail("an integer")
        return int(number)
    if hint is float:
        number = _number(value)
        if number is None:
            fail("a number")
        return number
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float, os.PathLike)) and not isinstance(value, bool):
            return str(value)  # YAML reads `name: 2024` as an int; callers pass paths
        fail("a string")
    if origin in (list, tuple) or hint in (list, tuple):
        items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            fail("a list or a comma-separated string")
        if (len(args) == 2 and args[1] is Ellipsis) or len(args) == 1:
            item_hints = [args[0]] * len(items)
        elif args:  # one type per position
            if len(items) != len(args):
                fail(f"{len(args)} items")
            item_hints = list(args)
        else:
            item_hints = [Any] * len(items)
        out = [coerce_value(v, h, source, f"{key}[{i}]") for i, (v, h) in enumerate(zip(items, item_hints))]
        return tuple(out) if (origin or hint) is tuple else out
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            fail("a mapping")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            fail("a mapping")
        return build_dataclass(hint, value, source, f"{key}.")
    return value


def _number(value: Any) -> float | None:
    """`value` as a float when it is a number or a numeric string (not a bool), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


# --------------------------------------------------------------------------- loading with overrides

def load_config(cls: type, source: Any, overrides: Mapping[str, Any] | None = None,
                label: str = "config") -> tuple[Any, str]:
    """(config, where): `cls` built from a YAML file, a mapping or a config object, with `overrides`
    on top by the one rule (`apply_overrides`). `where` names the source in messages (the file,
    "<label>" for a mapping, "<config>" for an object). Every driver's config, pretraining's
    `TrainConfig` (workbench/config.py) and the probes' settings are read this way."""
    from pathlib import Path

    from workbench.io import read_yaml

    if isinstance(source, cls):
        data, where = dataclasses.asdict(source), "<config>"
    elif isinstance(source, Mapping):
        data, where = dict(source), label
    else:
        where = str(source)
        data = read_yaml(Path(source))
    data = apply_overrides(data, overrides, where)
    return build_dataclass(cls, data, where), where


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any] | None, where: str = "config") -> dict:
    """`data` with `overrides` on top, by the workbench's one override rule:

    - a value None changes nothing (a command-line flag that was not given); `CLEAR` sets the key to
      None (an explicit null: `bertology train --set corpus.max_documents=null`);
    - a dotted key `a.b.c` sets `c` inside mapping `b` inside mapping `a` (created when absent);
    - a mapping given for a key that holds a mapping merges into it, key by key, by this same rule
      (so `{"corpus": {"seed": 1}}` and `{"corpus.seed": 1}` are one override);
    - anything else replaces the key's value.
    `data` is not modified; a dotted key through a non-mapping is a ConfigError naming `where`."""
    out = dict(data)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        head, dot, rest = key.partition(".")
        if dot:
            nested = out.get(head)
            if nested is None:
                nested = {}
            if not isinstance(nested, Mapping):
                raise ConfigError(f"{where}: {head}: expected a mapping (to set {rest}), got {nested!r}")
            out[head] = apply_overrides(nested, {rest: value}, where)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = apply_overrides(out[key], value, where)
        else:
            out[key] = _cleared(value)
    return out
