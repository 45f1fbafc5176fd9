"""Declared schemas of the `extra` column of result rows: one small declaration next to each producer.

A producer is what writes a row's `probe` column: a probe (`ProbeSpec.name`: syntax, cloze, ...)
or a driver (finetune, prune, distill, peft, cost). Its declaration lists the keys its rows may
carry in `extra` and their JSON types; the results store checks every row it validates
(`workbench.store.results.validate_rows`: `RunWriter.add`, `FinishedUnits.save`, `layer_rows`), so an
undeclared key or a wrong type fails when the row is written, naming the producer, the row and the
key, instead of reading as a blank chart in the app later.

    EXTRA = RowSchema("finetune", "per-seed score",
                      required={"best_epoch": int, "checkpoint": str},
                      optional={"trainable": int | None})

Types are JSON types: `str`, `int`, `float` (an int is a float too: JSON does not tell 1 from
1.0), `bool`, `list`, `dict`, `Any`; `T | None` allows null. One producer may declare several
variants (one per kind of row it writes: per-seed rows, per-epoch rows, baseline rows); a row must
fit one of them. Rows of a producer that declares nothing are not checked (ad-hoc rows of a
notebook or a test); declarations register when their module is imported, which every producer's
module is before it writes rows.

Every producer's rows may also carry the baseline markers (`MARKERS`: `baseline`, the baseline a
row measures, and `baseline_for`, the metric it is a reference line for), so the app tells
baselines and random-init twins from model rows of any producer.

Reading: a key is read back through `require_declared` (the app's one accessor, `app.fields.row_field`):
a key the producer does not declare is a `UndeclaredKeyError` (a KeyError naming the key and the
producer), not a None that draws an empty column; a declared key an older row lacks reads as missing.

This module imports nothing from the workbench, so any module may declare rows at import time
without an import circle.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_JSON_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list", dict: "object",
               type(None): "null"}  # fmt: skip
# keys any producer's rows may carry: what the app reads to tell baselines and twins from model rows
# (probes.core.baselines.mark_baselines, the runner's random-init twins)
MARKERS: dict[str, Any] = {"baseline": str, "baseline_for": str}


def _as_types(spec: Any) -> tuple[type, ...] | None:
    """A declared type as a tuple of accepted Python types; None for Any."""
    if spec is Any:
        return None
    if isinstance(spec, types.UnionType) or typing.get_origin(spec) is typing.Union:
        out: list[type] = []
        for arg in typing.get_args(spec):
            sub = _as_types(arg)
            if sub is None:
                return None
            out += sub
        return tuple(out)
    if spec is None or spec is type(None):
        return (type(None),)
    if spec in _JSON_NAMES:
        return (spec,)
    raise TypeError(f"row schema: {spec!r} is not a JSON type (str, int, float, bool, list, dict, Any, T | None)")


def _fits(value: Any, accepted: tuple[type, ...] | None) -> bool:
    if accepted is None:
        return True
    if value is None:
        return type(None) in accepted
    if isinstance(value, bool):  # a bool is an int to Python, not to JSON
        return bool in accepted
    if isinstance(value, int):
        return int in accepted or float in accepted
    if isinstance(value, float):
        # JSON cannot tell 2 from 2.0 once stored: an integral float fits an int key
        return float in accepted or (int in accepted and math.isfinite(value) and value.is_integer())
    if isinstance(value, (list, tuple)):
        return list in accepted
    if isinstance(value, Mapping):
        return dict in accepted
    return type(value) in accepted


def _type_name(accepted: tuple[type, ...] | None) -> str:
    return "any" if accepted is None else " or ".join(_JSON_NAMES[t] for t in accepted)


def _value_type(value: Any) -> str:
    for t in (type(None), bool, int, float, str, list, dict):
        if isinstance(value, t):
            return _JSON_NAMES[t]
    if isinstance(value, tuple):
        return "list"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


@dataclass(frozen=True)
class RowSchema:
    """The keys and JSON types one kind of row of `producer` carries in `extra`.

    `required` keys are on every such row, `optional` keys may be. Creating one registers it
    (`schemas(producer)`); `register=False` keeps it private (tests)."""

    producer: str
    kind: str = "rows"
    required: Mapping[str, Any] = field(default_factory=dict)
    optional: Mapping[str, Any] = field(default_factory=dict)
    register: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.producer, str) or not self.producer:
            raise TypeError(f"row schema: producer must be a non-empty string, got {self.producer!r}")
        both = set(self.required) & set(self.optional)
        if both:
            raise TypeError(f"row schema {self.producer}/{self.kind}: {sorted(both)} both required and optional")
        types_ = {k: _as_types(v) for k, v in {**MARKERS, **self.required, **self.optional}.items()}
        object.__setattr__(self, "_types", types_)
        if self.register:
            known = _REGISTRY.setdefault(self.producer, [])
            if not any(s.kind == self.kind and s._types == types_ and set(s.required) == set(self.required)
                       for s in known):  # re-importing a module (a reload) declares nothing new
                known.append(self)

    def problems(self, extra: Mapping[str, Any]) -> list[str]:
        """What keeps `extra` from fitting this schema (empty when it fits)."""
        out = []
        for key, value in extra.items():
            if key not in self._types:
                out.append(f"undeclared key {key!r}")
            elif not _fits(value, self._types[key]):
                out.append(f"key {key!r} is {_value_type(value)} {_short(value)}, declared "
                           f"{_type_name(self._types[key])}")
        out += [f"required key {k!r} missing" for k in self.required if k not in extra]
        return out

    def merged(self, other: RowSchema, kind: str | None = None) -> RowSchema:
        """This schema with `other`'s keys as optional ones (unregistered): for composing declarations."""
        opt = {**self.optional, **{k: v for k, v in {**other.required, **other.optional}.items() if k not in self.required}}
        return RowSchema(self.producer, kind or self.kind, dict(self.required), opt, register=False)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_REGISTRY: dict[str, list[RowSchema]] = {}


