"""The coreference probe's page (Tenney et al. 2019; Clark et al. 2019; Webster et al. 2018): layer
curves of the mention-pair, entity-type and GAP probes with their rule baselines, where in depth
each is decoded next to the same model's UPOS and deprel (expected layer, peak layer and its
bootstrap distribution, `app.figures.depth_ci`), the layer x head heatmap of coreference heads with
the best head per layer, and GAP F1 by gender."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import data, figures, ui
from app.fields import row_field
from app.views.probe import panel_curves, probe_rows, twin_toggle
from workbench.errors import ConfigError

TITLE = "Coreference"
# (task, metric) panels; the data-only baselines drawn in each are the ones the rows declare for it
CURVES = [("gum-pairs", "auc"), ("gum-pairs", "antecedent_accuracy"), ("gum-entity-type", "accuracy"), ("gap", "f1"),
          ("attention-heads", "best_head_accuracy"), ("attention-heads", "best_head_gap")]
# where in depth: task -> metric(s) (syntax rows come from the newest syntax run of the same model)
DEPTH_METRICS = {"upos": "accuracy", "deprel": "accuracy", "gum-pairs": ["auc", "antecedent_accuracy"],
                 "gum-entity-type": "accuracy", "gap": "f1"}
SYNTAX_TASKS = ("upos", "deprel")
HEATMAPS = {"heads_strict": "GUM: head word attends most to an antecedent's head word (Clark et al.)",
            "heads_all": "GUM: head word attends most to a word of an antecedent (lenient)",
            "heads_gap": "GAP: more attention to the right name"}


def head_matrix(rows: pd.DataFrame, model: str, metric: str) -> pd.DataFrame:
    """layer x head values of one model's per-head rows (`extra.head`)."""
    sub = rows[(rows["model"] == model) & (rows["task"] == "attention-heads") & (rows["metric"] == metric)]
    if sub.empty:
        return pd.DataFrame()
    heads = row_field(sub, "head", "coref")
    return (sub.assign(head=heads).dropna(subset=["head"])
            .pivot_table(index="layer", columns="head", values="value", aggfunc="first").sort_index())


def with_syntax(store, rows: pd.DataFrame) -> data.Loaded:
    """`rows` plus, for each (non-twin) model in them, the UPOS and deprel rows of the newest syntax
    run of that model (Tenney et al.'s comparison on one checkpoint), read through the app's cached
    query (a damaged syntax run becomes a problem line)."""
    frames, problems = [rows], []
    for model in dict.fromkeys(rows.loc[~data.twin_mask(rows).to_numpy(), "model"]):
        runs = store.runs(probe="syntax", model=model, task=list(SYNTAX_TASKS))
        if runs.empty:
            continue
        got = ui.cached_query(store, data.with_health(store, runs.iloc[[-1]]), model=model, task=list(SYNTAX_TASKS))
        frames.append(got.rows)
        problems += got.problems
    return data.Loaded(pd.concat(frames, ignore_index=True), problems)


def best_heads(rows: pd.DataFrame) -> pd.DataFrame:
    """Per model and layer: the best head and its value (GUM and GAP)."""
    sub = rows[(rows["task"] == "attention-heads") & rows["metric"].isin(["best_head_accuracy", "best_head_gap"])]
    if sub.empty:
        return pd.DataFrame(columns=["model", "metric", "layer", "head", "value", "ci_low", "ci_high"])
    head = row_field(sub, "best_head", "coref")
    return (sub.assign(head=head)[["model", "metric", "layer", "head", "value", "ci_low", "ci_high"]]
            .sort_values(["model", "metric", "layer"]).reset_index(drop=True))


def render(store) -> None:
    import plotly.graph_objects as go

    rows = probe_rows(store, "coref", "Coreference probes")
    if rows is None:
        return
    view = twin_toggle(rows, "coref")
    panel_curves(view, CURVES, "coref")

    st.subheader("Where in depth (Tenney et al. 2019)")
    both = with_syntax(store, rows)
    ui.show_problems(both.problems)
    try:
        depth = figures.depth_ci(both.rows, "Expected layer, gain centre and peak layer (95% bootstrap CIs)",
                                 {"metrics": DEPTH_METRICS, "reference": "upos"})
    except ConfigError as e:
        st.info(f"No depth summary: {e}")
    else:
        depth.figure.update_layout(width=None)
        st.plotly_chart(depth.figure, width="stretch", key="coref-depth")
        table = depth.data[depth.data["metric"] != "peak_share"]
        ui.table(table[["model", "task", "kind", "metric", "value", "ci_low", "ci_high"]], "coref-depth-table")

    st.subheader("Coreference heads (Clark et al. 2019)")
    models = [m for m in dict.fromkeys(rows["model"]) if not head_matrix(rows, m, "heads_all").empty]
    if models:
        model = st.selectbox("Model", models, key="coref-head-model")
        for metric, title in HEATMAPS.items():
            mat = head_matrix(rows, model, metric)
            if mat.empty:
                continue
            fig = go.Figure(go.Heatmap(z=mat.to_numpy(), x=[str(int(h)) for h in mat.columns],
                                       y=[str(int(l)) for l in mat.index], colorscale="Viridis",
                                       colorbar={"title": "accuracy"}))
            fig.update_layout(title=f"{title} ({model})", xaxis_title="head", yaxis_title="layer",
                              template="plotly_white", height=360)
            st.plotly_chart(fig, width="stretch", key=f"coref-heat-{metric}")
        ui.table(best_heads(rows), "coref-best-heads")

    gender = view[(view["task"] == "gap") & view["metric"].isin(["f1_masculine", "f1_feminine"])]
    if not gender.empty:
        st.subheader("GAP F1 by gender (Webster et al. 2018)")
        drawn = figures.layer_curves(gender, "GAP F1: masculine vs feminine pronouns", {"baselines": []})
        drawn.figure.update_layout(width=None)
        st.plotly_chart(drawn.figure, width="stretch", key="coref-gap-gender")
