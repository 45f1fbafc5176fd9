"""Reproducible figures: `bertology figures NAME | --all`.

A figure is a YAML file in `experiments/figures/`: a query on the results store plus a plot spec.

    title: Syntax probes layer by layer
    query: {probe: syntax, tasks: [upos, deprel], metrics: [accuracy], run: latest}
    plot: layer_curves          # a function in PLOTS (probe companion pages may add more)
    options: {baselines: [majority, control]}   # default: every baseline the rows declare
    produced_by: bertology run experiments/main.yaml   # optional: the command that makes its runs

Rendering writes, into `<runs root>/figures/<name>/` (or `--out`), the figure as PNG, SVG, PDF
(plotly's static export through kaleido, which drives the system Chromium) and interactive HTML,
`data.csv` (exactly the numbers drawn, sorted, so two renders of the same store compare equal) and
`manifest.json` (the figure spec, the query, the run ids it read, the data's sha256, the commit and
package versions, the files written). Every write is atomic, and the folder is not touched until
everything is drawn and exported: a failed export leaves an earlier render exactly as it was. Then
the old manifest goes first and the new one is written last, so a folder holding a manifest.json
holds the complete render it describes.

The static export runs in a child process killed after `$BERTOLOGY_FIGURE_TIMEOUT` seconds (default
120), or when anything interrupts the wait: Chromium once hung for 21 minutes while another process
rendered figures. Kaleido starts Chromium in a session of its own (choreographer's
`start_new_session`), so killing the child's process group would orphan it: the child and all its
descendants (found by psutil) get SIGTERM, then SIGKILL. On a timeout the figure
falls back to the HTML alone, the manifest's `warnings` say so and its `files` list only what was
written (an earlier render's images of the figure are removed).

Queries: `run: latest` (the newest run holding the probe and tasks; with a list of probes, the
newest run of the first probe and, for each other probe, the newest run sharing a model with it:
one checkpoint's runs of several probes), `run: RUN_ID` or a list,
`name: PREFIX` (every run whose name starts with it, e.g. a sweep `pooling-sweep:`); `models:` keeps
only those models; `twins: false` drops random-init twins. Twins and baselines are what the rows
declare (`app.data.row_kinds`); seeds are aggregated by `app.data.aggregate_seeds`, the function
the app uses too, through the one seed statistic `workbench.store.aggregate.aggregate` (as every page's).

`--all` (or several names) draws every figure whose data is in the store and lists every other one:
a figure whose runs are not in the store (`MissingData`) with its `produced_by` command, exit status
2 once the rest is drawn; no store (empty, one probe's, a mix) ends in a traceback (`figures_cli`).

Concerns:
- figure specs and the rows they query: `MissingData`, `figure_names`, `load_spec`, `query_rows`
- the plots (`PLOTS`): `Drawn`, `layer_curves`, `expected_layers`, `depth_summary`, `depth_table`,
  `depth_ci`, `training_heatmap`, `roc_curves`, `auc_over_steps`, `all_plots`, `tidy_rows`
- rendering and the static export (a child process with a timeout, atomic writes): `export_timeout`,
  `static_images`, `draw`, `Rendered`, `render`, `data_of`
- `bertology figures`: `produced_by`, `figures_cli`
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import psutil

from app.axes import is_fraction, unit_axis, unit_panels
from app.data import MODEL, TWIN, aggregate_seeds, baseline_mask, parent_model, row_kinds, twin_mask
from app.fields import row_field
from probes.core import depth
from workbench.store.aggregate import aggregate
from workbench.errors import ConfigError, WorkbenchError
from workbench.io import read_yaml
from workbench.paths import REPO_ROOT
from workbench.progress import get_logger

FIGURES_DIR = REPO_ROOT / "experiments" / "figures"
FORMATS = ("png", "svg", "pdf", "html")
EXPORT_TIMEOUT_ENV = "BERTOLOGY_FIGURE_TIMEOUT"
EXPORT_TIMEOUT = 120.0  # seconds for one figure's static formats together
# The child process of the static export: figure JSON in, one file per format out.
_EXPORT_CHILD = """
import sys
from pathlib import Path
import plotly.io as pio
fig = pio.from_json(Path(sys.argv[1]).read_text(encoding="utf-8"))
for fmt in sys.argv[3:]:
    Path(sys.argv[2], "figure." + fmt).write_bytes(pio.to_image(fig, format=fmt))