def schemas(producer: str) -> list[RowSchema]:
    """The declared variants of `producer`'s rows (empty: undeclared, its rows are not checked)."""
    return list(_REGISTRY.get(producer, ()))


def declared_producers() -> list[str]:
    return sorted(_REGISTRY)


class UndeclaredKeyError(KeyError):
    """A key read from rows' `extra` that their producer does not declare (a misspelt key, or one the
    producer never writes)."""

    def __init__(self, producer: str, key: str):
        super().__init__(key)
        self.producer, self.key = producer, key

    def __str__(self) -> str:  # KeyError would print the bare key in quotes
        known = ", ".join(sorted(declared_keys(self.producer))) or "none: the producer declares no rows"
        return (f"{self.key!r} is not a declared extra key of producer {self.producer!r} (declared: {known}); "
                f"declare it in {self.producer!r}'s RowSchema (workbench.store.rowschema) or fix the name")


def declared_keys(producer: str) -> frozenset[str]:
    """Every key one of `producer`'s declared kinds of rows may carry (the markers included); empty
    when it declares none."""
    variants = _REGISTRY.get(producer, ())
    return frozenset(k for s in variants for k in s._types) if variants else frozenset()


def require_declared(producer: str, key: str) -> None:
    """Raise `UndeclaredKeyError` unless `key` is declared by `producer` (by any of its kinds)."""
    if key not in declared_keys(producer):
        raise UndeclaredKeyError(producer, key)


def check_extra(producer: str, extra: Mapping[str, Any]) -> str | None:
    """None when `extra` fits one declared variant of `producer` (or the producer declares none);
    else the problems with the closest variant, one line."""
    variants = _REGISTRY.get(producer)
    if not variants:
        return None
    best: tuple[int, RowSchema, list[str]] | None = None
    for schema in variants:
        problems = schema.problems(extra)
        if not problems:
            return None
        if best is None or len(problems) < best[0]:
            best = (len(problems), schema, problems)
    assert best is not None
    _, schema, problems = best
    kinds = "" if len(variants) == 1 else f" (closest of {len(variants)} declared kinds: {schema.kind!r})"
    return f"{'; '.join(problems)}{kinds}"


def describe(producer: str) -> str:
    """The declared keys of a producer, for error messages and docs."""
    lines = []
    for s in _REGISTRY.get(producer, ()):
        req = ", ".join(f"{k}: {_type_name(s._types[k])}" for k in s.required)
        opt = ", ".join(f"{k}?: {_type_name(s._types[k])}" for k in s.optional)
        lines.append(f"{producer}/{s.kind}: {{{', '.join(x for x in (req, opt) if x)}}}")
    return "\n".join(lines)
