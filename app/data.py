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

from app.fields import row_field
from workbench.store.checkpoints import hub_cache
from workbench.store.aggregate import aggregate
from workbench.errors import ConfigError, WorkbenchError
from workbench.store.results import (
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
    locally (`workbench.store.checkpoints.resolve_checkpoint`); the folder must lie under `roots`."""
    from workbench.store.checkpoints import is_hub_id, resolve_checkpoint

    raw = str(text).strip()
    local = Path(raw).expanduser()
    local = local if local.is_absolute() else roots[0] / local
    if not local.exists() and is_hub_id(raw) and not raw.startswith((".", "/", "~")):
        return confine(resolve_checkpoint(raw), roots)
    return confine(raw, roots)


# Folders under the runs root that hold model weights but are not checkpoints to explore: trainer
# state of a running seed (finetune's resume/). Walked past, like SKIP_DIRS at the root.
NOT_CHECKPOINTS = {"resume", "trainer_state"}


def is_checkpoint(folder: Path) -> bool:
    """A folder `ModelHandle.load` can open: config.json, weight files (a complete shard index) and a
    tokenizer. A sweep's own folder (its config.json is the sweep's config), `full/`, a run folder or a
    `points/` folder whose weights were dropped (`keep_checkpoints: false`) is not one."""
    from workbench.store.checkpoints import weight_files
    from workbench.errors import CheckpointError
    from workbench.running.model_loading import TOKENIZER_FILES

    if not (folder / "config.json").is_file() or not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return False
    try:
        return bool(weight_files(folder))
    except CheckpointError:  # a shard index naming missing shards: not loadable
        return False


def _weights_mtime(folder: Path) -> float:
    from workbench.store.checkpoints import weight_files

    try:
        return max(f.stat().st_mtime for f in weight_files(folder))
    except (OSError, ValueError, WorkbenchError):
        return 0.0


def list_checkpoints(store_root: str | Path, max_depth: int = 8) -> list[str]:
    """Checkpoints under the runs root (`is_checkpoint`: config, weights, tokenizer), as paths
    relative to it, newest first (by the weight files' modification time; ties by path). A folder
    without weights is walked through, so a compression sweep offers its points
    (`prune/<sweep>/points/<method>/<amount>/seed-S/<point>/`) and its full models, never the sweep
    folder; `checkpoint_label` names each by its lineage."""
    root = Path(store_root).resolve()
    found: list[tuple[float, str]] = []

    def walk(folder: Path, depth: int) -> None:
        if is_checkpoint(folder):
            found.append((_weights_mtime(folder), str(folder.relative_to(root))))
            return  # its sub-folders (ELECTRA's generator/) belong to it
        if depth >= max_depth:
            return
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return
        for child in children:
            if (depth == 0 and child.name in SKIP_DIRS) or child.name in NOT_CHECKPOINTS:
                continue
            walk(child, depth + 1)

    if root.is_dir():
        walk(root, 0)
    return [rel for _, rel in sorted(found, key=lambda t: (-t[0], t[1]))]


def _amount(text: str) -> str:
    """A sweep's amount folder as a person reads it: 0.5 -> 50%, 4bit -> 4-bit, r16 -> rank 16."""
    if text.endswith("bit") and text[:-3].isdigit():
        return f"{text[:-3]}-bit"
    if text.startswith("r") and text[1:].isdigit():
        return f"rank {text[1:]}"
    try:
        value = float(text)
    except ValueError:
        return text
    return f"{value * 100:.4g}%" if 0.0 <= value <= 1.0 else text


def _part(name: str) -> str:
    """seed-3 -> seed 3, step-0000100 -> step 100, other folder names as they are."""
    from workbench.store.checkpoints import step_number

    step = step_number(name)
    if step is not None:
        return f"step {step}"
    if name.startswith("seed-") and name[5:].isdigit():
        return f"seed {name[5:]}"
    return name


def checkpoint_label(rel: str) -> str:
    """A checkpoint's name in the explorer: its run, then its lineage inside the run.

    prune/<sweep>/points/imp/0.5/seed-0/imp-0.5-seed0  -> prune/<sweep> · seed 0 · 50% imp
    prune/<sweep>/full/seed-0/best                       -> prune/<sweep> · seed 0 · full model
    prune/<sweep>/points/full/0/seed-0/full-0-seed0      -> prune/<sweep> · seed 0 · full model (its point)
    train/<run>/seed-0/step-0000100                      -> train/<run> · seed 0 · step 100
    distill/<sweep>/points/<point>/seed-1/best           -> distill/<sweep> · <point> · seed 1 · best
    """
    parts = Path(rel).parts
    if "points" in parts and parts[0] == "prune":
        i = parts.index("points")
        rest = parts[i + 1:]
        if len(rest) >= 3 and rest[2].startswith("seed-"):
            method, amount, seed = rest[0], rest[1], rest[2]
            what = "full model (its point)" if method == "full" else f"{_amount(amount)} {method}"
            return " · ".join(["/".join(parts[:i]), _part(seed), what, *rest[4:]])
    if "full" in parts and parts[0] == "prune":
        i = parts.index("full")
        rest = [{"best": "full model", "rewind": "rewind weights"}.get(p, _part(p)) for p in parts[i + 1:]]
        return " · ".join(["/".join(parts[:i]), *rest])
    cut = next((i for i, p in enumerate(parts) if i > 0 and (p == "points" or p.startswith(("seed-", "step-")))),
               len(parts))
    run = "/".join(parts[:cut])
    rest = [_part(p) for p in parts[cut:] if p != "points"]
    return " · ".join([run, *rest])


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


# --------------------------------------------------------------------------- baselines and twins
# A row says what it is in its data: `extra["baseline"]` names the baseline it measures (a probe
# declares it with `probes.core.baselines.mark_baselines`; the runner marks every row of a random-init twin
# "random_init") and `extra["baseline_for"]` the metric it is a reference line for. The app and the
# exported figures read only that (`row_kinds`), so a new probe's baselines are drawn as baselines
# without a change here.
BASELINE_KEY, BASELINE_FOR_KEY = "baseline", "baseline_for"  # = probes.core.baselines.BASELINE_KEY / BASELINE_FOR_KEY
TWIN = "random_init"  # the runner's marker of a random-init twin's rows (probes/core/runner.py, `Unit.rows`)
MODEL = "model"  # row kind of a model's own measurement
KIND_COLUMNS = ("kind", "baseline_for")  # the columns `row_kinds` adds

# The legacy path: rows written before probes declared their baselines (runs already in users'
# stores) carry no marker; they are recognised as the app used to recognise them, by the twin's name
# suffix and by these metric names (name -> the metric it was drawn under; None: any).
LEGACY_TWIN_SUFFIX = " (random init)"
LEGACY_BASELINE_METRICS = {"majority": "accuracy", "control_accuracy": "accuracy", "right_branching_uuas": "uuas",
                           "chain_uuas": "uuas", "random_baseline": None, "random_rotation": None,
                           # the alignment page's former panel table
                           "p_at_1_rotation": "p_at_1", "p_at_1_unmapped": "p_at_1", "accuracy_rotation": "accuracy",
                           "accuracy_unmapped": "accuracy", "word_alignment_chance": "word_alignment",
                           "word_alignment_unmapped": "word_alignment", "noise_floor": "displacement"}
LEGACY_BASELINE_PREFIXES = ("majority", "control_", "right_branching", "chain", "random_")


def _legacy_kind(model, metric) -> tuple[str, str | None]:
    """(kind, baseline_for) of a row without a marker: the legacy path (see LEGACY_BASELINE_METRICS)."""
    if str(model).endswith(LEGACY_TWIN_SUFFIX):
        return TWIN, None
    metric = str(metric)
    if metric in LEGACY_BASELINE_METRICS or metric.startswith(LEGACY_BASELINE_PREFIXES):
        return f"baseline:{metric}", LEGACY_BASELINE_METRICS.get(metric)
    return MODEL, None


def row_kinds(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with the columns `kind` ("model", "random_init" for a twin's rows, or "baseline:NAME")
    and `baseline_for` (the metric whose panel a baseline line is drawn in; None: every panel of its
    task), from each row's `extra` (legacy rows: `_legacy_kind`). A baseline that declares no
    `baseline_for` belongs to the longest model metric of its task that its own metric name ends
    with ("string_match_auc" -> auc, "majority_f1_masculine" -> f1_masculine), among `rows`. Rows
    that already have the columns (aggregated rows, whose `extra` is gone) are returned as they are."""
    if all(c in rows.columns for c in KIND_COLUMNS):
        return rows
    kinds, fors = [], []
    # the markers every producer may write (workbench.store.rowschema.MARKERS), read through the one accessor
    names, declared_for = row_field(rows, BASELINE_KEY), row_field(rows, BASELINE_FOR_KEY)
    for model, metric, name, baseline_for in zip(rows["model"], rows["metric"], names, declared_for):
        if name is None:
            kind, of = _legacy_kind(model, metric)
        elif name == TWIN:
            kind, of = TWIN, None
        else:  # without `baseline_for`: resolved below from the metric its name ends with
            kind, of = f"baseline:{name}", baseline_for
        kinds.append(kind)
        fors.append(of)
    model_metrics: dict[str, set[str]] = {}
    for task, metric, kind in zip(rows["task"], rows["metric"], kinds):
        if kind == MODEL:
            model_metrics.setdefault(task, set()).add(str(metric))
    for i, (task, metric, kind) in enumerate(zip(rows["task"], rows["metric"], kinds)):
        if kind.startswith("baseline:") and fors[i] is None:
            ends = [m for m in model_metrics.get(task, ()) if str(metric).endswith("_" + m)]
            fors[i] = max(ends, key=len) if ends else None
    return rows.assign(kind=pd.Series(kinds, index=rows.index, dtype=object),
                       baseline_for=pd.Series(fors, index=rows.index, dtype=object))


def twin_mask(rows: pd.DataFrame) -> pd.Series:
    """True for the rows of a random-init twin (`row_kinds`)."""
    return row_kinds(rows)["kind"] == TWIN


def baseline_mask(rows: pd.DataFrame) -> pd.Series:
    """True for baseline rows drawn as reference lines (every marker but the twin's)."""
    return row_kinds(rows)["kind"].str.startswith("baseline:")


def twin_models(rows: pd.DataFrame) -> set[str]:
    """Models whose rows are a random-init twin's."""
    return set(rows.loc[twin_mask(rows).to_numpy(), "model"].astype(str))


def parent_model(model) -> str:
    """The model a twin was made from, for pairing its curve's colour (the runner names a twin
    "<model> (random init)"); other names unchanged."""
    return str(model).removesuffix(LEGACY_TWIN_SUFFIX)


# --------------------------------------------------------------------------- layer curves
def strip_seed(model: str) -> str:
    """The model name without its training-seed folder (`run/seed-3/step-10` -> `run/step-10`), so
    runs of several seeds of one configuration aggregate."""
    import re

    from workbench.store.checkpoints import SEED_PREFIX

    return re.sub(rf"(^|/){SEED_PREFIX}\d+(?=/|$| )", "", str(model)).strip("/")


SEED_KEYS = ["model", "task", "metric", "split", "stack", "layer", "step", *KIND_COLUMNS]


def aggregate_seeds(rows: pd.DataFrame, series: list[str] | tuple[str, ...] = (), training_seeds: bool = True) -> pd.DataFrame:
    """Seeds of one configuration as one curve: the ONE aggregation behind the app's layer curves and
    the exported figures (`app.figures.layer_curves`), so both draw the same band for the same rows.

    Rows of the same (model with its training-seed folder stripped, task, metric, split, stack, layer,
    step, kind) are the seeds of one point: training seeds in the model name and probe seeds in
    `seed` (or several runs of a sweep). A model keeps its full name where no other training seed
    joins it; `training_seeds=False` merges probe seeds only (rows of the same model name).
    value = their mean; the band (ci_low, ci_high) = the min and max over seeds, with n_seeds.
    Why min-max and not mean +/- sd: with the 2-5 seeds a probing study has, an sd estimated from
    them is itself very noisy, and mean +/- sd can leave a seed outside the band; the min-max band
    contains every seed and claims nothing more. A point with one seed keeps its own 95% bootstrap CI. `series`: settings read from `extra` (e.g. pooling)
    that split one model into several curves, labelled "model | key=value". Idempotent: aggregated
    rows pass through unchanged."""
    rows = row_kinds(rows)
    if rows.empty:
        return rows.assign(n_seeds=pd.Series([], dtype="int64"))
    if training_seeds:
        stripped = rows["model"].map(strip_seed)
        merged = rows.groupby(stripped)["model"].transform("nunique") > 1
        rows = rows.assign(model=stripped.where(merged, rows["model"]))
    if series:
        twin = rows["kind"] == TWIN
        label = rows["model"].map(parent_model)
        for key in series:  # a figure spec's keys: checked against the rows' producers when read
            label = label + f" | {key}=" + row_field(rows, key).map(str)
        rows["model"] = label.where(~twin, label + LEGACY_TWIN_SUFFIX)
    if "n_seeds" not in rows.columns:
        rows = rows.assign(n_seeds=1)
    keys = [k for k in SEED_KEYS if k in rows.columns]
    groups = rows.groupby(keys, dropna=False, sort=False)
    if (groups["value"].transform("size") <= 1).all():
        return rows.reset_index(drop=True)
    spec = {"n_seeds": ("n_seeds", "sum"), "ci_low": ("ci_low", "first"), "ci_high": ("ci_high", "first")}
    spec.update({c: (c, "min") for c in ("run_id",) if c in rows.columns})
    spec.update({c: (c, "first") for c in ("probe", "family", "n") if c in rows.columns})
    out = groups.agg(**spec).reset_index()
    # the mean and the min-max band: the one seed statistic (`workbench.store.aggregate`), same group order
    band = aggregate(rows, over="seed", by=keys, interval="minmax")
    out = out.assign(value=band["value"].to_numpy(), lo=band["min"].to_numpy(), hi=band["max"].to_numpy())
    out = out[[*keys, "value", "lo", "hi", *spec]]
    several = out["n_seeds"] > 1
    out["ci_low"] = out["ci_low"].astype("Float64").where(~several, out["lo"])
    out["ci_high"] = out["ci_high"].astype("Float64").where(~several, out["hi"])
    return out.drop(columns=["lo", "hi"])


def metric_choices(rows: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(metrics to draw as curves, metrics of baseline lines) of one probe/task's per-layer rows,
    from what the rows declare (`row_kinds`)."""
    kinds = row_kinds(rows)
    is_model = (kinds["kind"] == MODEL).to_numpy()
    curves = list(dict.fromkeys(kinds.loc[is_model, "metric"]))
    baselines = list(dict.fromkeys(kinds.loc[baseline_mask(kinds).to_numpy(), "metric"]))
    return curves, baselines