"""
SPEC_KEYS = {"title", "query", "plot", "options", "description", "produced_by"}
QUERY_KEYS = {"probe", "tasks", "metrics", "run", "name", "models", "twins", "split"}
BASELINE_DASHES = ("dash", "dashdot", "longdash", "longdashdot")  # one per baseline, in order of their names
DATA_COLUMNS = ["run_id", "model", "step", "task", "metric", "stack", "layer", "value", "ci_low", "ci_high", "kind"]


class MissingData(ConfigError):
    """The store holds no rows a figure can draw (its runs were never made): `figures --all` skips
    the figure and names the command that makes them."""


# --------------------------------------------------------------------------- specs and queries
def figure_names() -> list[str]:
    return sorted(p.stem for p in FIGURES_DIR.glob("*.yaml"))


def load_spec(name_or_path: str | Path) -> tuple[str, dict]:
    path = Path(name_or_path)
    if not path.suffix:
        path = FIGURES_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ConfigError(f"{path}: no such figure; shipped figures: {', '.join(figure_names()) or 'none'}")
    spec = read_yaml(path, "figure spec")
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; expected {sorted(SPEC_KEYS)}")
    for key in ("query", "options"):
        if not isinstance(spec.get(key) or {}, dict):
            raise ConfigError(f"{path}: {key} must be a mapping, got {type(spec[key]).__name__}")
    bad_q = set(spec.get("query") or {}) - QUERY_KEYS
    if bad_q:
        raise ConfigError(f"{path}: query: unknown key(s) {sorted(bad_q)}; expected {sorted(QUERY_KEYS)}")
    plots = all_plots()
    if spec.get("plot") not in plots:
        raise ConfigError(f"{path}: plot must be one of {sorted(plots)}, got {spec.get('plot')!r}")
    return path.stem, spec


def query_rows(store, query: dict) -> tuple[pd.DataFrame, list[str]]:
    """The rows a figure draws and the run ids they came from. MissingData (the figure is skipped by
    `figures --all`) when no run matches, when a pinned run is not in the store, or when the runs
    hold none of the rows asked for."""
    probe = query.get("probe")
    probes = _as_list(probe)
    tasks = _as_list(query.get("tasks"))
    runs = store.runs(**({"probe": probes} if probe else {}))
    if tasks:
        runs = _keep(runs, [bool(set(_catalog_list(t)) & set(tasks)) for t in runs["tasks"]])
    which = query.get("run", "latest" if "name" not in query else None)
    if "name" in query:
        runs = _keep(runs, runs["name"].fillna("").astype(str).str.startswith(str(query["name"])))
    if which == "latest" and len(probes) > 1:
        runs = _latest_of_one_checkpoint(runs, probes, _as_list(query.get("models")))
    elif which == "latest":
        runs = runs.tail(1)
    elif which is not None:
        wanted = set(_as_list(which))
        missing = wanted - set(runs["run_id"])
        if missing:  # a figure pinned to runs made elsewhere: skipped by `figures --all`, not fatal
            raise MissingData(f"run(s) {sorted(missing)} not in the store {store.root} (or without {probe}/{tasks})")
        runs = runs[runs["run_id"].isin(wanted)]
    if runs.empty:
        raise MissingData(f"no run in {store.root} matches {query}")  # figures_cli names the command that makes it
    frames = []
    for run_id in runs["run_id"]:
        df = store.read(run_id)
        df["run_id"] = run_id
        frames.append(df)
    rows = pd.concat(frames, ignore_index=True)
    if probe:
        rows = rows[rows["probe"].isin(probes)]
    if tasks:
        rows = rows[rows["task"].isin(tasks)]
    if query.get("metrics"):
        rows = rows[rows["metric"].isin(_as_list(query["metrics"])) | baseline_mask(rows)]  # with their baselines
    if query.get("models"):
        rows = rows[rows["model"].isin(_as_list(query["models"]))]
    if query.get("twins") is False:
        rows = rows[~twin_mask(rows)]
    if query.get("split"):
        rows = rows[rows["split"] == query["split"]]
    if rows.empty:  # the runs exist but hold none of the rows asked for: nothing a plot could draw
        raise MissingData(f"run(s) {', '.join(runs['run_id'])} in {store.root} hold no rows matching {query}")
    return rows.reset_index(drop=True), sorted(runs["run_id"].tolist())


def _latest_of_one_checkpoint(runs: pd.DataFrame, probes: list[str], models: list[str]) -> pd.DataFrame:
    """The newest run of probes[0] (holding one of `models` when given) and, for each other probe,
    the newest run that shares a model with it (a run holding a twin holds its checkpoint too)."""
    def of(p: str, want: set[str] | None) -> pd.DataFrame:
        keep = [p in _catalog_list(pr) and (want is None or bool(want & set(_catalog_list(m))))
                for pr, m in zip(runs["probes"], runs["models"])]
        return _keep(runs, keep).tail(1)

    first = of(probes[0], set(models) if models else None)
    if first.empty:
        return first
    anchor = set(_catalog_list(first["models"].iloc[0]))
    return pd.concat([first] + [of(p, anchor) for p in probes[1:]])


def _keep(frame: pd.DataFrame, mask) -> pd.DataFrame:
    """The rows of `frame` where `mask` (booleans, one per row) holds. `frame[[...]]` with a Python
    list would select no *columns* when the list is empty (an empty catalog), and the next column
    lookup would fail with a KeyError (issue 40)."""
    return frame[np.asarray(mask, dtype=bool)]


def _catalog_list(value) -> list[str]:
    """A catalog list column as a list (the catalog DataFrame shows them as "a, b")."""
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else list(value or [])


def _as_list(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, (str, int)) else list(value)


# --------------------------------------------------------------------------- plots
@dataclass
class Drawn:
    figure: Any  # plotly Figure
    data: pd.DataFrame  # exactly what is drawn


def layer_curves(rows: pd.DataFrame, title: str, options: dict) -> Drawn:
    """One panel per task x metric: value by layer per model, 95% CI bands (several seeds: mean with
    the min-max band, `app.data.aggregate_seeds`), twins dotted, baselines grey and dashed.

    What is a twin or a baseline is read from the rows (`app.data.row_kinds`): a baseline line is
    drawn in its task's panel of the metric it declares (`baseline_for`; every panel when it declares
    none), one line per model. options: `baselines` (names or metrics of the baselines to draw;
    default all), `series` (extra settings that split curves, e.g. [pooling]), `training_seeds`
    (false: keep a curve per training seed; probe seeds are still averaged)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    per_layer = rows[rows["layer"].notna() & ~rows["split"].astype(str).str.contains(":")]
    per_layer = aggregate_seeds(per_layer, options.get("series", []), options.get("training_seeds", True))
    kind = per_layer["kind"].astype(str)
    main = per_layer[(kind == MODEL).to_numpy()]
    twins = per_layer[(kind == TWIN).to_numpy()]
    refs = per_layer[kind.str.startswith("baseline:").to_numpy()]
    refs = refs.assign(baseline=refs["kind"].str.removeprefix("baseline:"))
    if options.get("baselines") is not None:
        wanted = set(_as_list(options["baselines"]))
        refs = refs[refs["baseline"].isin(wanted) | refs["metric"].isin(wanted)]
    twin_models = set(twins["model"])
    refs = refs[~refs["model"].isin(twin_models)]  # a twin's own baselines are not drawn
    panels = list(dict.fromkeys(zip(main["task"], main["metric"])))
    if not panels:
        raise MissingData(f"nothing to draw for {title!r}: no per-layer rows")
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[f"{t}: {m}" for t, m in panels],
                        horizontal_spacing=0.06)
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
    base_models = list(dict.fromkeys(parent_model(m) for m in pd.concat([main["model"], twins["model"]])))
    color = {m: palette[i % len(palette)] for i, m in enumerate(base_models)}
    dash = {name: BASELINE_DASHES[i % len(BASELINE_DASHES)] for i, name in enumerate(sorted(set(refs["baseline"])))}
    drawn, shown = [], set()
    for col, (task, metric) in enumerate(panels, start=1):
        curves = pd.concat([main[(main["task"] == task) & (main["metric"] == metric)],
                            twins[(twins["task"] == task) & (twins["metric"] == metric)]])
        for model, g in curves.groupby("model", sort=False):
            g = g.sort_values("layer")
            base = parent_model(model)
            twin = g["kind"].iloc[0] == TWIN
            x, y = g["layer"].astype(int).to_numpy(), g["value"].to_numpy(dtype=float)
            if g["ci_low"].notna().all() and not twin:
                fig.add_trace(go.Scatter(x=np.r_[x, x[::-1]], y=np.r_[g["ci_high"].to_numpy(float), g["ci_low"].to_numpy(float)[::-1]],
                                         fill="toself", line={"width": 0}, fillcolor=color[base], opacity=0.15,
                                         hoverinfo="skip", showlegend=False), row=1, col=col)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=str(model), legendgroup=str(model),
                                     showlegend=col == 1, line={"color": color[base], "dash": "dot" if twin else "solid"}),
                          row=1, col=col)
            drawn.append(g)
        here = refs[(refs["task"] == task) & (refs["baseline_for"].isna() | (refs["baseline_for"] == metric))]
        for (bl, model), one in here.groupby(["baseline", "model"], sort=True):  # each model's own baseline line
            one = one.sort_values("layer")
            fig.add_trace(go.Scatter(x=one["layer"].astype(int), y=one["value"], mode="lines", name=bl,
                                     legendgroup=bl, showlegend=bl not in shown,
                                     line={"color": "grey", "dash": dash[bl]}),
                          row=1, col=col)
            shown.add(bl)
            drawn.append(one)
        fig.update_xaxes(title_text="layer", dtick=1, row=1, col=col)
    fig.update_layout(title=title, template="plotly_white", height=420, width=max(520, 430 * len(panels)))
    unit_panels(fig)  # accuracy-like panels on 0..1, in the app and in exported figures alike
    return Drawn(fig, tidy_rows(pd.concat(drawn, ignore_index=True)))


