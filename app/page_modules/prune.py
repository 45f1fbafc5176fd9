"""The compression page (`bertology prune`, workbench/drivers/prune_sweep.py): what survives pruning,
quantization and low rank.

- task metric vs sparsity per method (IMP tickets, one-shot, random, reinit, and the pretraining
  tickets imp_mlm: IMP for the masked-LM loss, then fine-tuned; Chen et al. 2020) with the band of
  one standard deviation over seeds, and the full model's mean and band: a method "wins" where its
  mean lies inside the full model's band (Chen et al. 2020);
- accuracy vs bits (fake quantization) and low rank vs magnitude pruning at equal parameter counts;
- metric vs model size (nonzero parameters; bits x parameters for quantized points);
- probe curves per layer of the pruned checkpoints, when a probe ran on the points (the
  experiments/prune/*_probe.yaml experiment runs the syntax probe on every point).

- the surviving-heads matrix of head pruning (app/views/prune_heads.py), when a sweep ran the
  heads_* methods; with `heads.units: mlps | both` one more column per order, the layers' MLPs.

`PLOTS` (prune_vs_sparsity, prune_vs_bits, prune_vs_size, prune_heads_matrix) are the plot kinds of
the shipped figure specs experiments/figures/prune_*.yaml.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from app.axes import clip, unit_axis
from app.fields import row_field
from app.views.prune_heads import PLOTS as HEAD_PLOTS
from app.views.prune_heads import render as render_heads
from workbench.drivers.prune_rows import PROBE, over_seeds, seeded_rows

TITLE = "Compression"
MAKE = "bertology prune experiments/prune/minilm_polarity_cpu.yaml"  # what makes this page's rows
SPARSITY_METHODS = ("imp", "oneshot", "random", "reinit", "imp_mlm")
COLORS = {"imp": "#1f77b4", "oneshot": "#ff7f0e", "random": "#7f7f7f", "reinit": "#9467bd", "imp_mlm": "#17becf",
          "quantize": "#2ca02c", "lowrank": "#d62728", "lowrank_magnitude": "#8c564b"}
DATA_COLUMNS = ["run_id", "model", "task", "split", "metric", "x_name", "x", "value", "low", "high", "seeds"]


def _aggregates(rows: pd.DataFrame, split: str, metric: str = "accuracy") -> pd.DataFrame:
    """Per (run, method, amount) of one split the mean over seeds with its 95% t-interval, sd and
    seeds (metric "accuracy"), or whether a ticket wins (metric "wins": within one sd of the full
    model's mean, Chen et al. 2020): computed from the per-seed rows by the code that prints the
    sweep's table (`workbench.drivers.prune_rows.over_seeds`, through `workbench.store.aggregate`).
    The seed-less rows older runs stored beside them are not read (no seed counts twice)."""
    return over_seeds(rows, split, metric)


def _seeded(rows: pd.DataFrame, split: str) -> pd.DataFrame:
    return seeded_rows(rows, split)


def _missing(title: str, what: str):
    from app.figures import MissingData

    return MissingData(f"nothing to draw for {title!r}: {what} (run bertology prune CONFIG.yaml)")


def _full_band(fig, agg: pd.DataFrame, data: list, x_name: str) -> None:
    full = agg[agg["model"] == "full"]
    if full.empty:
        return
    mean, sd = float(full["value"].iloc[0]), float(full["sd"].iloc[0])
    if np.isfinite(sd):  # the band is clipped to 0..1 (an accuracy's mean +- sd can leave it)
        y0, y1 = clip([mean - sd, mean + sd])
        fig.add_hrect(y0=y0, y1=y1, fillcolor="grey", opacity=0.15, line_width=0)
    fig.add_hline(y=mean, line_dash="dash", line_color="black", annotation_text="full model (mean, ±1 sd)")
    r = full.iloc[0]
    data.append({"run_id": r.get("run_id"), "model": "full", "task": r["task"], "split": r["split"],
                 "metric": r["metric"], "x_name": x_name, "x": 0.0, "value": mean, "low": mean - sd,
                 "high": mean + sd, "seeds": r["seeds"]})


def _curve(fig, g: pd.DataFrame, name: str, x_name: str, data: list, x=None) -> None:
    import plotly.graph_objects as go

    g = g.sort_values("amount")
    x = g["amount"].astype(float) if x is None else x
    sd = g["sd"].fillna(0.0)
    color = COLORS.get(name)
    fig.add_trace(go.Scatter(x=list(x) + list(x)[::-1], y=clip(list(g["value"] + sd) + list(g["value"] - sd)[::-1]),
                             fill="toself", fillcolor=color, opacity=0.15, line_width=0, showlegend=False,
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=g["value"], mode="lines+markers", name=name, line={"color": color}))
    for xi, (_, r) in zip(x, g.iterrows()):
        data.append({"run_id": r.get("run_id"), "model": name, "task": r["task"], "split": r["split"],
                     "metric": r["metric"], "x_name": x_name, "x": float(xi), "value": r["value"],
                     "low": r["value"] - (r["sd"] if np.isfinite(r["sd"]) else 0.0),
                     "high": r["value"] + (r["sd"] if np.isfinite(r["sd"]) else 0.0), "seeds": r["seeds"]})


def _drawn(fig, data: list):
    from app.figures import Drawn

    df = pd.DataFrame(data, columns=DATA_COLUMNS)
    df["value"] = pd.to_numeric(df["value"]).round(10)
    return Drawn(fig, df.sort_values(["model", "x_name", "x"]).reset_index(drop=True))


def prune_vs_sparsity(rows: pd.DataFrame, title: str, options: dict):
    """Task accuracy (mean over seeds, band ±1 sd) vs sparsity of the prunable weights, one line per
    method, and the full model's mean and band."""
    import plotly.graph_objects as go

    agg = _aggregates(rows, options.get("split", "test"))
    methods = options.get("methods") or list(SPARSITY_METHODS)
    sub = agg[agg["model"].isin(methods)]
    if sub.empty:
        raise _missing(title, f"no prune accuracy rows of {methods}")
    fig, data = go.Figure(), []
    _full_band(fig, agg, data, "sparsity")
    for method in methods:
        g = sub[sub["model"] == method]
        if len(g):
            _curve(fig, g, method, "sparsity", data)
    fig.update_layout(title=title, xaxis_title="sparsity of the block matrices (fraction pruned)",
                      yaxis_title=f"{options.get('split', 'test')} accuracy", template="plotly_white",
                      height=460, width=760)
    unit_axis(fig)
    return _drawn(fig, data)


def prune_vs_bits(rows: pd.DataFrame, title: str, options: dict):
    """Accuracy (±1 sd over seeds) vs bits per weight of the fake-quantized block matrices."""
    import plotly.graph_objects as go

    agg = _aggregates(rows, options.get("split", "test"))
    q = agg[agg["model"] == "quantize"]
    if q.empty:
        raise _missing(title, "no quantize rows")
    fig, data = go.Figure(), []
    _full_band(fig, agg, data, "bits")
    _curve(fig, q, "quantize", "bits", data)
    fig.update_layout(title=title, xaxis_title="bits per weight (per-channel symmetric; 1 bit = sign x mean|w|)",
                      yaxis_title=f"{options.get('split', 'test')} accuracy", template="plotly_white",
                      height=420, width=720)
    unit_axis(fig)
    return _drawn(fig, data)


def prune_vs_size(rows: pd.DataFrame, title: str, options: dict):
    """Accuracy vs the numbers a point stores in its block matrices (nonzero weights; for a
    quantized point all its weights x bits / 32, in float32 equivalents), every seed a marker: low rank and
    magnitude pruning at equal parameter counts, tickets and quantization side by side."""
    import plotly.graph_objects as go

    seeded = _seeded(rows, options.get("split", "test"))
    if seeded.empty:
        raise _missing(title, "no prune accuracy rows")
    fig, data = go.Figure(), []
    for method, g in seeded.groupby("model", sort=False):
        size = g["nonzero_prunable"].astype(float)
        if method == "quantize":  # every weight is stored (zeros too), at `bits` bits
            size = g["prunable"].astype(float) * g["bits"].astype(float) / 32.0
        fig.add_trace(go.Scatter(x=size, y=g["value"], mode="markers", name=method,
                                 marker={"color": COLORS.get(method, "black"), "size": 8},
                                 text=[f"{method} {a} seed {s}" for a, s in zip(g["amount"], g["seed"])]))
        for x, (_, r) in zip(size, g.iterrows()):
            data.append({"run_id": r.get("run_id"), "model": method, "task": r["task"], "split": r["split"],
                         "metric": "accuracy", "x_name": "block weights stored (float32 equivalents)", "x": float(x),
                         "value": r["value"], "low": None, "high": None, "seeds": int(r["seed"])})
    fig.update_layout(title=title, xaxis_title="block-matrix numbers stored (nonzero; quantized: x bits/32)",
                      yaxis_title=f"{options.get('split', 'test')} accuracy", xaxis_type="log",
                      template="plotly_white", height=460, width=760)
    unit_axis(fig)
    return _drawn(fig, data)


PLOTS = {"prune_vs_sparsity": prune_vs_sparsity, "prune_vs_bits": prune_vs_bits, "prune_vs_size": prune_vs_size,
         **HEAD_PLOTS}


def render(store) -> None:
    import streamlit as st

    from app import data as app_data
    from app import figures, ui
    from app.views.probe import probe_rows

    rows = probe_rows(store, PROBE, "Compression: tickets, quantization, low rank", command=MAKE)
    if rows is None:
        return
    split = st.radio("Split", ["test", "dev"], horizontal=True, key="prune-split")
    for name, fn, title in (("sparsity", prune_vs_sparsity, "Accuracy vs sparsity"),
                            ("bits", prune_vs_bits, "Accuracy vs bits"),
                            ("size", prune_vs_size, "Accuracy vs stored size")):
        ui.chart(lambda: fn(rows, title, {"split": split}), f"prune-{name}", say_missing=False)
    agg = _aggregates(rows, split)
    wins = _aggregates(rows, split, "wins")
    table = agg[["model", "amount", "value", "sd", "seeds"]].rename(columns={"model": "method", "value": "accuracy"})
    if not wins.empty:
        table = table.merge(wins[["model", "amount", "value"]].rename(columns={"model": "method", "value": "wins"}),
                            on=["method", "amount"], how="left")
    st.subheader("Per method and amount (mean and sd over seeds)")
    ui.table(table, "prune-table")
    if (rows["metric"] == "head_kept").any():  # the heads_* methods' subnetworks (Michel et al. 2019)
        st.subheader("Surviving heads")
        render_heads(rows, key="prune-heads")
    # probe curves of the points: rows of any probe whose model is a point checkpoint
    points = [p for p in row_field(rows, "checkpoint", PROBE) if p]
    names = {str(p).rstrip("/") for p in points}
    probed = []
    for probe in ("syntax",):
        try:
            got = store.query(probe=probe)
        except Exception:  # noqa: BLE001 - no such runs
            continue
        if len(got):
            probed.append(got[got["model"].astype(str).map(lambda m: any(m.endswith(n[-60:]) or n.endswith(m)
                                                                              for n in names))])
    probed = [p for p in probed if len(p)]
    if probed:
        st.subheader("Probe curves of the pruned checkpoints")
        curves = figures.layer_curves(app_data.row_kinds(pd.concat(probed)), "Syntax probes of the points", {})
        curves.figure.update_layout(width=None)
        st.plotly_chart(curves.figure, width="stretch", key="prune-probes")
