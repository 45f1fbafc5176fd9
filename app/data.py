"""What the app reads, without Streamlit: confined paths, the run catalog with its health, rows of
runs where a damaged or older run becomes a message instead of a traceback.

Pages call these functions and show `Loaded.problems` with st.warning; tests call them directly.
The app reads only under the runs root and the Hugging Face cache (`confine`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from workbench.checkpoints import hub_cache
from workbench.errors import ConfigError, WorkbenchError
from workbench.results import (
    ARROW_SCHEMA,
    MANIFEST_NAME,
    RESULT_COLUMNS,
    ROWS_NAME,
    SCHEMA_VERSION,
    ResultsError,
    ResultsStore,
    coerce_rows,
    empty_rows,
)

TWIN_SUFFIX = " (random init)"
# Reference lines drawn under a metric's curves (probe rows name them so; see probes/engine.py).
BASELINES = {"majority": "accuracy", "control_accuracy": "accuracy", "right_branching_uuas": "uuas",
             "chain_uuas": "uuas", "random_baseline": None, "random_rotation": None}
SKIP_DIRS = {"results", "cache", "partials", "figures", ".writers"}


class PathRefused(ConfigError):
    """A path typed into the app that leaves the runs root and the Hugging Face cache."""


# --------------------------------------------------------------------------- paths
def allowed_roots(store_root: str | Path) -> list[Path]:
    """The folders the app may read: the runs root and the Hugging Face Hub cache."""
    return [Path(store_root).resolve(), hub_cache().resolve()]


def confine(text: str | Path, roots: list[Path]) -> Path:
    """The path `text` names, resolved (symlinks and `..` followed), if it lies under one of `roots`.

    A relative path is taken relative to the first root (the runs root). Anything else raises
    PathRefused naming the path and the roots, so a typo or `../../etc` never reaches a reader.
    """
    raw = str(text).strip()
    if not raw:
        raise PathRefused("empty path")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = roots[0] / path
    resolved = path.resolve()
    for root in roots:
        if resolved == root or resolved.is_relative_to(root):
            return resolved
    raise PathRefused(f"{raw}: outside the folders the app reads ({', '.join(map(str, roots))}); refused")


def resolve_model(text: str, roots: list[Path]) -> Path:
    """A checkpoint typed into the explorer: a folder under the runs root, or a Hub name cached
    locally (`workbench.checkpoints.resolve_checkpoint`); the folder must lie under `roots`."""
    from workbench.checkpoints import _is_hub_id, resolve_checkpoint

    raw = str(text).strip()
    local = Path(raw).expanduser()
    local = local if local.is_absolute() else roots[0] / local
    if not local.exists() and _is_hub_id(raw) and not raw.startswith((".", "/", "~")):
        return confine(resolve_checkpoint(raw), roots)
    return confine(raw, roots)


def list_checkpoints(store_root: str | Path, max_depth: int = 6) -> list[str]:
    """Checkpoint folders (holding config.json) under the runs root, as paths relative to it."""
    root = Path(store_root).resolve()
    found: list[str] = []

    def walk(folder: Path, depth: int) -> None:
        if (folder / "config.json").is_file():
            found.append(str(folder.relative_to(root)))
            return
        if depth >= max_depth:
            return
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return
        for child in children:
            if depth == 0 and child.name in SKIP_DIRS:
                continue
            walk(child, depth + 1)

    if root.is_dir():
        walk(root, 0)
    return found


def cached_hub_models() -> list[str]:
    """Hub ids with a snapshot in the local Hugging Face cache (`models--org--name`)."""
    cache = hub_cache()
    if not cache.is_dir():
        return []
    return sorted(d.name[len("models--"):].replace("--", "/") for d in cache.glob("models--*")
                  if any((d / "snapshots").glob("*/config.json")))


# --------------------------------------------------------------------------- the catalog
def open_store(root: str | Path | None = None) -> ResultsStore:
    return ResultsStore(root)


def catalog(store: ResultsStore) -> pd.DataFrame:
    """The runs table with a `health` column: ok, or what is missing from the run's folder."""
    return with_health(store, store.runs())


