"""The model families the workbench can pretrain, one module each, found by name.

`get_family("bert")` imports `workbench.families.bert` and returns its `FAMILY` (a `FamilySpec`,
see `base.py`). A family is one module that defines `FAMILY`; it is found in the family packages
(`family_packages()`): `workbench.families` and any package named in `$BERTOLOGY_FAMILY_PACKAGES`
(comma-separated importable package names), searched in that order. `FAMILIES` lists the built-in
ones in their display order; `available_families()` every family found. Modules are imported
lazily so that a broken or missing family never breaks the others. Importing this package also
imports `workbench.families.elmo` when it exists, because that module registers ELMo with
transformers' Auto classes (needed before `AutoModel` can open an ELMo checkpoint).

What other modules ask about a model by its `config.model_type` (a checkpoint opened without our
manifest, a PEFT site, a causal stack) they read through `ModelTypeTable`: the families' answers
(from their `FamilySpec.hf_model_types`) over a small table of foreign architectures that are no
family here (Llama, MPNet, ...).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import warnings
from collections.abc import Mapping
from types import ModuleType

from workbench.families.base import FamilySpec, PretrainingOutput

FAMILIES = ("bert", "roberta", "spanbert", "albert", "electra", "deberta", "gpt", "t5", "bart", "elmo", "distilbert")
FAMILY_PACKAGES_ENV = "BERTOLOGY_FAMILY_PACKAGES"

__all__ = ["FAMILIES", "FamilySpec", "ModelTypeTable", "PretrainingOutput", "available_families", "family_module",
           "family_of_model_type", "family_packages", "find_family", "get_family"]


def family_packages() -> list[str]:
    """The packages searched for family modules: `workbench.families`, then those named in
    `$BERTOLOGY_FAMILY_PACKAGES` (comma-separated)."""
    extra = [p.strip() for p in os.environ.get(FAMILY_PACKAGES_ENV, "").split(",") if p.strip()]
    return ["workbench.families", *extra]


def _module_name(name: str) -> str | None:
    """The module of family `name` in the first family package that has one, or None."""
    if not name.isidentifier() or name.startswith("_"):
        return None
    for package in family_packages():
        try:
            if importlib.util.find_spec(f"{package}.{name}") is not None:
                return f"{package}.{name}"
        except (ImportError, ValueError):  # a package named in the variable that is not there
            continue
    return None


def _module_exists(name: str) -> bool:
    return _module_name(name) is not None


def family_module(name: str) -> ModuleType:
    """The module of family `name` (where its `FAMILY` and, optionally, `load_pretrainer` live)."""
    module_name = _module_name(name)
    if module_name is None:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(available_families())}")
    return importlib.import_module(module_name)


def get_family(name: str) -> FamilySpec:
    """The `FamilySpec` of family `name` (one of `available_families()`)."""
    if name in FAMILIES and not _module_exists(name):
        raise KeyError(f"family {name!r} is not implemented yet (no workbench/families/{name}.py)")
    module = family_module(name)
    spec = getattr(module, "FAMILY", None)
    if spec is None:
        raise KeyError(f"unknown family {name!r} ({module.__name__} defines no FAMILY); "
                       f"known: {', '.join(available_families())}")
    if not isinstance(spec, FamilySpec):
        raise TypeError(f"{module.__name__}.FAMILY is not a FamilySpec")
    if spec.name != name:
        raise TypeError(f"{module.__name__}.FAMILY is named {spec.name!r}, not {name!r}")
    return spec


def find_family(name: str | None) -> FamilySpec | None:
    """The `FamilySpec` of `name` when it is a family here, else None (a handle's family may be a
    foreign model type, e.g. "mpnet" or "llama")."""
    if not name or _module_name(name) is None:
        return None
    try:
        return get_family(name)
    except KeyError:
        return None


def _defines_family(module_name: str) -> bool:
    try:
        return isinstance(getattr(importlib.import_module(module_name), "FAMILY", None), FamilySpec)
    except Exception as exc:  # noqa: BLE001 - a broken family is reported, not allowed to hide the others
        warnings.warn(f"{module_name} failed to import: {exc!r}", RuntimeWarning, stacklevel=2)
        return False


def available_families() -> list[str]:
    """Every family found: the built-in `FAMILIES` in their order, then the other family modules of
    the family packages (a module whose `FAMILY` is a `FamilySpec`), sorted."""
    names = [n for n in FAMILIES if _module_exists(n)]
    extra = set()
    for package in family_packages():
        try:
            path = importlib.import_module(package).__path__
        except (ImportError, AttributeError):
            continue
        for info in pkgutil.iter_modules(path):
            name = info.name
            if name in names or name in extra or name.startswith("_") or info.ispkg:
                continue
            if _module_name(name) == f"{package}.{name}" and _defines_family(f"{package}.{name}"):
                extra.add(name)
    return names + sorted(extra)


def _specs() -> list[FamilySpec]:
    return [get_family(n) for n in available_families()]


def family_of_model_type(model_type: str | None, primary: bool = False) -> FamilySpec | None:
    """The family whose checkpoints have `config.model_type == model_type` (its
    `FamilySpec.hf_model_types`; with `primary`, only the type its own checkpoints are saved as),
    the first in `available_families()` order; None for a foreign architecture."""
    if not model_type:
        return None
    for spec in _specs():
        types = spec.hf_model_types[:1] if primary else spec.hf_model_types
        if model_type in types:
            return spec
    return None


class ModelTypeTable(Mapping):
    """A read-only `config.model_type -> value` table: what each family's spec answers
    (`value(spec)`, None = the family has no entry) for its model types (`primary`: only the one its
    checkpoints are saved as; else its aliases too), over `foreign` (architectures that are no
    family here). Built on first use, after the families can be imported, and rebuilt when the
    family packages change."""

    def __init__(self, foreign: Mapping, value, primary: bool = True):
        self._foreign = dict(foreign)
        self._value = value
        self._primary = primary
        self._built: tuple[tuple, dict] | None = None

    def _table(self) -> dict:
        key = tuple(family_packages())
        if self._built is None or self._built[0] != key:
            table = dict(self._foreign)
            for spec in reversed(_specs()):  # the first family in order wins a shared model type
                value = self._value(spec)
                if value is None:
                    continue
                for mtype in spec.hf_model_types[:1] if self._primary else spec.hf_model_types:
                    table[mtype] = value
            self._built = (key, table)
        return self._built[1]

    def __getitem__(self, key):
        return self._table()[key]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return f"ModelTypeTable({self._table()!r})"


# ELMo registers its config/model with the transformers Auto classes on import.
# A broken elmo module is reported as a warning here (and raised again by get_family("elmo")), so
# that it cannot stop the other families from loading.
if _module_exists("elmo"):
    try:
        importlib.import_module("workbench.families.elmo")
    except Exception as exc:  # noqa: BLE001 - reported, not swallowed
        warnings.warn(f"workbench.families.elmo failed to import: {exc!r}", RuntimeWarning, stacklevel=1)
