"""Layer curves: any probe x task x metric, several models overlaid with CI bands, baselines as
reference lines, selectivity, scalar-mix weights with their centre of gravity, seeds aggregated
(mean and spread), and a checkpoints x layers heatmap for runs over training steps.

The drawing is `app.figures` (the same functions `bertology figures` renders), so what the app
shows and what a paper figure shows cannot drift apart.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import data, figures, ui
from workbench.store.aggregate import aggregate


def render() -> None:
    st.header("Layer curves")
    s = ui.store()
    runs = ui.catalog_or_stop(s, "probe", ui.MAIN_COMMAND)
    probe = ui.pick("Probe", data.facet_values(runs, "probes"), key="lc-probe")
    if probe is None:
        st.info(f"The runs hold no probe rows yet: run `{ui.MAIN_COMMAND}`.")
        return
    runs = data.filter_runs(runs, probes=[probe])
    task = ui.pick("Task", data.facet_values(runs, "tasks"), key="lc-task")
    runs = data.filter_runs(runs, tasks=[task])
    # Every metric of the task is read: which rows are baselines is in the rows (`data.row_kinds`).
    loaded = ui.cached_query(s, runs, probe=probe, task=task)
    ui.show_problems(loaded.problems)
    rows = loaded.rows
    if rows.empty:
        st.info(f"No readable {probe}/{task} rows.")
        return
    metrics, _ = data.metric_choices(rows[rows["layer"].notna()])
    metric = ui.pick("Metric", metrics or sorted(rows["metric"].dropna().unique()), key="lc-metric", default="accuracy")
    if metric not in set(rows["metric"]):
        st.info(f"No {metric} rows for {probe}/{task}; choose another metric.")
        return
    draw(rows, probe, task, key="lc", metric=metric)


def draw(rows: pd.DataFrame, probe: str, task: str, key: str, metric: str | None = None) -> pd.DataFrame:
    """The controls and charts for one probe x task (used by the generic probe page too); returns
    the rows drawn as curves. `metric` given: no metric picker (the caller chose it)."""
    per_layer = rows[rows["layer"].notna()]
    if per_layer.empty:
        st.info(f"{probe}/{task} has no per-layer rows; its rows:")
        ui.table(rows, f"{key}-rows")
        return rows.iloc[:0]
    per_layer = data.row_kinds(per_layer)
    curve_metrics, _ = data.metric_choices(per_layer)
    mix = {"scalar_mix_weight", "cumulative_accuracy"}
    metrics = sorted(m for m in curve_metrics if m not in mix) or sorted(per_layer["metric"].dropna().unique())
    splits = sorted(per_layer.loc[~per_layer["split"].astype(str).str.contains(":"), "split"].dropna().unique())
    stacks = sorted(per_layer["stack"].dropna().unique())
    c = st.columns(4)
    with c[0]:
        if metric is None:
            metric = ui.pick("Metric", metrics, key=f"{key}-metric", default="accuracy")
    with c[1]:
        split = ui.pick("Split", splits, key=f"{key}-split", default="dev") if splits else None
    with c[2]:
        stack = ui.pick("Stack", stacks, key=f"{key}-stack") if len(stacks) > 1 else (stacks[0] if stacks else None)
    seeds_present = per_layer["seed"].nunique() > 1 or per_layer["model"].map(data.strip_seed).nunique() < \
        per_layer["model"].nunique()
    with c[3]:
        aggregate = st.checkbox("Aggregate seeds (mean, min-max band)", value=seeds_present, key=f"{key}-aggregate")
    view = per_layer
    if split is not None:
        view = view[view["split"] == split]
    if stack is not None:
        view = view[view["stack"] == stack]
    if aggregate:
        view = data.aggregate_seeds(view)
    is_baseline = data.baseline_mask(view).to_numpy()
    models = list(dict.fromkeys(view.loc[(view["metric"] == metric).to_numpy() & ~is_baseline, "model"]))
    chosen = st.multiselect("Models", models, default=models[:8], key=f"{key}-models")
    curves = view[view["model"].isin(chosen).to_numpy() & (view["metric"] == metric).to_numpy() & ~is_baseline]
    if curves.empty:
        st.info("Choose at least one model.")
        return curves
    # Baselines of one model (the first chosen): majority is the same for every model, control-task
    # and chain baselines nearly so, and one reference line per baseline keeps the chart readable.
    twins = data.twin_models(view)
    ref_model = next((m for m in chosen if m not in twins), None)
    refs = view[is_baseline & (view["model"] == ref_model).to_numpy()]
    drawn = figures.layer_curves(pd.concat([curves, refs], ignore_index=True), f"{probe} · {task}: {metric}",
                                 {"training_seeds": aggregate})
    drawn.figure.update_layout(width=None, height=430)
    st.plotly_chart(drawn.figure, width="stretch", key=f"{key}-curves")
    st.caption("Bands: 95% CI of the run (bootstrap), or the min-max over seeds (line: their mean) when "
               "aggregated; dotted: "
               "random-init twins; dashed grey: baselines "
               f"(of {ref_model}).")

    sel = selectivity(view, metric, chosen)
    if not sel.empty:
        st.subheader("Selectivity")
        st.caption("Task accuracy minus control-task accuracy per layer (Hewitt & Liang 2019): a probe that "
                   "only memorises word types scores high on both.")
        st.plotly_chart(_line(sel, "selectivity", twins), width="stretch", key=f"{key}-selectivity")

    scalar_mix(rows[rows["model"].isin(chosen) | rows["model"].map(data.strip_seed).isin(chosen)], key)

    steps = curves["step"].dropna().unique()
    if len(steps) > 1:
        st.subheader("Checkpoints × layers")
        heat = figures.training_heatmap(view[view["model"].isin(chosen)], f"{task}: {metric} over training steps",
                                        {"task": task, "metric": metric})
        heat.figure.update_layout(width=None)
        st.plotly_chart(heat.figure, width="stretch", key=f"{key}-heatmap")
    st.subheader("Rows drawn")
    shown = curves.sort_values(["model", "layer"]).reset_index(drop=True)
    ui.table(shown, f"{key}-table")
    return shown


def selectivity(view: pd.DataFrame, metric: str, chosen: list[str]) -> pd.DataFrame:
    """Stored `selectivity` rows when the probe wrote them, else metric - control_accuracy by layer."""
    sub = view[view["model"].isin(chosen)]
    stored = sub[sub["metric"] == "selectivity"]
    if not stored.empty:
        return stored
    if metric != "accuracy" or "control_accuracy" not in set(sub["metric"]):
        return stored
    keys = ["model", "layer", "split", "stack"]
    a = sub[sub["metric"] == "accuracy"].set_index(keys)["value"]
    b = sub[sub["metric"] == "control_accuracy"].set_index(keys)["value"]
    return (a - b).dropna().rename("value").reset_index().assign(metric="selectivity")


def scalar_mix_means(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """(weights, centres): per (model, layer) the scalar-mix weight and per model the centre of
    gravity, each the mean over the seeds and runs of the rows (`workbench.store.aggregate`)."""
    weights = rows[(rows["metric"] == "scalar_mix_weight") & rows["layer"].notna()]
    weights = aggregate(weights, over="seed", by=["model", "layer"], interval="none")[["model", "layer", "value"]]
    cog = rows[rows["metric"] == "centre_of_gravity"]
    cog = aggregate(cog, over="seed", by=["model"], interval="none").set_index("model")["value"].sort_index()
    return weights, cog.rename("centre_of_gravity")


def scalar_mix(rows: pd.DataFrame, key: str) -> None:
    """Scalar-mix weights by layer (Tenney et al. 2019) with the centre of gravity marked."""
    weights, cog = scalar_mix_means(rows)
    if weights.empty:
        return
    st.subheader("Scalar-mix weights")
    fig = go.Figure()
    for model, g in weights.groupby("model", sort=False):
        g = g.set_index("layer")["value"].sort_index()
        fig.add_trace(go.Bar(x=g.index.astype(int), y=g.to_numpy(), name=str(model)))
        if model in cog:
            fig.add_vline(x=float(cog[model]), line_dash="dash",
                          annotation_text=f"centre of gravity {cog[model]:.2f}")
    fig.update_layout(barmode="group", xaxis_title="layer", yaxis_title="softmax weight", template="plotly_white",
                      height=360)
    st.plotly_chart(fig, width="stretch", key=f"{key}-scalar-mix")
    ui.table(cog.reset_index(), f"{key}-cog")


def _line(df: pd.DataFrame, ytitle: str, twins: set[str]):
    fig = go.Figure()
    for model, g in df.groupby("model", sort=False):
        g = g.sort_values("layer")
        fig.add_trace(go.Scatter(x=g["layer"].astype(int), y=g["value"], mode="lines+markers", name=str(model),
                                 line={"dash": "dot" if model in twins else "solid"}))
    fig.add_hline(y=0, line_color="grey", line_width=1)
    fig.update_layout(xaxis_title="layer", yaxis_title=ytitle, template="plotly_white", height=340)
    return fig