def expected_layers(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (model, task): expected layer E[l] = sum_l l * delta(l) / sum_l delta(l), delta(l) = acc(l) - acc(l-1)
    (Tenney et al. 2019's differential score), and the scalar-mix centre of gravity where the run has
    one. Deliberate difference: Tenney et al. take delta from cumulative scalar mixes of layers 0..l;
    we take it from the independently fitted per-layer probes (or `cumulative_accuracy` when stored).
    Negative deltas count as 0 (as a probe cannot lose information it had)."""
    out = []
    main_metric = {"structural-distance": "uuas", "structural-depth": "root_acc"}
    for (model, task), g in rows.groupby(["model", "task"], sort=False):
        metric = "cumulative_accuracy" if (g["metric"] == "cumulative_accuracy").any() else main_metric.get(task, "accuracy")
        curve = g[(g["metric"] == metric) & g["layer"].notna()].sort_values("layer")
        if len(curve) < 2:
            continue
        expected = float(depth.expected_layer(curve["value"].to_numpy(float), curve["layer"].astype(int).to_numpy()))
        cog = g[(g["metric"] == "centre_of_gravity")]["value"]
        out.append({"model": model, "task": task, "metric": "expected_layer", "value": expected, "from": metric})
        if not cog.empty:
            out.append({"model": model, "task": task, "metric": "centre_of_gravity", "value": float(cog.iloc[0]),
                        "from": "scalar_mix"})
    return pd.DataFrame(out)


def depth_summary(rows: pd.DataFrame, title: str, options: dict) -> Drawn:
    """Tenney-style "where in depth": expected layer (and scalar-mix centre of gravity) per task and model."""
    import plotly.express as px

    summary = expected_layers(rows[~twin_mask(rows).to_numpy()])
    if summary.empty:
        raise MissingData(f"nothing to draw for {title!r}: need per-layer curves of at least two layers")
    fig = px.scatter(summary, x="value", y="task", color="model", symbol="metric", title=title,
                     labels={"value": "layer"}, template="plotly_white", height=360, width=760)
    fig.update_traces(marker={"size": 12})
    data = summary.rename(columns={"from": "kind"}).assign(run_id=None, step=None, stack=None, layer=None,
                                                           ci_low=None, ci_high=None)
    return Drawn(fig, tidy_rows(data))


DEPTH_STATS = tuple(depth.STATS)
_DEPTH_COLOURS = {"expected_layer": "#1f77b4", "gain_centre": "#d62728", "peak_layer": "#2ca02c"}


def depth_table(rows: pd.DataFrame, metrics: dict, alpha: float = 0.05, reference: str | None = None) -> pd.DataFrame:
    """Where in depth, with CIs (`probes.core.depth`): per model (no twins) and (task, metric) of `metrics`
    ({task: metric or [metrics]}), the expected layer, gain centre and peak layer with percentile
    CIs from the rows' paired bootstrap replicates (`extra.boot`; no CI where a run stored none),
    and the share of resamples in which each layer is the best. With `reference` (a task of
    `metrics`, its first metric), each other curve's difference from it, `<stat>_minus_<reference>`
    (`depth.difference`). Tidy rows (DATA_COLUMNS): metric = the statistic, kind = the metric it was
    computed from."""
    per_layer = rows[rows["layer"].notna() & ~rows["split"].astype(str).str.contains(":")]
    per_layer = per_layer[~twin_mask(per_layer).to_numpy()]
    out, curves = [], {}
    for task, wanted in metrics.items():
        for metric in _as_list(wanted):
            sub = per_layer[(per_layer["task"] == task) & (per_layer["metric"] == metric)]
            for (model, stack), g in sub.groupby(["model", "stack"], sort=False, dropna=False):
                if g["layer"].duplicated().any():
                    raise ConfigError(f"{model} {task}/{metric}: several rows per layer (several runs or seeds); "
                                      f"choose one run")
                layers, values, boot = depth.curve_with_replicates(g)
                if len(layers) < 2:
                    continue
                stats = depth.summarise(values, boot, layers, alpha)
                base = {"run_id": g["run_id"].iloc[0] if "run_id" in g else None, "model": model,
                        "step": g["step"].iloc[0], "task": task, "stack": stack, "kind": metric}
                curves[(model, stack, task, metric)] = (base, layers, values, boot)
                for name in DEPTH_STATS:
                    value, lo, hi = stats[name]
                    out.append(dict(base, metric=name, layer=None, value=value, ci_low=lo, ci_high=hi))
                if stats["peak_share"] is not None:
                    out += [dict(base, metric="peak_share", layer=int(l), value=float(v))
                            for l, v in zip(layers, stats["peak_share"])]
    if not out:
        raise MissingData(f"no per-layer curves of {metrics} (of at least two layers) in these runs")
    if reference is not None:
        if reference not in metrics:
            raise ConfigError(f"depth reference {reference!r} is not one of the tasks {sorted(metrics)}")
        ref_metric = _as_list(metrics[reference])[0]
        for (model, stack, task, metric), (base, layers, values, boot) in curves.items():
            ref = curves.get((model, stack, reference, ref_metric))
            if ref is None or task == reference or not np.array_equal(ref[1], layers):
                continue
            for name, (value, lo, hi) in depth.difference(values, boot, ref[2], ref[3], layers, alpha).items():
                out.append(dict(base, metric=f"{name}_minus_{reference}", layer=None, value=value, ci_low=lo, ci_high=hi))
    return tidy_rows(pd.DataFrame(out))


def depth_ci(rows: pd.DataFrame, title: str, options: dict) -> Drawn:
    """Tenney et al. (2019) "where in depth" with bootstrap CIs: left, the expected layer and gain
    centre (and peak layer) per task with 95% intervals; right, the share of bootstrap resamples in
    which each layer is the best; with `reference: TASK`, a third panel: each curve's statistics
    minus the reference task's. options: metrics {task: metric | [metrics]}, alpha, reference."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    metrics = options.get("metrics") or {t: "accuracy" for t in dict.fromkeys(rows["task"])}
    reference = options.get("reference")
    data = depth_table(rows, metrics, float(options.get("alpha", 0.05)), reference)
    several = data["model"].nunique() > 1
    data_l = data.assign(label=[f"{r['task']} {r['kind']}" + (f" - {r['model']}" if several else "")
                                for _, r in data.iterrows()])
    order = list(dict.fromkeys(data_l["label"]))
    diffs = data_l[data_l["metric"].str.endswith(f"_minus_{reference}")] if reference else data_l.iloc[:0]
    titles = ["layer (95% bootstrap CI)", "share of resamples: best layer"]
    if not diffs.empty:
        titles.append(f"minus {reference} (95% CI)")
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.2)
    symbols = {"expected_layer": "circle", "gain_centre": "diamond", "peak_layer": "x"}
    for name in DEPTH_STATS:
        d = data_l[data_l["metric"] == name].set_index("label").reindex(order).dropna(subset=["value"])
        fig.add_trace(go.Scatter(x=d["value"], y=d.index, mode="markers", name=name.replace("_", " "),
                                 marker={"symbol": symbols[name], "size": 11, "color": _DEPTH_COLOURS[name]},
                                 error_x={"type": "data", "symmetric": False, "array": d["ci_high"] - d["value"],
                                          "arrayminus": d["value"] - d["ci_low"]}), row=1, col=1)
    share = data_l[data_l["metric"] == "peak_share"]
    if not share.empty:
        table = share.pivot_table(index="label", columns="layer", values="value").reindex([o for o in order if o in set(share["label"])])
        fig.add_trace(go.Heatmap(z=table.to_numpy(), x=[str(int(c)) for c in table.columns], y=list(table.index),
                                 colorscale="Blues", zmin=0, zmax=1, colorbar={"title": "share", "x": 1.02},
                                 text=np.round(table.to_numpy(), 2), texttemplate="%{text}"), row=1, col=2)
    for name in DEPTH_STATS:
        d = diffs[diffs["metric"] == f"{name}_minus_{reference}"].set_index("label").reindex(order).dropna(subset=["value"])
        if d.empty:
            continue
        fig.add_trace(go.Scatter(x=d["value"], y=d.index, mode="markers", name=name.replace("_", " "), showlegend=False,
                                 marker={"symbol": symbols[name], "size": 11, "color": _DEPTH_COLOURS[name]},
                                 error_x={"type": "data", "symmetric": False, "array": d["ci_high"] - d["value"],
                                          "arrayminus": d["value"] - d["ci_low"]}), row=1, col=3)
    if not diffs.empty:
        fig.add_vline(x=0, line_dash="dot", line_color="grey", row=1, col=3)
        fig.update_xaxes(title_text="layers", row=1, col=3)
    placed = data[data["metric"].isin(DEPTH_STATS)]
    top = float(np.nanmax(np.r_[pd.to_numeric(data["layer"]).to_numpy(dtype=float), placed["value"].to_numpy(dtype=float),
                                placed["ci_high"].to_numpy(dtype=float)]))
    fig.update_xaxes(title_text="layer", dtick=1, range=[-0.3, top + 0.3], row=1, col=1)
    fig.update_xaxes(title_text="layer", dtick=1, row=1, col=2)
    fig.update_layout(title=title, template="plotly_white", height=220 + 48 * len(order), width=1100 + 350 * (len(titles) > 2),
                      legend={"orientation": "h", "y": -0.25, "x": 0})
    return Drawn(fig, data)


def training_heatmap(rows: pd.DataFrame, title: str, options: dict) -> Drawn:
    """Checkpoints (training steps) x layers heatmap of one metric: when each ability appears."""
    import plotly.graph_objects as go

    task = options.get("task", rows["task"].iloc[0] if len(rows) else None)
    metric = options.get("metric", "accuracy")
    rows = rows[~twin_mask(rows).to_numpy()]
    sub = rows[(rows["task"] == task) & (rows["metric"] == metric) & rows["layer"].notna()]
    if sub.empty or sub["step"].isna().all():
        raise MissingData(f"nothing to draw for {title!r}: no {task}/{metric} rows with training steps")
    sub = sub.assign(step=sub["step"].astype(int), layer=sub["layer"].astype(int))
    # several rows of one (step, layer) (seeds, runs): their mean (`workbench.store.aggregate`)
    mean = aggregate(sub, over="seed", by=["step", "layer"], interval="none")
    table = mean.pivot(index="step", columns="layer", values="value").sort_index().dropna(axis=1, how="all")
    fig = go.Figure(go.Heatmap(z=table.to_numpy(), x=[str(c) for c in table.columns], y=[str(i) for i in table.index],
                               colorscale="Viridis", colorbar={"title": metric}))
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="training step", yaxis_type="category",
                      template="plotly_white", height=120 + 28 * len(table), width=640)
    return Drawn(fig, tidy_rows(sub.assign(kind="model")))


