"""The results store: one tidy long table for every probe, one folder per run.

Layout under the runs root (`workbench.paths.runs_root()` unless a root is given)::

    <root>/results/<run_id>/manifest.json   provenance (see workbench.store.manifest) + notes + summary
    <root>/results/<run_id>/rows.parquet    the run's rows, columns RESULT_COLUMNS
    <root>/results/.writers/<run_id>.lock   held (flock) by a live writer while the run is open
    <root>/catalog.sqlite                   index of the runs, for listing and filtering

Source of truth: the run folders. A run exists exactly when `results/<run_id>/` exists; the
folder is written as a hidden temporary folder and renamed into place (`workbench.io.atomic_dir`)
in one step, so it always holds a complete manifest and rows, and a crash leaves only a hidden
`.<run_id>.*.tmp` folder that every reader ignores and `ResultsStore.gc()` removes. The catalog is
an index: a run is registered right after its rename, in one transaction, and every listing
first compares the catalog's run ids with the folders and repairs the difference (a crash between
rename and registration, a folder deleted by hand); `reindex()` rebuilds it from the manifests.

Why SQLite in WAL mode and not DuckDB for the catalog: many probe processes finish runs at the
same time. DuckDB lets only one process open a database file for writing (a second writer fails
to open it), whereas SQLite serialises short write transactions across processes and, with a
busy timeout, a writer that finds the file locked waits instead of failing; WAL lets readers (the
app) read while a writer commits. DuckDB or pandas read the parquet files directly anyway.
WAL needs a local filesystem (not NFS); a runs root on a network share should be given its own
catalog per machine or use `reindex()` after copying.

Concerns:
- the rows' schema and its checks: `ResultsError`, `empty_rows`, `to_json`, `validate_rows`,
  `decode_extra`, `coerce_rows`
- writing a run atomically: `new_run_id`, `RunWriter`
- the store (run folders and the SQLite catalog) and its resumable pieces: `ResultsStore`,
  `RunNotFoundError`, `FinishedUnits`
- text for `bertology runs`: `format_runs`, `format_rows`, `format_manifest`
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import hashlib
import fcntl
import json
import math
import numbers
import os
import secrets
import shutil
import sqlite3
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from workbench.errors import ConfigError, WorkbenchError
from workbench.io import atomic_dir, atomic_path, atomic_write_json
from workbench.store.manifest import build_manifest, utc_now_iso
from workbench.paths import runs_root
from workbench.store.rowschema import check_extra, schemas

RESULT_COLUMNS = [
    "run_id", "model", "family", "seed", "step", "probe", "task", "split", "stack", "layer",
    "metric", "value", "n", "ci_low", "ci_high", "extra",
]  # fmt: skip
STRING_COLUMNS = ("run_id", "model", "family", "probe", "task", "split", "stack", "metric", "extra")
INT_COLUMNS = ("seed", "step", "layer", "n")
FLOAT_COLUMNS = ("value", "ci_low", "ci_high")
REQUIRED_COLUMNS = ("probe", "task", "metric", "value")
DTYPES: dict[str, Any] = {
    **{c: pd.StringDtype() for c in STRING_COLUMNS},
    **{c: pd.Int64Dtype() for c in INT_COLUMNS},
    **{c: np.dtype("float64") for c in FLOAT_COLUMNS},
}
ARROW_SCHEMA = pa.schema(
    [
        (c, pa.string() if c in STRING_COLUMNS else pa.int64() if c in INT_COLUMNS else pa.float64())
        for c in RESULT_COLUMNS
    ]
)
SCHEMA_VERSION = 1
_DICTIONARY_COLUMNS = [c for c in STRING_COLUMNS if c != "extra"]  # few distinct values per file
MANIFEST_NAME = "manifest.json"
ROWS_NAME = "rows.parquet"
BUSY_TIMEOUT_S = 120.0

# Catalog columns; models/families/probes/tasks/metrics/seeds/steps hold the distinct values found
# in a run's rows (seeds/steps/metrics were added later: `_init_catalog` migrates older catalogs).
CATALOG_COLUMNS = [
    "run_id", "kind", "name", "status", "created", "finished", "n_rows",
    "models", "families", "probes", "tasks", "metrics", "seeds", "steps", "path",
]  # fmt: skip
_LIST_COLUMNS = ("models", "families", "probes", "tasks", "metrics", "seeds", "steps")
_ADDED_COLUMNS = ("metrics", "seeds", "steps")
_CATALOG_ALIASES = {"model": "models", "family": "families", "probe": "probes", "task": "tasks",
                    "metric": "metrics", "seed": "seeds", "step": "steps"}  # fmt: skip

# Test hook: called with the hidden temporary folder after rows and manifest are written and
# before the rename that publishes the run (the crash test kills the process inside it).
_before_publish: Callable[[Path], None] | None = None


class ResultsError(WorkbenchError, ValueError):
    """Rows that do not fit the results schema, or a misuse of the store."""


class RunNotFoundError(WorkbenchError, KeyError):
    """No published run has this id."""

    def __str__(self) -> str:  # KeyError would print the message with quotes
        return str(self.args[0]) if self.args else ""


# ----------------------------------------------------------------------------------------------
# Schema: validation and dtypes


def empty_rows() -> pd.DataFrame:
    """A frame with no rows and exactly the result columns and dtypes."""
    return pd.DataFrame({c: pd.Series([], dtype=DTYPES[c]) for c in RESULT_COLUMNS})


def _is_missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serializable")


def to_json(obj: Any, what: str) -> str:
    """Strict JSON (paths, numpy scalars and arrays converted), with an error naming `what`."""
    try:
        return json.dumps(obj, sort_keys=True, default=_json_default, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise ResultsError(f"{what} cannot be stored as JSON: {e}") from None


def _column_values(rows: pd.DataFrame | Iterable[Mapping[str, Any]]) -> tuple[dict[str, list], int, set[str]]:
    """Column -> list of Python values, the row count, and the keys present in every row."""
    if isinstance(rows, pd.DataFrame):
        if not all(isinstance(c, str) for c in rows.columns):
            raise ResultsError(f"result columns must be named by strings, got {list(rows.columns)!r}")
        if rows.columns.duplicated().any():
            dup = sorted(set(rows.columns[rows.columns.duplicated()]))
            raise ResultsError(f"duplicate columns {dup} in the rows given to add()")
        cols = {c: rows[c].tolist() for c in rows.columns}
        return cols, len(rows), set(rows.columns)
    if isinstance(rows, Mapping):
        raise ResultsError("add() takes a DataFrame or a list of row dicts, not a single dict; wrap it in a list")
    records = list(rows)
    keys: list[str] = []
    seen: set[str] = set()
    everywhere: set[str] | None = None
    for i, r in enumerate(records):
        if not isinstance(r, Mapping):
            raise ResultsError(f"row {i} given to add() is a {type(r).__name__}, not a dict")
        for k in r:
            if k not in seen:
                seen.add(k)
                keys.append(k)
        everywhere = set(r) if everywhere is None else everywhere & set(r)
    cols = {k: [r.get(k) for r in records] for k in keys}
    return cols, len(records), everywhere or set()


def validate_rows(rows: pd.DataFrame | Iterable[Mapping[str, Any]], run_id: str | None = None) -> pd.DataFrame:
    """Check rows against the schema and return them with exactly RESULT_COLUMNS and DTYPES.

    Required per row: probe, task, metric (non-empty strings) and value (a number; NaN is allowed
    for a metric that is undefined, e.g. a correlation over constant predictions, but None is
    not). Other columns are optional and missing values become NA. A column outside the schema is
    an error: put probe-specific fields in `extra`, a dict (JSON-encoded here) or a JSON string.
    `run_id` is assigned by the writer; rows that carry a different one are rejected.
    """
    cols, n_rows, everywhere = _column_values(rows)
    unknown = [c for c in cols if c not in RESULT_COLUMNS]
    if unknown:
        raise ResultsError(
            f"unknown result column(s) {unknown}: the schema is {RESULT_COLUMNS}; "
            f"put probe-specific fields in `extra`, e.g. extra={{{unknown[0]!r}: ...}}"
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in cols]
    if missing:
        raise ResultsError(
            f"rows given to add() lack required column(s) {missing} (required: {list(REQUIRED_COLUMNS)})"
        )
    if not isinstance(rows, pd.DataFrame):
        for c in REQUIRED_COLUMNS:
            if c not in everywhere:
                i = next(i for i, v in enumerate(cols[c]) if v is None)
                raise ResultsError(f"row {i} given to add() has no {c!r}")

    out: dict[str, pd.Series] = {}
    for c in RESULT_COLUMNS:
        values = cols.get(c, [None] * n_rows)
        if c == "extra":
            parsed: list[Any] = []  # each row's extra as an object, for the producer's schema check
            out[c] = pd.Series([_encode_extra(v, i, parsed) for i, v in enumerate(values)], dtype=DTYPES[c])
        elif c in STRING_COLUMNS:
            for i, v in enumerate(values):
                if _is_missing(v):
                    if c in REQUIRED_COLUMNS:
                        raise ResultsError(f"row {i} given to add() has no {c!r} (required, got {v!r})")
                elif not isinstance(v, str):
                    raise ResultsError(f"column {c!r}, row {i}: expected a string, got {type(v).__name__} {v!r}")
                elif c in REQUIRED_COLUMNS and not v:
                    raise ResultsError(f"row {i} given to add() has an empty {c!r}")
            out[c] = pd.Series([None if _is_missing(v) else v for v in values], dtype=DTYPES[c])
        elif c in INT_COLUMNS:
            ints = []
            for i, v in enumerate(values):
                if _is_missing(v):
                    ints.append(None)
                    continue
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
                    raise ResultsError(f"column {c!r}, row {i}: expected an integer, got {type(v).__name__} {v!r}")
                if not float(v).is_integer():
                    raise ResultsError(f"column {c!r}, row {i}: expected an integer, got {v!r}")
                if c in ("layer", "n", "step") and v < 0:
                    raise ResultsError(f"column {c!r}, row {i}: must be >= 0, got {v!r}")
                ints.append(int(v))
            out[c] = pd.Series(ints, dtype=DTYPES[c])
        else:
            floats = []
            for i, v in enumerate(values):
                if v is None or v is pd.NA:
                    if c == "value" and not isinstance(rows, pd.DataFrame):
                        raise ResultsError(
                            f"row {i} given to add() has value=None (use float('nan') for an undefined metric)"
                        )
                    floats.append(math.nan)
                elif isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
                    raise ResultsError(f"column {c!r}, row {i}: expected a number, got {type(v).__name__} {v!r}")
                else:
                    floats.append(float(v))
            out[c] = pd.Series(floats, dtype=DTYPES[c])

    _check_declared_extras(cols.get("probe", []), parsed)
    df = pd.DataFrame(out, columns=RESULT_COLUMNS)
    if run_id is not None:
        given = df["run_id"].dropna()
        if (given != run_id).any():
            raise ResultsError(
                f"rows carry run_id {given[given != run_id].iloc[0]!r} but are being added to run {run_id!r}; "
                "the store assigns run_id, leave it out"
            )
        df["run_id"] = pd.Series([run_id] * len(df), dtype=DTYPES["run_id"])
    return df


def _check_declared_extras(probes: list, extras: list) -> None:
    """Each row's `extra` against its producer's declared schema (`workbench.store.rowschema`): an
    undeclared key or a wrong type is an error now, naming the producer, the row and the key."""
    for i, (probe, extra) in enumerate(zip(probes, extras)):
        if not isinstance(probe, str) or not schemas(probe):
            continue
        problem = check_extra(probe, extra if isinstance(extra, Mapping) else {})
        if problem is not None:
            raise ResultsError(f"row {i} of producer {probe!r}: extra does not fit its declared schema: {problem} "
                               f"(declare new keys in {probe!r}'s RowSchema, workbench.store.rowschema)")


def _encode_extra(v: Any, i: int, parsed: list[Any]) -> str | None:
    """The JSON text of a row's extra; appends the object it holds to `parsed`."""
    if _is_missing(v):
        parsed.append(None)
        return None
    if isinstance(v, str):
        try:
            parsed.append(json.loads(v))
        except json.JSONDecodeError as e:
            msg = f"column 'extra', row {i}: a string must be JSON ({e}); pass a dict instead"
            raise ResultsError(msg) from None
        return v
    if isinstance(v, (Mapping, list, tuple)):
        parsed.append(v)
        return to_json(v, f"column 'extra', row {i}")
    raise ResultsError(f"column 'extra', row {i}: expected a dict or a JSON string, got {type(v).__name__} {v!r}")


