"""The model families the workbench can pretrain, one module each, found by name.

`get_family("bert")` imports `workbench.families.bert` and returns its `FAMILY` (a `FamilySpec`,
see `base.py`). Modules are imported lazily so that a broken or missing family never breaks the
others. Importing this package also imports `workbench.families.elmo` when it exists, because
that module registers ELMo with transformers' Auto classes (needed before `AutoModel` can open an
ELMo checkpoint).
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings

from workbench.families.base import FamilySpec, PretrainingOutput

FAMILIES = ("bert", "roberta", "spanbert", "albert", "electra", "deberta", "gpt", "t5", "bart", "elmo", "distilbert")

__all__ = ["FAMILIES", "FamilySpec", "PretrainingOutput", "get_family", "available_families"]


def _module_exists(name: str) -> bool:
    return importlib.util.find_spec(f"workbench.families.{name}") is not None


def get_family(name: str) -> FamilySpec:
    """The `FamilySpec` of family `name` (one of `FAMILIES`)."""
    if name not in FAMILIES:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
    if not _module_exists(name):
        raise KeyError(f"family {name!r} is not implemented yet (no workbench/families/{name}.py)")
    module = importlib.import_module(f"workbench.families.{name}")
    spec = getattr(module, "FAMILY", None)
    if not isinstance(spec, FamilySpec):
        raise TypeError(f"workbench.families.{name}.FAMILY is not a FamilySpec")
    return spec


def available_families() -> list[str]:
    """Names in `FAMILIES` whose module exists."""
    return [n for n in FAMILIES if _module_exists(n)]


# ELMo registers its config/model with the transformers Auto classes on import.
# A broken elmo module is reported as a warning here (and raised again by get_family("elmo")), so
# that it cannot stop the other families from loading.
if _module_exists("elmo"):
    try:
        importlib.import_module("workbench.families.elmo")
    except Exception as exc:  # noqa: BLE001 - reported, not swallowed
        warnings.warn(f"workbench.families.elmo failed to import: {exc!r}", RuntimeWarning, stacklevel=1)