def roc_curves(rows: pd.DataFrame, title: str, options: dict) -> Drawn:
    """Membership ROC per attack (probes/membership/), log-scale FPR (Carlini et al. 2022's view:
    what matters is the TPR at low FPR), one panel per model; the points come from each `auc` row's
    extra (roc_fpr, roc_tpr). data.csv: metric roc_fpr / roc_tpr, `layer` = the point's index."""
    import plotly.graph_objects as go

    sub = row_kinds(rows[(rows["metric"] == "auc") & rows["layer"].isna()])
    if options.get("model"):
        sub = sub[sub["model"] == options["model"]]
    if options.get("attacks"):
        sub = sub[sub["task"].isin(options["attacks"])]
    if sub.empty:
        raise MissingData(f"nothing to draw for {title!r}: no membership auc rows with ROC points")
    floor = float(options.get("min_fpr", 1e-3))
    fig, data = go.Figure(), []
    for _, r in sub.iterrows():
        fpr = np.asarray(row_field(r, "roc_fpr", "membership") or [], float)
        tpr = np.asarray(row_field(r, "roc_tpr", "membership") or [], float)
        if not len(fpr):  # an auc row without ROC points (the model-free TF-IDF control): no curve
            continue
        label = f"{r['task']} (AUC {r['value']:.3f})" + (f" - {r['model']}" if sub["model"].nunique() > 1 else "")
        fig.add_trace(go.Scatter(x=np.maximum(fpr, floor), y=tpr, mode="lines", name=label))
        for i, (f, t) in enumerate(zip(fpr, tpr)):
            data += [{"run_id": r.get("run_id"), "model": r["model"], "step": r["step"], "task": r["task"],
                      "metric": m, "stack": r["stack"], "layer": i, "value": v, "kind": r["kind"]}
                     for m, v in (("roc_fpr", f), ("roc_tpr", t))]
    fig.add_trace(go.Scatter(x=np.geomspace(floor, 1, 50), y=np.geomspace(floor, 1, 50), mode="lines",
                             name="chance", line={"dash": "dot", "color": "grey"}))
    fig.update_layout(title=title, xaxis_title=f"false positive rate (log; below {floor:g} drawn at {floor:g})",
                      yaxis_title="true positive rate", xaxis_type="log", yaxis_type="log" if options.get("log_tpr") else None,
                      template="plotly_white", height=480, width=720)
    return Drawn(fig, tidy_rows(pd.DataFrame(data)))


