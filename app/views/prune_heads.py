"""The surviving-heads matrix of head pruning (Michel et al. 2019; Prasanna et al. 2020): layer x
head, one panel per order ("good", "random", "bad"), for one model and task.

Reads the rows `workbench.drivers.head_pruning.curve_rows` writes (probe "prune", metric "head_kept":
value 1 where the head survives in the subnetwork at 90% of the full model's metric, `layer` =
block + 1, `extra.head`). Over several seeds a cell is the share of seeds that keep the head, so
heads every seed keeps stand out (Prasanna et al.'s observation: the surviving heads vary between
seeds). When the procedure pruned MLPs too (`heads.units: mlps | both`, Prasanna et al. 2020),
the "mlp_kept" rows add one column, "MLP", to the right of the heads: the share of seeds keeping
that layer's MLP. `surviving_heads_plot` is also a plot kind for `experiments/figures/*.yaml`
(`PLOTS`, listed in the Compression page's `PLOTS`, app/page_modules/prune.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from app.fields import row_field
from workbench.store.aggregate import aggregate
from workbench.drivers.prune_rows import PROBE

ORDER_NAMES = ("good", "random", "bad")


def surviving_heads(rows: pd.DataFrame) -> pd.DataFrame:
    """Tidy table (model, task, order, unit, layer, head, kept, seeds): `kept` = share of seeds
    keeping the head (unit "head") or the layer's MLP (unit "mlp", head -1). Rows other than
    metrics "head_kept" and "mlp_kept" are ignored."""
    r = rows[rows["metric"].isin(["head_kept", "mlp_kept"])].copy()
    if r.empty or not (r["metric"] == "head_kept").any():
        return pd.DataFrame(columns=["model", "task", "order", "unit", "layer", "head", "kept", "seeds"])
    r["order"] = row_field(r, "order", PROBE)
    r["unit"] = ["head" if m == "head_kept" else "mlp" for m in r["metric"]]
    r["head"] = [int(h) if m == "head_kept" else -1 for h, m in zip(row_field(r, "head", PROBE), r["metric"])]
    r["layer"] = r["layer"].astype(int)
    # the share of seeds: the mean over seeds of the 0/1 rows (`workbench.store.aggregate`)
    keys = ["model", "task", "order", "unit", "layer", "head"]
    out = aggregate(r, over="seed", by=keys, interval="none").rename(columns={"value": "kept"})
    # `seeds` counts distinct seeds, not rows: two selected runs of one sweep hold each seed twice
    seeds = r.groupby(keys, sort=False, dropna=False)["seed"].nunique().rename("seeds").reset_index()
    out = out.merge(seeds, on=keys, how="left")[keys + ["kept", "seeds"]]
    return out.sort_values(["model", "task", "order", "unit", "layer", "head"]).reset_index(drop=True)


def mlp_column(table: pd.DataFrame, order: str) -> np.ndarray | None:
    """The [layers] share of seeds keeping each layer's MLP for one order; None when the MLPs were
    not pruned."""
    t = table[(table["order"] == order) & (table["unit"] == "mlp")]
    if t.empty:
        return None
    layers = sorted(table[(table["order"] == order) & (table["unit"] == "head")]["layer"].unique())
    col = np.full(len(layers), np.nan)
    for row in t.itertuples():
        col[layers.index(row.layer)] = row.kept
    return col


def matrix(table: pd.DataFrame, order: str) -> np.ndarray:
    """The [layers, heads] matrix of one order (layers in block order, 1 first)."""
    t = table[(table["order"] == order) & (table["unit"] == "head")]
    layers, heads = sorted(t["layer"].unique()), sorted(t["head"].unique())
    m = np.full((len(layers), len(heads)), np.nan)
    for row in t.itertuples():
        m[layers.index(row.layer), heads.index(row.head)] = row.kept
    return m


def surviving_heads_plot(rows: pd.DataFrame, title: str, options: dict):
    """Heatmaps, one per order present, layer (rows) x head (columns), cell = share of seeds
    keeping the head. options: `model` (default: the first), `task` (default: the first)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from app.figures import Drawn

    from app.figures import MissingData

    table = surviving_heads(rows)
    if table.empty:
        raise MissingData(f"nothing to draw for {title!r}: no head_kept rows (run bertology prune with the "
                          f"heads_good / heads_random / heads_bad methods)")
    model = options.get("model") or sorted(table["model"].unique())[0]
    task = options.get("task") or sorted(table["task"].unique())[0]
    table = table[(table["model"] == model) & (table["task"] == task)]
    orders = [o for o in ORDER_NAMES if o in set(table["order"])]
    def title_of(o):  # removed counts: means over seeds
        mlps = mlp_column(table, o)
        return (f"{o}: {np.nansum(1 - matrix(table, o)):.1f} heads"
                + ("" if mlps is None else f", {np.nansum(1 - mlps):.1f} MLPs") + " removed")

    titles = [title_of(o) for o in orders]
    fig = make_subplots(rows=1, cols=len(orders), subplot_titles=titles, shared_yaxes=True)
    for i, order in enumerate(orders, start=1):
        m = matrix(table, order)
        x = list(range(m.shape[1]))
        mlps = mlp_column(table, order)
        if mlps is not None:  # one more column: the layer's MLP
            m, x = np.hstack([m, mlps[:, None]]), [str(h) for h in x] + ["MLP"]
        fig.add_trace(go.Heatmap(z=m, x=x, y=list(range(1, m.shape[0] + 1)), zmin=0, zmax=1,
                                 colorscale="Blues", showscale=i == len(orders), name=order,
                                 hovertemplate="layer %{y} unit %{x}: kept in %{z:.0%} of seeds<extra></extra>"),
                      row=1, col=i)
        # with the MLP column the x values are labels ("0".."H-1", "MLP"): plotly would read the digits as numbers
        fig.update_xaxes(title_text="head" if mlps is None else "head | MLP", type=None if mlps is None else "category",
                         row=1, col=i)
    fig.update_yaxes(title_text="layer", autorange="reversed", row=1, col=1)
    fig.update_layout(title=f"{title} ({model}, {task}; heads removed: mean over seeds)",
                      height=320 + 20 * int(table["layer"].max()), width=120 + 300 * len(orders))
    data = table.rename(columns={"kept": "value"})
    return Drawn(fig, data.reset_index(drop=True))


PLOTS = {"prune_heads_matrix": surviving_heads_plot}


def render(rows: pd.DataFrame, key: str = "prune-heads") -> None:
    """A section of the pruning page: pick model and task, draw the matrix and list the table."""
    import streamlit as st

    table = surviving_heads(rows)
    if table.empty:
        st.info("No head-pruning rows (metric head_kept) in these runs.")
        return
    model = st.selectbox("Model", sorted(table["model"].unique()), key=f"{key}-model")
    task = st.selectbox("Task", sorted(table[table["model"] == model]["task"].unique()), key=f"{key}-task")
    drawn = surviving_heads_plot(rows, "Surviving heads at 90% of the full model", {"model": model, "task": task})
    st.plotly_chart(drawn.figure, key=f"{key}-chart")
    st.dataframe(drawn.data, key=f"{key}-table")
