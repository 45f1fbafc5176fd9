"""The app reads rows' `extra` through one checked accessor, `app.fields.row_field` (issue 51, item 4):
a key the producer does not declare raises, naming the key and the producer; a declared key an older
row lacks reads as missing; and every key the app reads is declared by its producer (a scan of app/)."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pandas as pd
import pytest

from app.fields import UndeclaredKeyError, declaring_module, row_field
from workbench.paths import REPO_ROOT
from workbench.store.rowschema import MARKERS, RowSchema, declared_keys, schemas

APP = REPO_ROOT / "app"
# calls whose key is not a constant: checked when they read (a figure spec's `series` keys)
DYNAMIC_KEYS = {("app/data.py", "key")}
RAW_READS_LEFT: tuple[str, ...] = ()  # none: the reproduction rows read through row_field too


def _rows(probe: str, extras: list) -> pd.DataFrame:
    return pd.DataFrame({"probe": probe, "metric": "m", "value": 1.0,
                         "extra": [None if e is None else json.dumps(e) for e in extras]})


@pytest.fixture
def declared():
    from workbench.store import rowschema

    RowSchema("test-producer", "per epoch", required={"epoch": int}, optional={"note": str | None})
    RowSchema("test-producer", "per seed", required={"checkpoint": str})
    yield "test-producer"
    rowschema._REGISTRY.pop("test-producer", None)


def test_an_undeclared_key_raises_naming_the_key_and_the_producer(declared):
    rows = _rows(declared, [{"epoch": 1}, {"checkpoint": "a/b"}])
    with pytest.raises(KeyError) as got:
        row_field(rows, "epochs", declared)
    assert isinstance(got.value, UndeclaredKeyError)
    assert "'epochs'" in str(got.value) and "'test-producer'" in str(got.value)
    assert "checkpoint, epoch, note" in str(got.value)  # the declared keys (the markers besides)
    with pytest.raises(UndeclaredKeyError, match="'epochs'.*'test-producer'"):
        row_field(rows.iloc[0], "epochs", declared)  # one row
    with pytest.raises(UndeclaredKeyError, match="'epochs'.*'test-producer'"):
        row_field(rows, "epochs")  # the producer read off the rows' probe column
    with pytest.raises(UndeclaredKeyError, match="'epoch'.*'no-such-producer'.*declares no rows"):
        row_field(rows, "epoch", "no-such-producer")  # a producer named by the caller must declare the key


def test_declared_keys_read_as_values_and_missing_ones_as_none(declared):
    rows = _rows(declared, [{"epoch": 3, "note": "x"}, {"checkpoint": "a/b"}, None, {"epoch": 4}]).set_index(
        pd.Index([10, 11, 12, 13]))
    epoch = row_field(rows, "epoch", declared)
    assert list(epoch.index) == [10, 11, 12, 13]
    assert list(epoch) == [3, None, None, 4]  # older rows without the key: missing, not an error
    assert list(row_field(rows, "checkpoint", declared)) == [None, "a/b", None, None]
    assert row_field(rows.iloc[0], "note", declared) == "x"
    assert row_field({"probe": declared, "extra": {"epoch": 7}}, "epoch") == 7  # rows built in memory
    assert list(row_field(rows.drop(columns="extra"), "epoch", declared)) == [None] * 4
    # the baseline markers are declared for every producer
    assert MARKERS.keys() <= declared_keys(declared)
    assert list(row_field(_rows(declared, [{"baseline": "majority"}]), "baseline")) == ["majority"]


def test_rows_of_a_producer_that_declares_nothing_read_unchecked():
    rows = _rows("notebook-probe", [{"anything": 1}, {}])
    assert list(row_field(rows, "anything")) == [1, None]  # as the store writes them: unchecked


def test_the_shipped_producers_declarations_are_found_by_name():
    """The accessor imports a producer's declaring module itself (a page need not import it first)."""
    for producer in ("syntax", "align", "cloze", "coref", "extraction", "membership", "finetune", "prune",
                     "distill", "peft", "cost"):
        module = declaring_module(producer)
        assert module is not None, producer
        importlib.import_module(module)
        assert schemas(producer), producer