def auc_over_steps(rows: pd.DataFrame, title: str, options: dict) -> Drawn:
    """Membership AUC (95% CI band) over training steps, one line per attack (probes/membership/):
    memorisation growing with training."""
    import plotly.graph_objects as go

    metric = options.get("metric", "auc")
    rows = rows[~twin_mask(rows).to_numpy()]
    sub = rows[(rows["metric"] == metric) & rows["layer"].isna() & rows["step"].notna()]
    if options.get("attacks"):
        sub = sub[sub["task"].isin(options["attacks"])]
    if sub.empty:
        raise MissingData(f"nothing to draw for {title!r}: no {metric} rows with training steps")
    sub = sub.assign(step=sub["step"].astype(int)).sort_values("step")
    fig = go.Figure()
    for task, g in sub.groupby("task", sort=False):
        x = g["step"].clip(lower=options.get("min_step", 1))
        fig.add_trace(go.Scatter(x=x, y=g["value"], mode="lines+markers", name=task,
                                 error_y={"type": "data", "symmetric": False, "array": g["ci_high"] - g["value"],
                                          "arrayminus": g["value"] - g["ci_low"]}))
    fig.add_hline(y=0.5, line_dash="dot", line_color="grey")
    fig.update_layout(title=title, xaxis_title="training step (log; step 0 drawn at 1)", yaxis_title=metric,
                      xaxis_type="log", template="plotly_white", height=420, width=720, showlegend=True)
    if is_fraction(metric):
        unit_axis(fig)
    return Drawn(fig, tidy_rows(sub.assign(kind="model")))


