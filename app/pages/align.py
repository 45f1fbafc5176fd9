"""The alignment probe's page (Conneau et al. 2018; Kornblith et al. 2019; Hamilton et al. 2016):
P@1 and sentence retrieval by layer with their random-rotation / no-map baselines, the i x j CKA and
Procrustes-retrieval matrices of every model pair, and the diachronic most-moved words against
their noise floor."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import figures, ui
from app.views.probe import panel_curves, probe_rows, twin_toggle
from workbench.results import decode_extra

TITLE = "Alignment"
# (task, metric) panels; the baselines drawn dashed in each are the ones the rows declare for it
CURVES = [("bli", "p_at_1"), ("bli", "p_at_1_seeded"), ("fake-language", "p_at_1"), ("parallel", "accuracy"),
          ("parallel", "word_alignment"), ("diachronic", "displacement")]


def pair_matrices(rows: pd.DataFrame) -> dict[tuple[str, str, str], pd.DataFrame]:
    """(model, other model, metric) -> layer x other-layer matrix of the model-pair rows."""
    recs = [(m, e["other_model"], met, int(l), int(e["other_layer"]), float(v))
            for m, e, met, l, v in zip(rows["model"], map(decode_extra, rows["extra"]), rows["metric"], rows["layer"],
                                       rows["value"]) if "other_model" in e]
    df = pd.DataFrame(recs, columns=["model", "other", "metric", "i", "j", "value"])
    return {k: g.pivot_table(index="i", columns="j", values="value").sort_index()
            for k, g in df.groupby(["model", "other", "metric"], sort=False)}


def moved_words(rows: pd.DataFrame) -> pd.DataFrame:
    """The diachronic task's listed words (model, layer, word, displacement, noise floor, counts)."""
    out = []
    for m, l, e in zip(rows["model"], rows["layer"], map(decode_extra, rows["extra"])):
        for w in e.get("top_moved", []):
            out.append({"model": m, "layer": int(l), **w})
    return pd.DataFrame(out)


def matrix_plot(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """`plot: align_matrix` for experiments/figures: one model pair's i x j matrix (options: metric,
    model, other; default the first pair)."""
    import plotly.graph_objects as go

    mats = pair_matrices(rows)
    metric = options.get("metric", "cka")
    keys = [k for k in mats if k[2] == metric and options.get("model", k[0]) == k[0]
            and options.get("other", k[1]) == k[1]]
    if not keys:
        raise figures.MissingData(f"nothing to draw for {title!r}: no model-pair rows with metric {metric!r}")
    a, b, _ = keys[0]
    M = mats[keys[0]]
    fig = go.Figure(go.Heatmap(z=M.to_numpy(), x=[str(j) for j in M.columns], y=[str(i) for i in M.index],
                               zmin=0, zmax=1, colorscale="Viridis", colorbar={"title": metric},
                               text=M.round(2).to_numpy(), texttemplate="%{text}"))
    fig.update_layout(title=f"{title}: {a} x {b}", xaxis_title=f"{b} layer", yaxis_title=f"{a} layer",
                      template="plotly_white", height=420)
    drawn = M.stack().rename("value").reset_index().assign(model=a, other=b, metric=metric)
    return figures.Drawn(fig, drawn)


PLOTS = {"align_matrix": matrix_plot}


def render(store) -> None:
    import plotly.graph_objects as go

    rows = probe_rows(store, "align", "Alignment: cross-lingual and cross-model")
    if rows is None:
        return
    view = twin_toggle(rows, "align")
    is_pair = view["extra"].map(lambda e: "other_model" in decode_extra(e))
    panel_curves(view[~is_pair & (view["metric"] != "top_moved_excess")], CURVES, "align")

    mats = pair_matrices(rows)
    if mats:
        st.subheader("Model x model: layer i against layer j")
        pairs = list(dict.fromkeys((a, b) for a, b, _ in mats))
        a, b = st.selectbox("Model pair", pairs, format_func=lambda p: f"{p[0]}  x  {p[1]}", key="align-pair")
        for metric in ("cka", "retrieval", "retrieval_rotation"):
            M = mats.get((a, b, metric))
            if M is None:
                continue
            fig = go.Figure(go.Heatmap(z=M.to_numpy(), x=[str(j) for j in M.columns], y=[str(i) for i in M.index],
                                       zmin=0, zmax=1, colorscale="Viridis", colorbar={"title": metric}))
            fig.update_layout(title=f"{metric}: {a} x {b}", xaxis_title=f"{b} layer", yaxis_title=f"{a} layer",
                              template="plotly_white", height=380)
            st.plotly_chart(fig, width="stretch", key=f"align-heat-{metric}")

    words = moved_words(rows)
    if not words.empty:
        st.subheader("Diachronic: most-moved words (displacement against the noise floor)")
        ui.table(words, "align-moved-words")
