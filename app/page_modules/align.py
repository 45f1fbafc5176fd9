"""The alignment probe's page (Conneau et al. 2018; Kornblith et al. 2019; Hamilton et al. 2016):
P@1 and sentence retrieval by layer with their random-rotation / no-map baselines, the i x j CKA and
Procrustes-retrieval matrices of every model pair, and the diachronic most-moved words against
their noise floor, or, for two communities (`split:` corpora), against a permutation baseline."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import figures, ui
from app.fields import row_field
from app.views.probe import panel_curves, probe_rows, twin_toggle

TITLE = "Alignment"
# (task, metric) panels; the baselines drawn dashed in each are the ones the rows declare for it
CURVES = [("bli", "p_at_1"), ("bli", "p_at_1_seeded"), ("fake-language", "p_at_1"), ("parallel", "accuracy"),
          ("parallel", "word_alignment"), ("diachronic", "displacement"),
          ("model-pair", "top_dim_variance_share")]  # when linear CKA reads one dimension (pair_cka: standardized)


def pair_matrices(rows: pd.DataFrame) -> dict[tuple[str, str, str], pd.DataFrame]:
    """(model, other model, metric) -> layer x other-layer matrix of the model-pair rows."""
    recs = [(m, other, met, int(l), int(j), float(v))
            for m, other, j, met, l, v in zip(rows["model"], row_field(rows, "other_model", "align"),
                                              row_field(rows, "other_layer", "align"), rows["metric"], rows["layer"],
                                              rows["value"]) if other is not None]
    df = pd.DataFrame(recs, columns=["model", "other", "metric", "i", "j", "value"])
    return {k: g.pivot_table(index="i", columns="j", values="value").sort_index()
            for k, g in df.groupby(["model", "other", "metric"], sort=False)}


def moved_words(rows: pd.DataFrame) -> pd.DataFrame:
    """The diachronic task's listed words (model, layer, word, displacement, noise floor, counts)."""
    out = []
    for m, l, moved in zip(rows["model"], rows["layer"], row_field(rows, "top_moved", "align")):
        for w in moved or []:
            out.append({"model": m, "layer": int(l), **w})
    return pd.DataFrame(out)


def matrix_plot(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """`plot: align_matrix` for experiments/figures: one model pair's i x j matrix (options: metric,
    model, other; default the first pair). `mark_best: true` marks each row's highest column: which
    layer of the other model a layer corresponds to (for two models of different depths, give the
    shallower as `model`); the drawn data then say `best` per cell."""
    import plotly.graph_objects as go

    mats = pair_matrices(rows)
    metric = options.get("metric", "cka")
    for (a, b, m), M in list(mats.items()):  # a pair is stored once, in run order: either order may be asked for
        mats.setdefault((b, a, m), M.T.rename_axis(index="i", columns="j"))
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
    if options.get("mark_best"):
        best = M.idxmax(axis=1).astype(int)
        fig.add_trace(go.Scatter(x=[str(j) for j in best.to_numpy()], y=[str(i) for i in best.index], mode="markers",
                                 name=f"most similar {b} layer",
                                 marker={"symbol": "square-open", "size": 30, "color": "red", "line": {"width": 2}}))
        fig.update_layout(height=max(420, 24 * len(M.index) + 160))
        drawn["best"] = [int(best[i]) == int(j) for i, j in zip(drawn["i"], drawn["j"])]
    return figures.Drawn(fig, drawn)


def moved_plot(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """`plot: align_moved` for experiments/figures: the listed most-moved words of one model as bars
    (their z against the permutation baseline when the run had permutations, else displacement minus
    the noise floor), each word's count on both sides beside it. options: model (default the first)."""
    import plotly.graph_objects as go

    words = moved_words(rows)
    if words.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no most-moved words in these rows")
    model = options.get("model", words["model"].iloc[0])
    w = words[words["model"] == model].copy()
    if w.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no most-moved words of model {model!r}")
    has_z = "z" in w and w["z"].notna().all()
    w["score"] = w["z"] if has_z else w["displacement"] - w["noise_floor"]
    w = w.sort_values("score")
    labels = [f"{a} ({o}/{n})" for a, o, n in zip(w["word"], w["count_old"], w["count_new"])]
    fig = go.Figure(go.Bar(x=w["score"], y=labels, orientation="h",
                           customdata=w[["displacement"]].to_numpy(),
                           hovertemplate="%{y}: %{x:.2f} (1 - cos = %{customdata[0]:.3f})<extra></extra>"))
    what = "z against random document splits" if has_z else "displacement - noise floor"
    fig.update_layout(title=f"{title}<br><sup>{model}, layer {int(w['layer'].iloc[0])}</sup>", xaxis_title=what,
                      yaxis_title="word (count in corpus A / B)", template="plotly_white",
                      height=max(320, 22 * len(w) + 120))
    return figures.Drawn(fig, w.drop(columns=["score"]).reset_index(drop=True))


PLOTS = {"align_matrix": matrix_plot, "align_moved": moved_plot}


def render(store) -> None:
    import plotly.graph_objects as go

    rows = probe_rows(store, "align", "Alignment: cross-lingual and cross-model")
    if rows is None:
        return
    view = twin_toggle(rows, "align")
    is_pair = row_field(view, "other_model", "align").notna()
    panel_curves(view[~is_pair & ~view["metric"].isin(["top_moved_excess", "top_moved_z"])], CURVES, "align")

    mats = pair_matrices(rows)
    if mats:
        st.subheader("Model x model: layer i against layer j")
        pairs = list(dict.fromkeys((a, b) for a, b, _ in mats))
        a, b = st.selectbox("Model pair", pairs, format_func=lambda p: f"{p[0]}  x  {p[1]}", key="align-pair")
        for metric in ("cka", "cka_standardized", "retrieval", "retrieval_rotation"):
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
        st.subheader("Diachronic and communities: most-moved words")
        st.caption("Two periods or two communities (`split:` corpora). With permutations, z and p_perm compare each "
                   "word's displacement with the same procedure on random splits of the same documents; "
                   "count_old / count_new are its occurrences on each side.")
        ui.table(words, "align-moved-words")
        for model in words["model"].unique():
            st.plotly_chart(moved_plot(rows, "Most-moved words", {"model": model}).figure, width="stretch",
                            key=f"align-moved-{model}")