PLOTS: dict[str, Callable[[pd.DataFrame, str, dict], Drawn]] = {
    "layer_curves": layer_curves, "depth_summary": depth_summary, "depth_ci": depth_ci, "training_heatmap": training_heatmap,
    "roc_curves": roc_curves, "auc_over_steps": auc_over_steps}


def all_plots() -> dict[str, Callable[[pd.DataFrame, str, dict], Drawn]]:
    """PLOTS plus the plot kinds probe companion pages add (`PLOTS` in app/page_modules/<probe>.py)."""
    from app.page_modules import extra_plots

    return {**extra_plots(), **PLOTS}


def tidy_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows a plot drew, with every column of a figure's data.csv (DATA_COLUMNS); page modules'
    own plots return theirs through it too."""
    for c in DATA_COLUMNS:
        if c not in df:
            df[c] = None
    df = df[DATA_COLUMNS].copy()
    df["value"] = pd.to_numeric(df["value"]).round(10)
    return df.sort_values(["model", "task", "metric", "layer", "kind"], na_position="first").reset_index(drop=True)


# --------------------------------------------------------------------------- rendering
def export_timeout(value: float | str | None = None) -> float:
    """Seconds a figure's static export may take: `value`, else $BERTOLOGY_FIGURE_TIMEOUT, else 120."""
    raw = value if value is not None else os.environ.get(EXPORT_TIMEOUT_ENV, EXPORT_TIMEOUT)
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0:
        raise ConfigError(f"figure export timeout must be a positive number of seconds (${EXPORT_TIMEOUT_ENV}), "
                          f"got {raw!r}")
    return seconds


def _export_command(figure_json: Path, out_dir: Path, formats: list[str]) -> list[str]:
    return [sys.executable, "-c", _EXPORT_CHILD, str(figure_json), str(out_dir), *formats]


