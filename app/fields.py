"""The one way the app reads a key of rows' `extra`: `row_field(rows, key, producer)`, checked against the
producer's declared row schema (`workbench.store.rowschema`).

Rows keep their per-producer settings (a fine-tuning row's `epoch`, a distillation row's `role` and
`depth`, a pruning point's `checkpoint`, ...) in `extra`, JSON text declared per producer. Before issue
51 the pages read them by string (`decode_extra(e).get("epoch")`), so a misspelt key read None and drew
an empty column. Here a key the producer does not declare raises `UndeclaredKeyError` (a KeyError
naming the key and the producer; the page shows it as one error line), and a declared key that an
older row lacks reads as missing (None), so stored runs stay readable. `tests/test_app_fields.py` scans
app/ for every `row_field(...)` call and checks its key against its producer's declaration.

The producer is named by the caller (`row_field(rows, "epoch", "finetune")`: a page knows whose rows it
reads) or, when None, taken from the rows' `probe` column and checked for each producer present (the
generic readers: baseline markers, a figure's `series` keys); a producer that declares nothing (rows
of a notebook or a test) is read unchecked, as the store writes its rows unchecked.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import pandas as pd

from workbench.store.results import decode_extra
from workbench.store.rowschema import UndeclaredKeyError, require_declared, schemas

__all__ = ["row_field", "UndeclaredKeyError", "declaring_module"]

# the drivers' producers: the module whose import declares their rows (a probe's is its package,
# `probes.PROBES`)
DRIVER_PRODUCERS = {"finetune": "workbench.drivers.finetune", "prune": "workbench.drivers.prune_rows",
                    "distill": "workbench.drivers.distill", "peft": "workbench.drivers.peft_sweep",
                    "cost": "workbench.cost"}


def declaring_module(producer: str) -> str | None:
    """The module that declares `producer`'s rows (None: not one the workbench ships)."""
    from probes import PROBES

    return DRIVER_PRODUCERS.get(producer) or (PROBES[producer][0] if producer in PROBES else None)


def _check(producer: str, key: str, named: bool) -> None:
    if not schemas(producer):  # declarations register when their module is imported
        module = declaring_module(producer)
        if module is not None:
            importlib.import_module(module)
    if schemas(producer) or named:  # a producer the caller names must declare the key
        require_declared(producer, key)


def _value(raw: Any, key: str) -> Any:
    if isinstance(raw, Mapping):
        return raw.get(key)
    # most rows lack most keys: decode only JSON text that names the key (replicate lists are long)
    if isinstance(raw, str) and f'"{key}"' in raw:
        return decode_extra(raw).get(key)
    return None


def row_field(rows: pd.DataFrame | pd.Series | Mapping, key: str, producer: str | None = None) -> Any:
    """`key` of `extra`, checked against `producer`'s declared schema: for a DataFrame of rows a Series
    on its index (None where a row lacks the key), for one row (a Series or a mapping holding
    `extra`) its value. `producer` None: each row's `probe`. Raises `UndeclaredKeyError` for a key
    that the producer does not declare."""
    frame = isinstance(rows, pd.DataFrame)
    if producer is not None:
        _check(producer, key, named=True)
    elif "probe" in rows:
        probes = rows["probe"].dropna().unique() if frame else [rows["probe"]]
        for p in probes:
            if isinstance(p, str):
                _check(p, key, named=False)
    if not frame:
        return _value(rows.get("extra"), key)
    if "extra" not in rows.columns:
        return pd.Series([None] * len(rows), index=rows.index, dtype=object)
    return pd.Series([_value(raw, key) for raw in rows["extra"]], index=rows.index, dtype=object)
