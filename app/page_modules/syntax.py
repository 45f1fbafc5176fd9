"""The syntax probe's page (Hewitt & Manning 2019; Tenney et al. 2019): one run's POS, dependency
and structural-probe curves side by side with their baselines, where in depth each task is decoded
(expected layer and scalar-mix centre of gravity), and the training-time heatmap for runs over
training steps. A template for other probes' companion pages (see app/page_modules/__init__.py)."""

from __future__ import annotations

import streamlit as st

from app import data, figures, ui
from app.views.probe import probe_rows, twin_toggle

TITLE = "Syntax"
MAIN_METRIC = {"structural-distance": "uuas", "structural-depth": "root_acc"}


def render(store) -> None:
    rows = probe_rows(store, "syntax", "Syntax probes")
    if rows is None:
        return
    tasks = sorted(rows["task"].dropna().unique())
    chosen = st.multiselect("Tasks", tasks, default=[t for t in ("upos", "deprel", "structural-distance") if t in tasks]
                            or tasks[:3], key="syntax-tasks")
    view = twin_toggle(rows, "syntax")
    view = data.row_kinds(view)
    view = view[view["task"].isin(chosen) & (view["split"] == "dev") &
                (view["metric"].isin([MAIN_METRIC.get(t, "accuracy") for t in chosen]) | data.baseline_mask(view))]
    if not view.empty:
        drawn = figures.layer_curves(view, "Syntax probes, layer by layer", {})
        drawn.figure.update_layout(width=None)
        st.plotly_chart(drawn.figure, width="stretch", key="syntax-curves")

    st.subheader("Where in depth (Tenney et al. 2019)")
    models_only = rows[~data.twin_mask(rows).to_numpy()]
    summary = figures.expected_layers(models_only)
    if summary.empty:
        st.info("Expected layers need per-layer curves of at least two layers.")
    else:
        depth = figures.depth_summary(models_only, "Expected layer per task", {})
        depth.figure.update_layout(width=None)
        st.plotly_chart(depth.figure, width="stretch", key="syntax-depth")
        ui.table(summary, "syntax-depth-table")

    best = best_layers(rows)
    st.subheader("Best layer per task and model")
    ui.table(best, "syntax-best")

    steps = rows["step"].dropna().unique()
    if len(steps) > 1 and "upos" in tasks:
        heat = figures.training_heatmap(rows[rows["split"] == "dev"], "UPOS accuracy over training steps",
                                        {"task": "upos", "metric": "accuracy"})
        heat.figure.update_layout(width=None)
        st.plotly_chart(heat.figure, width="stretch", key="syntax-heatmap")


def best_layers(rows):
    """Per (model, task): the layer with the highest main metric on dev, and its value."""
    dev = rows[(rows["split"] == "dev") & rows["layer"].notna()]
    dev = dev[dev["metric"] == dev["task"].map(lambda t: MAIN_METRIC.get(t, "accuracy"))]
    if dev.empty:
        return dev[["model", "task", "metric", "layer", "value"]]
    idx = dev.groupby(["model", "task"])["value"].idxmax()
    return dev.loc[idx, ["model", "task", "metric", "layer", "value"]].reset_index(drop=True)