def _kill_tree(proc: subprocess.Popen, grace: float = 2.0) -> None:
    """SIGTERM the child and all its descendants (Chromium in its own session included, found by
    psutil as a descendant), SIGKILL what still runs after `grace` seconds, and reap the child.
    The descendants are collected before the first signal: the children of a dead process are
    re-parented and no longer found under it."""
    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:  # exited meanwhile: only the reaping is left
        tree = []
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(tree, timeout=grace)
    survivors = list(alive)
    for p in alive:  # with whatever they started meanwhile
        with contextlib.suppress(psutil.NoSuchProcess):
            survivors += p.children(recursive=True)
    for p in survivors:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(survivors, timeout=grace)
    proc.wait()


def static_images(figure, formats: list[str], timeout: float) -> dict[str, bytes] | None:
    """The `formats` (png, svg, pdf) of a plotly figure through kaleido, rendered in a child process;
    after `timeout` seconds (None then), or when the wait is interrupted, the child and its Chromium
    are killed (`_kill_tree`). The child writes into a private temporary folder; nothing reaches the
    figure folder from it."""
    with tempfile.TemporaryDirectory(prefix="bertology-figure-") as tmp:
        spec = Path(tmp) / "figure.json"
        spec.write_text(figure.to_json(), encoding="utf-8")
        proc = subprocess.Popen(_export_command(spec, Path(tmp), formats), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if proc.poll() is None:  # timed out, or interrupted (KeyboardInterrupt, any other error)
                _kill_tree(proc)
            proc.stdout.close()
            proc.stderr.close()
        if proc.returncode != 0:
            last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
            raise WorkbenchError(f"static figure export (kaleido) failed: {last}")
        return {fmt: (Path(tmp) / f"figure.{fmt}").read_bytes() for fmt in formats}


def draw(name_or_path: str | Path, store=None, run_id: str | list[str] | None = None) -> tuple[str, dict, Drawn, list[str]]:
    """A figure drawn from the store, nothing written: (name, spec, Drawn, the run ids read).
    `run_id` (one or a list) replaces the spec's run selection. `render` writes what this draws; the
    Python API (`bertology.figure`) shows it."""
    from workbench.store.results import ResultsStore

    name, spec = load_spec(name_or_path)
    store = store if store is not None else ResultsStore()
    query = dict(spec.get("query") or {})
    if run_id is not None:
        query.pop("name", None)
        query["run"] = run_id
    rows, run_ids = query_rows(store, query)
    return name, spec, all_plots()[spec["plot"]](rows, spec.get("title", name), dict(spec.get("options") or {})), run_ids


@dataclass
class Rendered:
    name: str
    folder: Path
    files: list[Path]
    manifest: dict


def render(name_or_path: str | Path, store=None, out: str | Path | None = None,
           formats: tuple[str, ...] = FORMATS, run_id: str | None = None,
           timeout: float | None = None) -> Rendered:
    """Query the store, draw, and write the figure files + data.csv + manifest.json atomically.
    `run_id` replaces the spec's run selection (draw this figure for one given run); `timeout`:
    seconds for the static export (`export_timeout`), after which only the HTML is written."""
    from workbench.io import atomic_write_bytes, atomic_write_json, atomic_write_text
    from workbench.store.manifest import git_state, package_versions, utc_now_iso
    from workbench.store.results import ResultsStore

    bad = set(formats) - set(FORMATS)
    if bad:
        raise ConfigError(f"unknown figure format(s) {sorted(bad)}; formats: {FORMATS}")
    timeout = export_timeout(timeout)
    store = store if store is not None else ResultsStore()
    name, spec, drawn, run_ids = draw(name_or_path, store, run_id)
    folder = Path(out) if out is not None else store.root / "figures" / name
    csv = drawn.data.to_csv(index=False, float_format="%.10g")
    static = [f for f in formats if f != "html"]
    images = static_images(drawn.figure, static, timeout) if static else {}  # may raise: folder untouched
    warnings = []
    if images is None:
        warnings.append(f"static export ({', '.join(static)}) did not finish within {timeout:g} s (kaleido's "
                        f"Chromium hung or the machine is overloaded): only the HTML was written; render again "
                        f"for the images (${EXPORT_TIMEOUT_ENV} sets the limit)")
        get_logger(__name__).warning(f"figure {name}: {warnings[-1]}")
        formats, images = ("html",), {}
    content = dict(images)  # format -> bytes
    if "html" in formats:
        content["html"] = drawn.figure.to_html(include_plotlyjs="cdn", full_html=True).encode("utf-8")
    # everything drawn: now the folder, the old manifest out first and the new one in last
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").unlink(missing_ok=True)
    files = [atomic_write_text(folder / "data.csv", csv)]
    for fmt in static:  # an earlier render's images would not show this data
        if fmt not in formats:
            (folder / f"{name}.{fmt}").unlink(missing_ok=True)
    files += [atomic_write_bytes(folder / f"{name}.{fmt}", content[fmt]) for fmt in formats]
    manifest = {"figure": name, "spec": spec, "run_ids": run_ids, "store": str(store.root),
                "data_sha256": hashlib.sha256(csv.encode()).hexdigest(), "n_points": len(drawn.data),
                "files": [p.name for p in files], "created": utc_now_iso(), "git": git_state(),
                "versions": package_versions(("plotly", "kaleido", "pandas"))}
    if warnings:
        manifest["warnings"] = warnings
    files.append(atomic_write_json(folder / "manifest.json", manifest))
    return Rendered(name, folder, files, manifest)


def produced_by(spec: dict) -> str:
    """The command that makes a figure's runs: the spec's `produced_by`, else one read off its query."""
    if spec.get("produced_by"):
        return str(spec["produced_by"])
    query = spec.get("query") or {}
    tasks = ",".join(map(str, _as_list(query.get("tasks"))))
    name = f" --name {query['name']}..." if query.get("name") else ""
    return " and ".join(f"bertology probe {p} --checkpoint CKPT" + (f" --tasks {tasks}" if tasks else "") + name
                        for p in _as_list(query.get("probe"))) or "a run of the probe the query names"


def figures_cli(names: list[str], all_: bool, out: str | None, formats: str | None, runs_root: str | None) -> int:
    """Render the named figures (or every shipped one with `all_`); exit status 0, 1 or 2.

    Bad input (no name, a name and --all, an unknown figure, an unreadable or malformed YAML, an
    unknown format, a bad $BERTOLOGY_FIGURE_TIMEOUT) is refused before any figure is drawn: one
    line and exit 2 (`cli_errors`). Then every figure is tried, whatever happens to the others
    (issue 26's promise, issue 40): one whose data is not in the store (`MissingData`: no run
    matches its query, its pinned runs are absent, its runs hold nothing it can draw) is skipped
    and listed with the command that makes its data (`produced_by`); one that cannot be drawn for
    another reason the workbench names (`WorkbenchError`: a failed export, an ambiguous selection)
    is listed with that reason; both give exit status 2 once the rest is drawn. Anything else is a
    bug in a plot: with several figures it is listed in one line (its type and message, and the
    command that shows its traceback) and the others are still drawn, exit status 1; a single
    named figure keeps the traceback. Each drawn figure writes its own manifest (`render`); a
    skipped or failed one leaves its folder as an earlier render left it."""
    from workbench.store.results import ResultsStore

    if all_ and names:
        raise ConfigError(f"give figure names or --all, not both (got --all and {' '.join(names)})")
    todo = figure_names() if all_ else list(names)
    if not todo:
        raise ConfigError(f"name a figure or pass --all; shipped figures: {', '.join(figure_names())}")
    fmts = tuple(f.strip() for f in formats.split(",")) if formats is not None else FORMATS
    bad = [f for f in fmts if f not in FORMATS]
    if bad or not fmts:
        raise ConfigError(f"--formats: unknown format(s) {bad or [formats]}; choose from {','.join(FORMATS)}")
    export_timeout()  # a bad $BERTOLOGY_FIGURE_TIMEOUT is refused before the first figure
    specs = dict(load_spec(name) for name in todo)  # every name and YAML checked before any work
    if len(specs) < len(todo):
        raise ConfigError(f"figure(s) named twice: {sorted({n for n in todo if todo.count(n) > 1})}")
    store = ResultsStore(runs_root)
    several = len(todo) > 1
    drawn: list[str] = []
    skipped: list[tuple[str, str, str]] = []  # (name, why, command)
    failed: list[tuple[str, str]] = []  # (name, why): the workbench named the problem
    bugs: list[tuple[str, str]] = []  # (name, what was raised)
    for arg, name in zip(todo, specs):
        folder = (Path(out) / name if several else Path(out)) if out else None
        try:
            r = render(arg, store, folder, fmts)
        except MissingData as e:
            skipped.append((name, _one_line(e), produced_by(specs[name])))
            continue
        except WorkbenchError as e:
            failed.append((name, _one_line(e)))
            continue
        except Exception as e:  # noqa: BLE001 - one figure's bug must not stop the others
            if not several:
                raise
            bugs.append((name, f"{type(e).__name__}: {_one_line(e)}"))
            continue
        drawn.append(name)
        print(f"{r.name}: {r.folder} ({', '.join(p.name for p in r.files)}; runs {', '.join(r.manifest['run_ids'])})")
    if several:
        print(f"drew {len(drawn)} of {len(todo)} figure(s) from {store.root}")
    if skipped:
        print(f"{len(skipped)} of {len(todo)} figure(s) skipped: their data is not in {store.root}", file=sys.stderr)
        for name, why, command in skipped:
            print(f"  {name}: {why}\n    make the data with: {command}", file=sys.stderr)
    if failed:
        print(f"{len(failed)} of {len(todo)} figure(s) could not be drawn:", file=sys.stderr)
        for name, why in failed:
            print(f"  {name}: {why}", file=sys.stderr)
    if bugs:
        print(f"{len(bugs)} of {len(todo)} figure(s) failed with an error (a bug; `bertology figures NAME` "
              f"alone shows its traceback):", file=sys.stderr)
        for name, why in bugs:
            print(f"  {name}: {why}", file=sys.stderr)
        return 1
    return 2 if skipped or failed else 0


def _one_line(err: BaseException) -> str:
    """An exception's message on one line (a listing of many figures stays one line per figure)."""
    text = " ".join(str(err).split())
    return text if len(text) <= 400 else text[:397] + "..."


def data_of(rendered: Rendered) -> pd.DataFrame:
    return pd.read_csv(rendered.folder / "data.csv")