def decode_extra(value: Any) -> dict:
    """A row's `extra` as a dict, wherever rows are read (probes' summaries, app pages, figures):
    the store keeps it as JSON text (`_encode_extra`), rows built in memory may hold the dict.
    Missing, empty, non-object or unreadable text reads as {}."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str) and value:
        try:
            obj = json.loads(value)
        except ValueError:
            return {}
        return obj if isinstance(obj, dict) else {}
    return {}


def coerce_rows(rows: pd.DataFrame | pa.Table) -> pd.DataFrame:
    """Stored rows (an arrow table or frame read from parquet) with exactly RESULT_COLUMNS and DTYPES."""
    if isinstance(rows, pa.Table):
        # Map int64 straight to nullable Int64 (not through float64, which would round big ints).
        rows = rows.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype(), pa.string(): pd.StringDtype()}.get)
    df = rows.reset_index(drop=True)
    return pd.DataFrame({c: df[c].astype(DTYPES[c]) for c in RESULT_COLUMNS}, columns=RESULT_COLUMNS)


# ----------------------------------------------------------------------------------------------
# Run ids and writer locks


def new_run_id() -> str:
    """A sortable, unique id: UTC time to the microsecond plus 32 random bits.

    e.g. `20261121T153012.123456Z-9f1c04ab`. Lexicographic order is creation order; the random
    suffix is an identifier, not an experimental choice, so it is not seeded. Uniqueness across
    processes is enforced when the writer's lock file is created with O_EXCL.
    """
    now = _dt.datetime.now(_dt.timezone.utc)
    return f"{now:%Y%m%dT%H%M%S.%f}Z-{secrets.token_hex(4)}"


def _lock_is_held(path: Path) -> bool:
    """Whether a live process holds the flock on `path` (released by the kernel when it dies)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    else:
        return False
    finally:
        os.close(fd)


