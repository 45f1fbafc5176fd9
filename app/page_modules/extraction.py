"""The training-data extraction page (probes/extraction/): canary exposure against repetitions and
training step (Carlini et al. 2019), precision of the top-ranked generations per ranking next to the
held-out-text control (Carlini et al. 2021), and k-extractability against repetitions (Carlini et al. 2022).

Its three plot kinds draw experiments/figures/extraction_*.yaml too."""

from __future__ import annotations

import pandas as pd

from app.axes import unit_axis
from app.fields import row_field
from app.figures import Drawn, MissingData, tidy_rows
from workbench.store.aggregate import aggregate

TITLE = "Extraction"


def exposure_vs_repetitions(rows: pd.DataFrame, title: str, options: dict) -> Drawn:
    """Mean exposure per repetition count (min-max bar over the canaries), one line per training step;
    the candidate space's maximum dashed and a random candidate's expectation (1/ln 2) dotted."""
    import numpy as np
    import plotly.graph_objects as go

    sub = rows[(rows["probe"] == "extraction") & (rows["task"] == "exposure") & (rows["metric"] == "exposure")]
    if sub.empty:
        raise MissingData(f"nothing to draw for {title!r}: no exposure rows")
    sub = sub.assign(repetitions=row_field(sub, "repetitions", "extraction").astype(int), step=sub["step"].fillna(-1).astype(int))
    agg = aggregate(sub, over="canary", by=["model", "step", "repetitions"], interval="minmax")
    agg = agg.sort_values(["model", "step", "repetitions"], kind="stable").reset_index(drop=True)
    agg = agg.rename(columns={"value": "mean"})
    fig = go.Figure()
    for (model, step), g in agg.groupby(["model", "step"], sort=False):
        fig.add_trace(go.Scatter(x=g["repetitions"].clip(lower=0.5), y=g["mean"], mode="lines+markers",
                                 name=f"step {step}" if step >= 0 else str(model),
                                 error_y={"type": "data", "symmetric": False, "array": g["max"] - g["mean"],
                                          "arrayminus": g["mean"] - g["min"]}))
    top = float(row_field(sub, "max_exposure", "extraction").max())
    fig.add_hline(y=top, line_dash="dash", line_color="grey", annotation_text=f"max log2|R| = {top:.1f}")
    fig.add_hline(y=1 / np.log(2), line_dash="dot", line_color="grey", annotation_text="random candidate")
    fig.update_layout(title=title, xaxis_title="repetitions in the training split (log; unseen drawn at 0.5)",
                      yaxis_title="exposure (bits)", xaxis_type="log", template="plotly_white", height=440, width=720)
    data = pd.DataFrame({"model": agg["model"], "step": agg["step"], "metric": "exposure (mean)",
                         "task": [f"exposure, repetitions {r}" for r in agg["repetitions"]], "value": agg["mean"],
                         "ci_low": agg["min"], "ci_high": agg["max"], "kind": "model"})  # ci: min-max over canaries
    return Drawn(fig, tidy_rows(data))


def precision_per_ranking(rows: pd.DataFrame, title: str, options: dict) -> Drawn:
    """Grouped bars: precision of the top-n generations per ranking, one group per prompt source, the
    held-out-text control beside them (the last training step when several are stored)."""
    import plotly.graph_objects as go

    sub = rows[(rows["probe"] == "extraction") & (rows["task"] == "samples") & rows["metric"].str.startswith("precision_")]
    if sub.empty:
        raise MissingData(f"nothing to draw for {title!r}: no extraction sample rows")
    if sub["step"].notna().any():
        sub = sub[sub["step"] == sub["step"].max()]
    if options.get("model"):
        sub = sub[sub["model"] == options["model"]]
    fig = go.Figure()
    for metric, g in sub.groupby("metric", sort=False):
        fig.add_trace(go.Bar(x=g["split"], y=g["value"], name=metric.removeprefix("precision_")))
    top_n = row_field(sub, "top_n", "extraction").iloc[0]
    fig.update_layout(title=title, barmode="group", yaxis_title=f"fraction of the top {top_n} with a verbatim span",
                      xaxis_title="prompts (heldout_text: real unseen text, the control)", template="plotly_white",
                      height=420, width=720, yaxis_range=[0, 1])
    return Drawn(fig, tidy_rows(sub.assign(kind="model", task=[f"samples, prompts {x}" for x in sub["split"]])))


def extractable_vs_repetitions(rows: pd.DataFrame, title: str, options: dict) -> Drawn:
    """Fraction k-extractable (95% CI) per repetition bucket, one line per step; held-out windows at 0."""
    import plotly.graph_objects as go

    sub = rows[(rows["probe"] == "extraction") & (rows["task"] == "k_extraction")]
    if sub.empty:
        raise MissingData(f"nothing to draw for {title!r}: no k-extraction rows")
    sub = sub.assign(bucket=row_field(sub, "repetitions", "extraction").astype(str),
                     low=row_field(sub, "repetitions_low", "extraction").astype(int),
                     step=sub["step"].fillna(-1).astype(int)).sort_values(["step", "low"])
    fig = go.Figure()
    for step, g in sub.groupby("step"):
        fig.add_trace(go.Scatter(x=g["bucket"], y=g["value"], mode="lines+markers",
                                 name=f"step {step}" if step >= 0 else "model",
                                 error_y={"type": "data", "symmetric": False, "array": g["ci_high"] - g["value"],
                                          "arrayminus": g["value"] - g["ci_low"]}))
    fig.update_layout(title=title, xaxis_title="occurrences of the window in the training split",
                      yaxis_title="fraction extractable (greedy suffix exact)", template="plotly_white",
                      height=420, width=720)
    unit_axis(fig)
    return Drawn(fig, tidy_rows(sub.assign(kind="model", task=[f"k_extraction, repetitions {b}" for b in sub["bucket"]])))


PLOTS = {"exposure_vs_repetitions": exposure_vs_repetitions, "precision_per_ranking": precision_per_ranking,
         "extractable_vs_repetitions": extractable_vs_repetitions}


def render(store) -> None:
    import streamlit as st

    from app import ui
    from app.views.probe import probe_rows

    rows = probe_rows(store, "extraction", "Training-data extraction")
    if rows is None:
        return
    for kind, fn, what in (("exposure", exposure_vs_repetitions, "Canary exposure vs repetitions (Carlini et al. 2019)"),
                           ("samples", precision_per_ranking, "Extraction precision per ranking (Carlini et al. 2021)"),
                           ("k_extraction", extractable_vs_repetitions, "k-extractability vs repetitions (Carlini et al. 2022)")):
        if (rows["task"] == kind).any():
            st.subheader(what)
            drawn = fn(rows, what, {})
            drawn.figure.update_layout(width=None)
            st.plotly_chart(drawn.figure, width="stretch", key=f"extraction-{kind}")
            ui.table(drawn.data, f"extraction-{kind}-table")
    samples = rows[(rows["task"] == "samples") & (rows["metric"] == "memorised_fraction")]
    if not samples.empty:
        st.subheader("Top generations by zlib ranking")
        for _, r in samples.iterrows():
            longest = row_field(r, "longest_verbatim_run", "extraction")
            st.markdown(f"**{r['model']}**, prompts: {r['split']} (longest verbatim run {longest} tokens)")
            ui.table(pd.DataFrame(row_field(r, "examples", "extraction") or []), f"extraction-examples-{r['model']}-{r['split']}")