def with_health(store: ResultsStore, runs: pd.DataFrame) -> pd.DataFrame:
    """Catalog rows (`store.runs(...)`) with their `health` column (see `catalog`)."""
    health = []
    for rid in runs["run_id"]:
        folder = store.results_dir / rid
        missing = [name for name in (MANIFEST_NAME, ROWS_NAME) if not (folder / name).is_file()]
        health.append("ok" if not missing else "damaged: no " + " and no ".join(missing))
    runs = runs.assign(health=pd.Series(health, dtype=pd.StringDtype(), index=runs.index))
    return runs


def split_list(value) -> list[str]:
    """A catalog list column ("a, b") as a list."""
    return [v.strip() for v in str(value).split(",") if v.strip()] if isinstance(value, str) else []


def facet_values(runs: pd.DataFrame, column: str) -> list[str]:
    values = {v for cell in runs[column].dropna() for v in split_list(cell)}
    return sorted(values, key=lambda v: (len(v), v) if v.isdigit() else (0, v))


def filter_runs(runs: pd.DataFrame, **wanted: list[str]) -> pd.DataFrame:
    """Runs whose list column holds any of the wanted values, for each non-empty filter."""
    keep = pd.Series(True, index=runs.index)
    for column, values in wanted.items():
        if values:
            want = set(map(str, values))
            keep &= runs[column].map(lambda cell, want=want: bool(set(split_list(cell)) & want))
    return runs[keep]


# --------------------------------------------------------------------------- rows
@dataclass
class Loaded:
    rows: pd.DataFrame
    problems: list[str] = field(default_factory=list)  # one line per damaged or older run


def manifest(store: ResultsStore, run_id: str) -> tuple[dict | None, list[str]]:
    path = store.results_dir / run_id / MANIFEST_NAME
    try:
        m = json.loads(path.read_text())
    except FileNotFoundError:
        return None, [f"run {run_id}: its manifest ({path}) is missing; the run is damaged (delete it or rerun)"]
    except (OSError, ValueError) as e:
        return None, [f"run {run_id}: its manifest ({path}) cannot be read ({e}); the run is damaged"]
    if not isinstance(m, dict):
        return None, [f"run {run_id}: its manifest ({path}) is not a JSON object; the run is damaged"]
    problems = []
    version = m.get("schema_version", 0)
    if version != SCHEMA_VERSION:
        problems.append(f"run {run_id}: written with results schema version {version} (this app reads "
                        f"version {SCHEMA_VERSION}); shown as far as its columns allow")
    return m, problems


def read_run(store: ResultsStore, run_id: str) -> Loaded:
    """One run's rows; a missing or unreadable rows file, or one from an older schema (columns
    missing, filled as empty), becomes a problem line."""
    path = store.results_dir / run_id / ROWS_NAME
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        why = f"run {run_id}: {ROWS_NAME} is missing ({path}); the run is damaged (half-written or deleted by hand)"
        return Loaded(empty_rows(), [why])
    except (OSError, pa.ArrowException) as e:
        why = f"run {run_id}: {ROWS_NAME} cannot be read ({type(e).__name__}: {str(e)[:200]}); the run is damaged"
        return Loaded(empty_rows(), [why])
    problems = []
    missing = [c for c in RESULT_COLUMNS if c not in table.column_names]
    unknown = [c for c in table.column_names if c not in RESULT_COLUMNS]
    if missing or unknown:
        problems.append(f"run {run_id}: older rows schema ({'missing ' + ', '.join(missing) if missing else ''}"
                        f"{'; extra ' + ', '.join(unknown) if unknown else ''}); missing columns shown empty")
    try:
        columns = [table[c].cast(ARROW_SCHEMA.field(c).type) if c in table.column_names
                   else pa.nulls(table.num_rows, ARROW_SCHEMA.field(c).type) for c in RESULT_COLUMNS]
        rows = coerce_rows(pa.table(columns, schema=ARROW_SCHEMA))
    except (pa.ArrowException, ValueError, TypeError) as e:
        return Loaded(empty_rows(), problems + [f"run {run_id}: rows do not fit the results schema ({e})"])
    rows["run_id"] = pd.Series([run_id] * len(rows), dtype=rows["run_id"].dtype)
    if "value" in missing or "metric" in missing:
        problems.append(f"run {run_id}: rows have no {'value' if 'value' in missing else 'metric'} column; "
                        f"nothing to plot")
        rows = empty_rows()
    return Loaded(rows, problems)


