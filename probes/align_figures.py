"""Figures of the alignment probe, from its tidy rows alone (the app and static export both call these).

- `layer_figure(rows, task, metrics)`: a metric by layer, one line per model (twins dashed), e.g.
  BLI P@1 with its random-rotation baseline, or parallel-sentence retrieval before/after the map;
- `matrix_figures(rows)`: the i x j heatmaps of the model-pair task (CKA, retrieval), one per pair;
- `moved_words_figure(rows)`: the diachronic task's most-moved words, displacement against the
  split-half noise floor.
"""

from __future__ import annotations

import json

import pandas as pd


def _extra(rows: pd.DataFrame) -> pd.Series:
    return rows["extra"].map(lambda e: json.loads(e) if isinstance(e, str) and e else (e or {}))


def layer_figure(rows: pd.DataFrame, task: str, metrics: tuple[str, ...] = ("p_at_1", "p_at_1_rotation")):
    import plotly.graph_objects as go

    fig = go.Figure()
    sub = rows[(rows["task"] == task) & rows["metric"].isin(metrics)]
    sub = sub[~_extra(sub).map(lambda e: "other_model" in e or e.get("representation") == "static")]
    for (model, metric), g in sub.groupby(["model", "metric"], sort=False):
        g = g.sort_values("layer")
        dash = "dash" if model.endswith("(random init)") else ("dot" if metric != metrics[0] else "solid")
        err = None
        if g["ci_low"].notna().all():
            err = dict(type="data", symmetric=False, array=g["ci_high"] - g["value"], arrayminus=g["value"] - g["ci_low"])
        fig.add_trace(go.Scatter(x=g["layer"], y=g["value"], name=f"{model}: {metric}", mode="lines+markers",
                                 line=dict(dash=dash), error_y=err))
    fig.update_layout(title=f"align / {task}", xaxis_title="layer (0 = embeddings)", yaxis_title="accuracy",
                      yaxis_range=[0, 1])
    return fig


def matrix_figures(rows: pd.DataFrame, metrics: tuple[str, ...] = ("cka", "retrieval")) -> list:
    import plotly.graph_objects as go

    ex = _extra(rows)
    keep = ex.map(lambda e: "other_model" in e) & rows["metric"].isin(metrics)
    sub = rows[keep].assign(other=ex[keep].map(lambda e: e["other_model"]), j=ex[keep].map(lambda e: e["other_layer"]))
    figs = []
    for (a, b, metric), g in sub.groupby(["model", "other", "metric"], sort=False):
        M = g.pivot_table(index="layer", columns="j", values="value")
        fig = go.Figure(go.Heatmap(z=M.values, x=[str(c) for c in M.columns], y=[str(i) for i in M.index],
                                   zmin=0, zmax=1, colorscale="Viridis", text=M.round(2).values,
                                   texttemplate="%{text}"))
        fig.update_layout(title=f"{metric}: {a} x {b}", xaxis_title=f"{b} layer", yaxis_title=f"{a} layer")
        figs.append(fig)
    return figs


def moved_words_figure(rows: pd.DataFrame):
    import plotly.graph_objects as go

    ex = _extra(rows)
    have = rows[ex.map(lambda e: "top_moved" in e)]
    if have.empty:
        return None
    r = have.iloc[0]
    words = _extra(have).iloc[0]["top_moved"]
    fig = go.Figure([go.Bar(x=[w["word"] for w in words], y=[w["displacement"] for w in words], name="displacement"),
                     go.Bar(x=[w["word"] for w in words], y=[w["noise_floor"] for w in words],
                            name="noise floor (split-half, rescaled)")])
    fig.update_layout(title=f"most moved words, {r['model']} layer {int(r['layer'])}", yaxis_title="1 - cos",
                      barmode="group")
    return fig
