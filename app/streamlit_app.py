"""Streamlit app: browse runs in the results store and plot metrics layer by layer.

Reads only the runs root (results store + manifests). Later issues add pages per probe family;
this page is the general browser every one of them builds on.
"""

from __future__ import annotations

import json

import plotly.express as px
import streamlit as st

from workbench.results import ResultsStore

st.set_page_config(page_title="BERTology workbench", layout="wide")
st.title("BERTology workbench")

store = ResultsStore()
runs = store.runs()
st.caption(f"runs root: {store.root}")
if runs.empty:
    st.info("No runs yet. Run `bertology run experiments/main.yaml` to make some.")
    st.stop()

st.subheader("Runs")
st.dataframe(runs, hide_index=True, width="stretch")

run_id = st.selectbox("Run", runs["run_id"].tolist())
rows = store.read(run_id)
task = st.selectbox("Task", sorted(rows["task"].dropna().unique()))
metric = st.selectbox("Metric", sorted(rows.loc[rows["task"] == task, "metric"].dropna().unique()))
view = rows[(rows["task"] == task) & (rows["metric"] == metric)].sort_values("layer")
fig = px.line(view, x="layer", y="value", color="model", line_dash="stack", markers=True,
              error_y=view["ci_high"] - view["value"], error_y_minus=view["value"] - view["ci_low"],
              title=f"{task}: {metric} by layer")
st.plotly_chart(fig, width="stretch")
with st.expander("Manifest: what produced this figure"):
    st.code(json.dumps(store.manifest(run_id), indent=2, default=str), language="json")
st.dataframe(view, hide_index=True, width="stretch")