def read_runs(store: ResultsStore, run_ids: list[str]) -> Loaded:
    frames, problems = [], []
    for rid in run_ids:
        got = read_run(store, rid)
        problems += got.problems
        if len(got.rows):
            frames.append(got.rows)
    rows = pd.concat(frames, ignore_index=True) if frames else empty_rows()
    return Loaded(rows, problems)


def query(store: ResultsStore, runs: pd.DataFrame, **filters) -> Loaded:
    """Rows of the catalog's `runs` matching `filters` (e.g. probe=, task=): the store's one-scan
    query; when it cannot read a run (damaged, older schema) the runs are read one by one and the
    damaged ones reported."""
    damaged = runs[runs["health"] != "ok"] if "health" in runs else runs.iloc[:0]
    problems = [f"run {rid}: {h}; left out" for rid, h in zip(damaged["run_id"], damaged["health"])]
    ids = [r for r in runs["run_id"] if r not in set(damaged["run_id"])]
    if not ids:
        return Loaded(empty_rows(), problems)
    try:
        return Loaded(store.query(run_id=ids, **filters), problems)
    except (ResultsError, WorkbenchError, pa.ArrowException, OSError):
        got = read_runs(store, ids)
        rows = got.rows
        for key, want in filters.items():
            want = want if isinstance(want, (list, tuple, set)) else [want]
            rows = rows[rows[key].isin(want)]
        return Loaded(rows.reset_index(drop=True), problems + got.problems)


# --------------------------------------------------------------------------- layer curves
def is_twin(model) -> bool:
    return str(model).endswith(TWIN_SUFFIX)


def strip_seed(model: str) -> str:
    """The model name without its training-seed folder (`run/seed-3/step-10` -> `run/step-10`), so
    runs of several seeds of one configuration aggregate."""
    import re

    from workbench.checkpoints import SEED_PREFIX

    return re.sub(rf"(^|/){SEED_PREFIX}\d+(?=/|$| )", "", str(model)).strip("/")


def aggregate_seeds(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean and spread over seeds (training seeds in the model name and probe seeds in `seed`) of
    each (model, task, metric, split, stack, layer): value = mean, ci_low/ci_high = mean -/+ one
    standard deviation (population sd over seeds, 0 for one seed), n_seeds."""
    if rows.empty:
        return rows.assign(n_seeds=pd.Series([], dtype="int64"))
    df = rows.assign(model=rows["model"].map(strip_seed))
    keys = ["model", "task", "metric", "split", "stack", "layer", "step"]
    g = df.groupby(keys, dropna=False, sort=False)["value"]
    out = g.agg(value="mean", sd=lambda v: float(v.std(ddof=0)), n_seeds="size").reset_index()
    out["ci_low"] = out["value"] - out["sd"]
    out["ci_high"] = out["value"] + out["sd"]
    return out.drop(columns="sd")


def baseline_metrics(metrics) -> list[str]:
    return [m for m in metrics if m in BASELINES or m.startswith(("majority", "control_", "right_branching",
                                                                   "chain", "random_"))]


COMPANIONS = ("selectivity", "control_accuracy", "scalar_mix_weight", "centre_of_gravity")


def metric_choices(runs: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(metrics to pick from, metrics read along with any pick: baselines, selectivity, scalar mix),
    from the catalog, so a layer-curve query reads only the rows it draws."""
    in_catalog = facet_values(runs, "metrics")
    companions = baseline_metrics(in_catalog) + [m for m in COMPANIONS if m in in_catalog]
    companions = list(dict.fromkeys(companions))
    return [m for m in in_catalog if m not in companions] or in_catalog, companions