def _split_list(value: str | None) -> list[str]:
    return json.loads(value) if value else []


# ----------------------------------------------------------------------------------------------
# Writer


class RunWriter:
    """Collects one run's rows and notes in memory and publishes them atomically on finish().

    Use as a context manager: on normal exit the run is finished, on an exception nothing is
    published. Probes produce at most ~1e5 rows per run, so buffering in memory is fine.
    """

    def __init__(self, store: ResultsStore, run_id: str, kind: str, name: str | None,
                 provenance: dict[str, Any], lock_fd: int, lock_path: Path):  # fmt: skip
        self.store = store
        self.run_id = run_id
        self.kind = kind
        self.name = name
        self._provenance = provenance
        self._notes: dict[str, Any] = {}
        self._frames: list[pd.DataFrame] = []
        self._lock_fd: int | None = lock_fd
        self._lock_path = lock_path
        self._state = "open"

    @property
    def n_rows(self) -> int:
        return sum(len(f) for f in self._frames)

    def _check_open(self) -> None:
        if self._state != "open":
            raise ResultsError(f"run {self.run_id} is already {self._state}; start a new run to add more")

    def add(self, rows: pd.DataFrame | Iterable[Mapping[str, Any]]) -> int:
        """Validate and buffer rows (see `validate_rows`); returns how many were added."""
        self._check_open()
        df = validate_rows(rows, run_id=self.run_id)
        if len(df):
            self._frames.append(df)
        return len(df)

    def note(self, key: str, value: Any) -> None:
        """Record a JSON-serialisable fact in the manifest's `notes` (e.g. a probe's fit time)."""
        self._check_open()
        if not isinstance(key, str) or not key:
            raise ResultsError(f"note key must be a non-empty string, got {key!r}")
        to_json(value, f"note {key!r}")
        self._notes[key] = value

    def finish(self) -> str:
        """Write rows and manifest, publish the folder in one rename, register it; return the run id."""
        self._check_open()
        rows = pd.concat(self._frames, ignore_index=True) if self._frames else empty_rows()

        def distinct(col: str) -> list:
            values = rows[col].dropna().unique().tolist()
            return sorted(int(v) for v in values) if col in INT_COLUMNS else sorted(values)

        manifest = {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "kind": self.kind,
            "name": self.name,
            "status": "finished",
            **self._provenance,
            "finished": utc_now_iso(),
            "n_rows": len(rows),
            "summary": {
                "models": distinct("model"),
                "families": distinct("family"),
                "probes": distinct("probe"),
                "tasks": distinct("task"),
                "metrics": distinct("metric"),
                "seeds": distinct("seed"),
                "steps": distinct("step"),
            },
            "notes": self._notes,
        }
        manifest = json.loads(to_json(manifest, f"manifest of run {self.run_id}"))
        table = pa.Table.from_pandas(rows, schema=ARROW_SCHEMA, preserve_index=False)
        try:
            with atomic_dir(self.store.results_dir / self.run_id) as tmp:
                rows_path = tmp / ROWS_NAME
                pq.write_table(table, rows_path)
                with open(rows_path, "rb+") as f:
                    os.fsync(f.fileno())
                atomic_write_json(tmp / MANIFEST_NAME, manifest)
                if _before_publish is not None:
                    _before_publish(tmp)
            self.store._register(manifest)
            self._state = "finished"
        except BaseException:
            self._state = "failed"
            raise
        finally:
            self._release()
        return self.run_id

    def abort(self) -> None:
        """Drop the buffered rows; nothing is published."""
        if self._state == "open":
            self._state = "aborted"
            self._frames.clear()
        self._release()

    def _release(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                self._lock_path.unlink()
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            if self._state == "open":
                self.finish()
        else:
            self.abort()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._release()


# ----------------------------------------------------------------------------------------------
# Store


class ResultsStore:
    """Runs of tidy result rows under a runs root; see the module docstring for layout and guarantees."""

    def __init__(self, root: str | Path | None = None):
        self.root = (Path(root).expanduser() if root is not None else runs_root()).resolve()
        self.results_dir = self.root / "results"
        self.writers_dir = self.results_dir / ".writers"
        self.catalog_path = self.root / "catalog.sqlite"
        self.writers_dir.mkdir(parents=True, exist_ok=True)
        self._init_catalog()
        self._sync()

    def __repr__(self) -> str:
        return f"ResultsStore({str(self.root)!r})"

    # -- catalog plumbing ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _connect(self):
        con = sqlite3.connect(self.catalog_path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            con.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            yield con
        finally:
            con.close()

    @contextlib.contextmanager
    def _transaction(self):
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front (waiting if busy)."""
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def _init_catalog(self) -> None:
        with self._connect() as con:
            mode = con.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                warnings.warn(f"catalog {self.catalog_path} runs in journal mode {mode!r}, not WAL", stacklevel=3)
            con.execute("PRAGMA synchronous = NORMAL")  # safe with WAL; the catalog is rebuildable anyway
        with self._transaction() as con:
            con.execute(
                "CREATE TABLE IF NOT EXISTS runs ("
                "run_id TEXT PRIMARY KEY, kind TEXT NOT NULL, name TEXT, status TEXT NOT NULL, "
                "created TEXT, finished TEXT, n_rows INTEGER, models TEXT, families TEXT, "
                "probes TEXT, tasks TEXT, metrics TEXT, seeds TEXT, steps TEXT, path TEXT NOT NULL)"
            )
            have = {r[1] for r in con.execute("PRAGMA table_info(runs)")}
            added = [c for c in _ADDED_COLUMNS if c not in have]
            for c in added:  # a catalog written before these columns existed
                con.execute(f"ALTER TABLE runs ADD COLUMN {c} TEXT")
        if added:
            self.reindex()

    def _catalog_row(self, manifest: Mapping[str, Any]) -> tuple:
        s = dict(manifest.get("summary", {}))
        if any(k not in s for k in _ADDED_COLUMNS):  # a run published before the summary had them
            s.update(self._summary_from_rows(manifest["run_id"], s))
        return (
            manifest["run_id"], manifest["kind"], manifest.get("name"), manifest.get("status", "finished"),
            manifest.get("created"), manifest.get("finished"), int(manifest.get("n_rows", 0)),
            json.dumps(s.get("models", [])), json.dumps(s.get("families", [])),
            json.dumps(s.get("probes", [])), json.dumps(s.get("tasks", [])),
            json.dumps(s.get("metrics", [])), json.dumps(s.get("seeds", [])), json.dumps(s.get("steps", [])),
            f"results/{manifest['run_id']}",
        )  # fmt: skip

    def _summary_from_rows(self, run_id: str, summary: Mapping[str, Any]) -> dict[str, list]:
        """metrics/seeds/steps of an older run, read from its rows (empty when they cannot be read)."""
        try:
            t = pq.read_table(self.results_dir / run_id / ROWS_NAME, columns=["metric", "seed", "step"])
        except (OSError, pa.ArrowException, KeyError, ValueError):
            return {k: [] for k in _ADDED_COLUMNS if k not in summary}
        return {"metrics": sorted(str(v) for v in pc.unique(t["metric"]).to_pylist() if v is not None),
                "seeds": sorted(int(v) for v in pc.unique(t["seed"]).to_pylist() if v is not None),
                "steps": sorted(int(v) for v in pc.unique(t["step"]).to_pylist() if v is not None)}

    _INSERT = (
        f"INSERT OR REPLACE INTO runs ({', '.join(CATALOG_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(CATALOG_COLUMNS))})"
    )

    def _register(self, manifest: Mapping[str, Any]) -> None:
        with self._transaction() as con:
            con.execute(self._INSERT, self._catalog_row(manifest))

    def _run_dir(self, run_id: str) -> Path:
        if not isinstance(run_id, str) or not run_id or run_id.startswith(".") or "/" in run_id or "\\" in run_id:
            raise RunNotFoundError(f"{run_id!r} is not a run id")
        return self.results_dir / run_id

    def _folder_ids(self) -> list[str]:
        return sorted(e.name for e in os.scandir(self.results_dir) if not e.name.startswith(".") and e.is_dir())

    def _load_manifest(self, run_id: str) -> dict[str, Any] | None:
        """The manifest of a published folder, or None (with a warning) when it is not a run."""
        folder = self.results_dir / run_id
        try:
            manifest = json.loads((folder / MANIFEST_NAME).read_text())
        except FileNotFoundError:
            if folder.exists():
                warnings.warn(f"{folder} has no {MANIFEST_NAME}: not a run, ignored", stacklevel=3)
            return None
        except json.JSONDecodeError as e:
            warnings.warn(f"{folder / MANIFEST_NAME} is not valid JSON ({e}): ignored", stacklevel=3)
            return None
        if manifest.get("run_id") != run_id or not (folder / ROWS_NAME).is_file():
            msg = f"{folder} is not a complete run (manifest run_id or {ROWS_NAME} missing): ignored"
            warnings.warn(msg, stacklevel=3)
            return None
        return manifest

    def _sync(self) -> None:
        """Make the catalog match the folders (the truth): add unregistered runs, drop vanished ones.

        The catalog is read before the folders are listed, so a run published in between is only
        ever added (idempotently), never dropped; a drop re-checks the folder inside the transaction.
        """
        with self._connect() as con:
            cataloged = {r[0] for r in con.execute("SELECT run_id FROM runs")}
        folders = set(self._folder_ids())
        to_add = [m for rid in sorted(folders - cataloged) if (m := self._load_manifest(rid)) is not None]
        to_drop = sorted(cataloged - folders)
        if not to_add and not to_drop:
            return
        with self._transaction() as con:
            for m in to_add:
                con.execute(self._INSERT, self._catalog_row(m))
            for rid in to_drop:
                if not (self.results_dir / rid).exists():
                    con.execute("DELETE FROM runs WHERE run_id = ?", (rid,))

    def reindex(self) -> int:
        """Rebuild the catalog from the run folders; returns the number of runs indexed."""
        manifests = [m for rid in self._folder_ids() if (m := self._load_manifest(rid)) is not None]
        with self._transaction() as con:
            con.execute("DELETE FROM runs")
            con.executemany(self._INSERT, [self._catalog_row(m) for m in manifests])
        return len(manifests)

    # -- writing -------------------------------------------------------------------------------

    def start_run(
        self,
        kind: str,
        config: Mapping[str, Any],
        *,
        seeds: Iterable[int] | Mapping[str, int] = (),
        data_files: Iterable[str | Path] = (),
        checkpoints: Iterable[Any] = (),
        name: str | None = None,
    ) -> RunWriter:
        """Open a run: record provenance now (hashing data files and checkpoints), publish on finish().

        `checkpoints` entries may be paths, `(path, sha256)` pairs, dicts or model handles (see
        `workbench.store.manifest.checkpoint_record`).
        """
        if not isinstance(kind, str) or not kind:
            raise ConfigError(f"run kind must be a non-empty string (e.g. 'probe', 'train'), got {kind!r}")
        if name is not None and not isinstance(name, str):
            raise ConfigError(f"run name must be a string, got {name!r}")
        if not isinstance(config, Mapping):
            raise ConfigError(f"run config must be a dict, got {type(config).__name__}")
        try:
            config = json.loads(to_json(dict(config), "run config"))
        except ResultsError as e:
            raise ConfigError(str(e)) from None
        started = utc_now_iso()
        provenance = build_manifest(
            config, seeds=seeds, data_files=list(data_files), checkpoints=list(checkpoints), started=started
        )
        provenance["created"] = provenance.pop("started")  # one name for a run's start time
        run_id, fd, lock_path = _claim_run_id(self.results_dir, self.writers_dir)
        fcntl.flock(fd, fcntl.LOCK_EX)
        # Written after the flock: gc treats an unlocked, empty lock file younger than a minute as
        # a writer that has not locked yet.
        info = {"run_id": run_id, "kind": kind, "name": name, "created": started, "pid": os.getpid(),
                "hostname": provenance["environment"]["hostname"]}  # fmt: skip
        os.write(fd, json.dumps(info).encode())
        return RunWriter(self, run_id, kind, name, provenance, fd, lock_path)

    # -- reading -------------------------------------------------------------------------------

    def runs(self, *, include_running: bool = False, **filters: Any) -> pd.DataFrame:
        """The catalog as a DataFrame, oldest run first, one row per published run.

        Filters match catalog columns (`kind="probe"`, `status="finished"`, `run_id=[...]`);
        `model=`, `family=`, `probe=`, `task=` keep runs whose rows contain that value. A list or
        tuple matches any of its values. `include_running=True` adds open writers (status
        "running") from their lock files.
        """
        self._sync()
        with self._connect() as con:
            records = con.execute(f"SELECT {', '.join(CATALOG_COLUMNS)} FROM runs ORDER BY run_id").fetchall()
        rows = [dict(zip(CATALOG_COLUMNS, r)) for r in records]
        for r in rows:
            for c in _LIST_COLUMNS:
                r[c] = _split_list(r[c])
            r["path"] = str(self.root / r["path"])
        if include_running:
            rows += _running_writers(self.writers_dir)
        for key, want in filters.items():
            col = _CATALOG_ALIASES.get(key, key)
            if col not in CATALOG_COLUMNS:
                raise ResultsError(
                    f"unknown runs() filter {key!r}; filter on {CATALOG_COLUMNS} or {list(_CATALOG_ALIASES)}"
                )
            wanted = set(want) if isinstance(want, (list, tuple, set, frozenset)) else {want}
            if col in _LIST_COLUMNS:
                rows = [r for r in rows if wanted & set(r[col])]
            else:
                rows = [r for r in rows if r[col] in wanted]
        df = pd.DataFrame(rows, columns=CATALOG_COLUMNS)
        for c in CATALOG_COLUMNS:
            if c in _LIST_COLUMNS:
                df[c] = pd.Series([", ".join(map(str, v)) for v in df[c]], dtype=pd.StringDtype())
            elif c == "n_rows":
                df[c] = df[c].astype(pd.Int64Dtype())
            else:
                df[c] = df[c].astype(pd.StringDtype())
        return df

    def read(self, run_id: str) -> pd.DataFrame:
        """One run's rows, with exactly RESULT_COLUMNS and DTYPES."""
        path = self._run_dir(run_id) / ROWS_NAME
        try:
            table = pq.read_table(path, schema=ARROW_SCHEMA)
        except FileNotFoundError:
            raise RunNotFoundError(f"no run {run_id!r} under {self.results_dir}") from None
        return coerce_rows(table)

    def manifest(self, run_id: str) -> dict[str, Any]:
        """One run's manifest (provenance, notes, summary)."""
        path = self._run_dir(run_id) / MANIFEST_NAME
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise RunNotFoundError(f"no run {run_id!r} under {self.results_dir}") from None

    def query(self, **filters: Any) -> pd.DataFrame:
        """Rows of all runs matching equality filters on result columns, oldest run first.

        `store.query(probe="syntax", task="upos", layer=3)`; a list or tuple matches any of its
        values, None matches missing values. Runs are pre-selected from the catalog (run_id,
        model, family, probe, task, metric, seed, step) and every filter is applied to each run's rows.
        """
        for key, want in filters.items():
            if key not in RESULT_COLUMNS or key == "extra":
                valid = [c for c in RESULT_COLUMNS if c != "extra"]
                raise ResultsError(f"unknown query() filter {key!r}; filter on {valid}")
            _filter_expression(key, want)  # type-checks the values
        catalog_filters = {k: v for k, v in filters.items()
                           if k in ("run_id", "model", "family", "probe", "task", "metric", "seed", "step")
                           and v is not None
                           and not (isinstance(v, (list, tuple, set, frozenset)) and None in v)}  # fmt: skip
        run_ids = self.runs(**catalog_filters)["run_id"].tolist()
        # Each run's rows are filtered as they are read (`_read_run_rows` says why that way); pyarrow
        # releases the GIL while decoding, so a few threads read files side by side.
        with ThreadPoolExecutor(max_workers=min(4, (os.cpu_count() or 1) + 1)) as pool:
            tables = [t for t in pool.map(lambda rid: _read_run_rows(self.results_dir / rid / ROWS_NAME, filters),
                                          run_ids) if t is not None]
        if not tables:
            return empty_rows()
        return coerce_rows(pa.concat_tables(tables))

    # -- housekeeping --------------------------------------------------------------------------

    def delete(self, run_id: str) -> None:
        """Remove a run: hide its folder (one rename, so readers see it vanish at once), unregister, erase."""
        folder = self._run_dir(run_id)
        if not folder.is_dir():
            raise RunNotFoundError(f"no run {run_id!r} under {self.results_dir}")
        hidden = self.results_dir / f".{run_id}.deleted-{secrets.token_hex(4)}.tmp"
        try:
            os.replace(folder, hidden)
        except FileNotFoundError:
            raise RunNotFoundError(f"no run {run_id!r} under {self.results_dir} (deleted concurrently)") from None
        with self._transaction() as con:
            con.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
        shutil.rmtree(hidden, ignore_errors=True)

    def gc(self, min_age_s: float = 60.0, partials_max_age_days: float = 30.0) -> list[Path]:
        """Remove what crashed writers left behind; returns the removed paths.

        A hidden `.<run_id>.*` folder in results/ belongs to a live writer exactly when that
        run's lock file is locked (the kernel drops a dead process's flock, SIGKILL included), so
        any other hidden folder is removed. Unlocked lock files are removed too, except empty ones
        younger than `min_age_s` (a writer between creating and locking its file). Saved units of
        interrupted runs (`FinishedUnits`) untouched for `partials_max_age_days` are removed.
        """
        return _collect_garbage(self, min_age_s, partials_max_age_days)


# --------------------------------------------------------------------------- store internals
# Parts of ResultsStore that need only a folder or a path, not the catalog: kept out of the class
# so it reads as the store's API (write, read, query, housekeeping) with the mechanics below.

def _claim_run_id(results_dir: Path, writers_dir: Path) -> tuple[str, int, Path]:
    """A fresh run id with its lock file created exclusively -> (run_id, open fd, lock path).

    O_EXCL on the lock file is what makes the id ours among concurrent writers (a published
    folder of that id is skipped too); the caller flocks the fd before writing into it."""
    for _ in range(100):
        run_id = new_run_id()
        lock_path = writers_dir / f"{run_id}.lock"
        if (results_dir / run_id).exists():
            continue
        try:
            fd = os.open(lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        break
    else:  # pragma: no cover - 100 collisions of 32 random bits within a microsecond
        raise ResultsError(f"could not allocate a unique run id under {results_dir}")
    return run_id, fd, lock_path


def _running_writers(writers_dir: Path) -> list[dict[str, Any]]:
    """Catalog-shaped rows (status "running") of the open writers: lock files whose flock is held
    (a dead writer's is not, so it never shows as running)."""
    out = []
    for lock in sorted(writers_dir.glob("*.lock")):
        if not _lock_is_held(lock):
            continue
        try:
            info = json.loads(lock.read_text() or "{}")
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        if not info:
            continue
        out.append({"run_id": info["run_id"], "kind": info.get("kind"), "name": info.get("name"),
                    "status": "running", "created": info.get("created"), "finished": None, "n_rows": None,
                    **{c: [] for c in _LIST_COLUMNS}, "path": None})  # fmt: skip
    return out


def _read_run_rows(path: Path, filters: Mapping[str, Any]) -> pa.Table | None:
    """One run's rows (`path`: its rows.parquet) matching `filters`, in ARROW_SCHEMA; None when
    none match or the run was deleted since the catalog was read.

    Each file is read with its strings as dictionaries and filtered by a boolean mask before
    anything else is materialised: the cheapest path measured on a loaded 2-core machine, well
    ahead of a pyarrow dataset scan and of read_table(filters=) or Table.filter(expression),
    which start an Acero plan per file (benchmarks/bench_app_queries.py).
    """
    try:
        table = pq.ParquetFile(path, read_dictionary=_DICTIONARY_COLUMNS).read(use_threads=False)
    except FileNotFoundError:  # deleted since the catalog was read
        return None
    except (OSError, pa.ArrowException, KeyError, ValueError) as e:
        raise ResultsError(f"{path}: cannot read the run's rows ({type(e).__name__}: {e})") from None
    if filters:
        table = table.filter(_filter_mask(table, filters))
    try:
        return table.cast(ARROW_SCHEMA) if table.num_rows else None
    except (pa.ArrowException, ValueError) as e:
        raise ResultsError(f"{path}: rows do not fit the results schema ({e})") from None


def _collect_garbage(store: ResultsStore, min_age_s: float, partials_max_age_days: float) -> list[Path]:
    """`ResultsStore.gc` (see there for the rules): stale partials, unlocked lock files, and hidden
    folders in results/ whose writer is gone. Outside the class because it is maintenance of the
    folders only: it never reads or writes the catalog."""
    removed: list[Path] = []
    partials = store.root / "partials"
    if partials.is_dir():
        cutoff = time.time() - partials_max_age_days * 86400
        for folder in partials.iterdir():
            newest = max((f.stat().st_mtime for f in folder.iterdir()), default=folder.stat().st_mtime)
            if newest < cutoff:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    live: set[str] = set()
    for lock in store.writers_dir.glob("*.lock"):
        run_id = lock.name[: -len(".lock")]
        if _lock_is_held(lock):
            live.add(run_id)
            continue
        try:
            st = lock.stat()
        except FileNotFoundError:
            continue
        if st.st_size == 0 and time.time() - st.st_mtime < min_age_s:
            live.add(run_id)
            continue
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
            removed.append(lock)
    for entry in os.scandir(store.results_dir):
        if not entry.name.startswith(".") or entry.name == store.writers_dir.name:
            continue
        if any(entry.name.startswith(f".{rid}.") for rid in live):
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed.append(path)
    return sorted(removed)


class FinishedUnits:
    """The finished pieces ("units") of a long run, kept on disk until the run is published, so
    that rerunning the same command after a crash or Ctrl-C redoes only what is missing.

    A probe run calls `load(unit)` before a unit of work (e.g. one model x stack x task) and
    `save(unit, rows)` after it; `discard()` once the run is published. `discard()` removes only
    the units this object saved or reused: runs of one sweep that differ only in their models
    share a folder and may run at once (`runs_per: checkpoint` under submitit), and one run's
    publishing must not delete the other's work under it. Units live under
    `<runs root>/partials/<kind>-<key>/`, one parquet file each, written atomically; `key` hashes
    the run's settings (pass them without the list of models, so a sweep that grows reuses what
    it has) and the source of the code (`workbench.store.manifest.source_fingerprint`), so rows are only
    reused by the same settings and the same code. Put what identifies the model (its weights'
    hash) in the unit name.
    """

    def __init__(self, store: ResultsStore, kind: str, settings: Mapping[str, Any]):
        from workbench.store.manifest import source_fingerprint

        material = to_json({"kind": kind, "settings": settings, "source": source_fingerprint()}, "settings")
        self.key = hashlib.sha256(material.encode()).hexdigest()[:20]
        self.folder = store.root / "partials" / f"{kind}-{self.key}"
        self.reused: list[str] = []
        self._touched: set[str] = set()  # units saved or reused by this run: what discard() removes

    def _path(self, unit: str) -> Path:
        readable = "".join(c if c.isalnum() or c in "-_." else "_" for c in unit)[:80]
        return self.folder / f"{readable}-{hashlib.sha256(unit.encode()).hexdigest()[:12]}.parquet"

    def load(self, unit: str) -> pd.DataFrame | None:
        """The unit's rows when a previous attempt finished it, else None (an unreadable file counts as missing)."""
        path = self._path(unit)
        if not path.is_file():
            return None
        try:
            rows = coerce_rows(pq.read_table(path))
        except FileNotFoundError:  # another run of the same sweep published and removed it just now
            return None
        except (OSError, pa.ArrowException, KeyError, ValueError) as exc:
            warnings.warn(f"{path}: unreadable saved unit ({exc}); recomputing it", stacklevel=2)
            return None
        self.reused.append(unit)
        self._touched.add(unit)
        return rows

    def save(self, unit: str, rows: list[pd.DataFrame] | pd.DataFrame) -> None:
        frames = [validate_rows(r) for r in (rows if isinstance(rows, list) else [rows])]
        table = pa.Table.from_pandas(pd.concat(frames, ignore_index=True) if frames else empty_rows(),
                                     schema=ARROW_SCHEMA, preserve_index=False)
        with atomic_path(self._path(unit)) as tmp:
            pq.write_table(table, tmp)
        self._touched.add(unit)

    def discard(self) -> None:
        """Remove this run's units, and the folder once no other run has units in it."""
        for unit in self._touched:
            with contextlib.suppress(FileNotFoundError):
                self._path(unit).unlink()
        self._touched.clear()
        with contextlib.suppress(OSError):  # not empty: another run of the sweep is still writing
            self.folder.rmdir()


def _filter_mask(table: pa.Table, filters: Mapping[str, Any]) -> pa.ChunkedArray:
    """Rows of `table` where every column equals one of its wanted values (None: missing)."""
    mask = None
    for column, want in filters.items():
        values = list(want) if isinstance(want, (list, tuple, set, frozenset)) else [want]
        present = [v.item() if isinstance(v, np.generic) else v for v in values if v is not None]
        col = table[column]
        m = pc.is_in(col, value_set=pa.array(present, type=ARROW_SCHEMA.field(column).type)) if present else None
        if len(present) < len(values):
            m = pc.is_null(col) if m is None else pc.or_(m, pc.is_null(col))
        m = pc.fill_null(m, False)
        mask = m if mask is None else pc.and_(mask, m)
    return mask


def _filter_expression(column: str, want: Any) -> pc.Expression:
    """An arrow filter for `column == want` (any of a list; None for missing), type-checked."""
    values = list(want) if isinstance(want, (list, tuple, set, frozenset)) else [want]
    field = pc.field(column)
    for v in values:
        if v is None:
            continue
        if column in STRING_COLUMNS and not isinstance(v, str):
            raise ResultsError(f"query filter {column}={v!r}: {column} holds strings")
        if column in INT_COLUMNS and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
            raise ResultsError(f"query filter {column}={v!r}: {column} holds integers")
        if column in FLOAT_COLUMNS and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            raise ResultsError(f"query filter {column}={v!r}: {column} holds numbers")
    present = [v.item() if isinstance(v, np.generic) else v for v in values if v is not None]
    expr = None
    if present:
        expr = field == present[0] if len(present) == 1 else field.isin(present)
    if len(present) < len(values):
        expr = field.is_null() if expr is None else expr | field.is_null()
    return expr


# ----------------------------------------------------------------------------------------------
# Text tables for the CLI (`bertology runs list`, `bertology runs show RUN_ID`)


def _shorten(s: Any, width: int) -> str:
    s = "" if s is None or s is pd.NA else str(s)
    return s if len(s) <= width else s[: width - 1] + "…"


def format_runs(df: pd.DataFrame, max_rows: int = 100, width: int = 32) -> str:
    """The catalog (from `store.runs()`) as a compact text table, newest runs last."""
    if df.empty:
        return "(no runs)"
    shown = ("run_id", "kind", "name", "status", "n_rows", "models", "probes", "tasks", "finished")
    cols = [c for c in shown if c in df]
    view = df[cols].copy()
    for c in cols:
        if c != "run_id":
            view[c] = [_shorten(v, width) for v in view[c]]
    if "finished" in view:
        view["finished"] = [v[:19].replace("T", " ") for v in view["finished"]]
    text = view.tail(max_rows).to_string(index=False)
    if len(view) > max_rows:
        text = f"... {len(view) - max_rows} older runs not shown\n" + text
    return text


def format_rows(df: pd.DataFrame, max_rows: int = 60, width: int = 40) -> str:
    """Result rows as a compact text table: all-missing columns dropped, numbers to 4 digits."""
    if df.empty:
        return "(no rows)"
    view = df.dropna(axis=1, how="all").copy()
    header = ""
    if "run_id" in view and view["run_id"].nunique() == 1 and len(view.columns) > 1:
        header = f"run {view['run_id'].iloc[0]}, {len(view)} rows\n"
        view = view.drop(columns="run_id")
    for c in view.columns:
        if c in FLOAT_COLUMNS:
            view[c] = ["" if pd.isna(v) else f"{v:.4g}" for v in view[c]]
        else:
            view[c] = ["" if v is None or v is pd.NA else _shorten(v, width) for v in view[c]]
    text = view.head(max_rows).to_string(index=False)
    if len(view) > max_rows:
        text += f"\n... {len(view) - max_rows} more rows"
    return header + text


def format_manifest(manifest: Mapping[str, Any]) -> str:
    """The provenance of a run in a few lines (for `bertology runs show`)."""
    git = manifest.get("git") or {}
    pk = {k: v for k, v in manifest.get("packages", {}).items() if v and k in ("torch", "transformers", "numpy")}
    dirty = "  (uncommitted changes)" if git.get("dirty") else ""
    lines = [
        f"run      {manifest['run_id']}  kind={manifest.get('kind')}  name={manifest.get('name')}  "
        f"status={manifest.get('status')}  rows={manifest.get('n_rows')}",
        f"time     {manifest.get('created')} -> {manifest.get('finished')}",
        f"git      {git.get('commit', 'not a git checkout')}{dirty}",
        "packages " + "  ".join(f"{k}={v}" for k, v in pk.items()),
        f"seeds    {manifest.get('seeds')}",
    ]  # fmt: skip
    for f in manifest.get("data_files", []):
        lines.append(f"data     {f.get('data_relpath') or f['path']}  sha256={f['sha256'][:12]}")
    for c in manifest.get("checkpoints", []):
        lines.append(f"ckpt     {c.get('path')}  sha256={str(c.get('sha256'))[:12]}")
        if c.get("lineage"):  # a model made from another (`ModelHandle.derive`)
            lines.append(f"         derived: {c['lineage']}")
    for k, v in (manifest.get("notes") or {}).items():
        lines.append(f"note     {k} = {_shorten(json.dumps(v, default=str), 100)}")
    return "\n".join(lines)