def _constant(node: ast.AST, module) -> tuple[bool, object]:
    """(resolved, value) of a call argument: a literal, or a module-level name of the calling module."""
    if isinstance(node, ast.Constant):
        return True, node.value
    if isinstance(node, ast.Name) and hasattr(module, node.id):
        return True, getattr(module, node.id)
    return False, ast.unparse(node)


def _app_files() -> list[Path]:
    return sorted(p for p in APP.rglob("*.py") if "__pycache__" not in p.parts)


def _accessor_calls() -> list[tuple[str, int, object, object, bool]]:
    """(file, line, key, producer, key resolved) of every `row_field(...)` call in app/."""
    calls = []
    for path in _app_files():
        rel = path.relative_to(REPO_ROOT).as_posix()
        tree = ast.parse(path.read_text(), rel)
        found = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
            (isinstance(n.func, ast.Name) and n.func.id == "row_field")
            or (isinstance(n.func, ast.Attribute) and n.func.attr == "row_field"))]
        if not found or rel == "app/fields.py":
            continue
        module = importlib.import_module(rel.removesuffix(".py").replace("/", "."))
        for call in found:
            args = list(call.args) + [kw.value for kw in call.keywords if kw.arg in ("key", "producer")]
            assert len(args) >= 2, f"{rel}:{call.lineno}: row_field(rows, key[, producer])"
            key_ok, key = _constant(args[1], module)
            producer = None
            if len(args) > 2:
                ok, producer = _constant(args[2], module)
                assert ok, f"{rel}:{call.lineno}: the producer must be a literal or a module constant, got {producer}"
            calls.append((rel, call.lineno, key, producer, key_ok))
    return calls


def test_every_key_the_app_reads_is_declared_by_its_producer():
    """A scan of app/: each `row_field(rows, KEY, PRODUCER)` call's key is declared by PRODUCER's row
    schema; a call without a producer (rows of any producer) reads a marker every producer declares."""
    calls = _accessor_calls()
    assert len(calls) >= 30, calls  # the pages' reads (the scan finds them)
    readers = {}
    for rel, line, key, producer, key_ok in calls:
        if not key_ok:
            assert (rel, key) in DYNAMIC_KEYS, f"{rel}:{line}: key {key} is not a constant; read a literal key"
            continue
        if producer is None:
            assert key in MARKERS, (f"{rel}:{line}: {key!r} read from rows of any producer; only the markers "
                                    f"{sorted(MARKERS)} are declared for every producer: name the producer")
            continue
        module = declaring_module(producer)
        assert module is not None, f"{rel}:{line}: producer {producer!r} is not one the workbench ships"
        importlib.import_module(module)
        assert key in declared_keys(producer), f"{rel}:{line}: {key!r} is not declared by {producer!r}"
        readers.setdefault(producer, set()).add(key)
    # the keys the issue names, read by the pages and declared by their producers
    assert {"checkpoint"} <= readers["prune"] and {"method", "trainable"} <= readers["peft"]
    assert {"role", "depth"} <= readers["distill"] and {"epoch"} <= readers["finetune"]


def test_the_app_reads_extra_only_through_the_accessor():
    """No `decode_extra(...)` or `...["extra"]` subscript in app/ but app/fields.py (and RAW_READS_LEFT)."""
    found = {}
    for path in _app_files():
        rel = path.relative_to(REPO_ROOT).as_posix()
        if rel == "app/fields.py" or rel.startswith(RAW_READS_LEFT):
            continue
        tree = ast.parse(path.read_text(), rel)
        n = 0
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "decode_extra":
                n += 1
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "extra":
                n += 1
        if n:
            found[rel] = n
    assert found == {}, f"raw reads of extra (read them through app.fields.row_field): {found}"
