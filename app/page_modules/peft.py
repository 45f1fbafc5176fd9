"""The fine-tuning methods page (`bertology peft`, workbench/drivers/peft_sweep.py): test accuracy against the
number of trainable parameters per method (full, head, BitFit, adapters, prompt tuning, LoRA), and
what each method changes layer by layer: the linear CKA of every layer of the fine-tuned model
against the same layer of its starting checkpoint (1 = unchanged up to rotation and scale)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import figures, ui
from app.axes import unit_axis
from app.fields import row_field
from workbench.drivers.peft_sweep import PROBE  # the producer name the sweep's rows carry
from workbench.store.aggregate import aggregate

TITLE = "Fine-tuning methods"
MAKE = "bertology peft experiments/peft/minilm_polarity_cpu.yaml"  # what makes this page's rows
METHOD_ORDER = ("full", "head", "bitfit", "adapter", "prompt", "lora")


def _with_method(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.assign(method=row_field(rows, "method", PROBE), trainable=row_field(rows, "trainable", PROBE))


def _order(methods) -> list[str]:
    return sorted(set(methods), key=lambda m: (METHOD_ORDER.index(m) if m in METHOD_ORDER else 99, m))


def method_table(rows: pd.DataFrame, split: str = "test") -> pd.DataFrame:
    """Per (model, method): trainable parameters, their share of the model, accuracy mean, min and
    max over seeds, and the number of seeds."""
    df = _with_method(rows)
    acc = df[(df["metric"] == "accuracy") & (df["split"] == split) & df["seed"].notna()]
    acc = acc.assign(total=row_field(acc, "total_parameters", PROBE))
    keys = ["model", "method"]
    # means over seeds (workbench.store.aggregate): the accuracy with its range, the parameter counts;
    # joined on the keys (a row without a method must not shift another method's counts)
    over = aggregate(acc, over="seed", by=keys, interval="minmax")
    for c in ("trainable", "total"):
        sizes = aggregate(acc, over="seed", by=keys, interval="none", value=c)[keys + ["value"]]
        over = over.merge(sizes.rename(columns={"value": c}), on=keys, how="left")
    seeds = acc.groupby(keys, dropna=False)["seed"].nunique().rename("seeds").reset_index()
    over = over.merge(seeds, on=keys, how="left")
    out = [{"model": a["model"], "method": a["method"], "trainable": int(a["trainable"]),
            "share_of_model": float(a["trainable"]) / float(a["total"]), "accuracy": float(a["value"]),
            "min": float(a["ci_low"]), "max": float(a["ci_high"]), "seeds": int(a["seeds"])}
           for _, a in over.iterrows() if pd.notna(a["method"])]
    table = pd.DataFrame(out)
    if table.empty:
        return table
    table["rank"] = table["method"].map(lambda m: _order(table["method"]).index(m))
    return table.sort_values(["model", "rank"]).drop(columns="rank").reset_index(drop=True)


def accuracy_vs_parameters(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """One point per method: mean test accuracy over seeds (bars: min to max) against trainable
    parameters on a log axis."""
    import plotly.graph_objects as go

    split = options.get("split", "test")
    table = method_table(rows, split)
    if table.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no per-seed {split} accuracy rows of probe peft")
    fig = go.Figure()
    data = []
    for _, r in table.iterrows():
        label = f"{r['method']}" if table["model"].nunique() == 1 else f"{r['model']} / {r['method']}"
        fig.add_trace(go.Scatter(x=[r["trainable"]], y=[r["accuracy"]], mode="markers+text", text=[r["method"]],
                                 textposition="top center", name=label, marker={"size": 11},
                                 error_y={"type": "data", "symmetric": False, "array": [r["max"] - r["accuracy"]],
                                          "arrayminus": [r["accuracy"] - r["min"]]}))
        data.append({"model": f"{r['model']} / {r['method']}", "task": split, "metric": "accuracy",
                     "value": r["accuracy"], "ci_low": r["min"], "ci_high": r["max"], "kind": "model"})
        data.append({"model": f"{r['model']} / {r['method']}", "task": split, "metric": "trainable_parameters",
                     "value": float(r["trainable"]), "kind": "model"})
    unit_axis(fig)
    fig.update_layout(title=title, xaxis_title="trainable parameters (log)", yaxis_title=f"{split} accuracy",
                      xaxis_type="log", template="plotly_white", height=460, width=760, showlegend=False)
    return figures.Drawn(fig, figures.tidy_rows(pd.DataFrame(data)))


def cka_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Layer x method: CKA of each layer to the start, the mean over seeds (`workbench.store.aggregate`)."""
    cka = _with_method(rows)
    cka = cka[(cka["metric"] == "cka_to_start") & cka["layer"].notna()]
    if cka.empty:
        return pd.DataFrame()
    mean = aggregate(cka, over="seed", by=["layer", "method"], interval="none")
    pivot = mean.pivot(index="layer", columns="method", values="value").sort_index()
    return pivot[_order(pivot.columns)].reset_index()


def cka_lines(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """One line per method: CKA of each layer to the same layer of the starting checkpoint, mean over
    seeds (bars: min to max)."""
    import plotly.graph_objects as go

    df = _with_method(rows)
    cka = df[(df["metric"] == "cka_to_start") & df["layer"].notna()]
    if cka.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no cka_to_start rows of probe peft")
    fig = go.Figure()
    data = []
    for method in _order(cka["method"]):
        for model, g in cka[cka["method"] == method].groupby("model", sort=False):
            agg = aggregate(g, over="seed", by=["layer"], interval="minmax").rename(columns={"value": "mean"})
            agg = agg.sort_values("layer", kind="stable").reset_index(drop=True)
            name = method if cka["model"].nunique() == 1 else f"{model} / {method}"
            fig.add_trace(go.Scatter(x=agg["layer"].astype(int), y=agg["mean"], mode="lines+markers", name=name,
                                     error_y={"type": "data", "symmetric": False, "array": agg["max"] - agg["mean"],
                                              "arrayminus": agg["mean"] - agg["min"]}))
            for _, r in agg.iterrows():
                data.append({"model": f"{model} / {method}", "task": "cka_to_start", "metric": "cka_to_start",
                             "layer": int(r["layer"]), "value": r["mean"], "ci_low": r["min"], "ci_high": r["max"],
                             "kind": "model"})
    fig.update_layout(title=title, xaxis_title="layer (0 = embeddings)", yaxis_title="linear CKA to the start",
                      template="plotly_white", height=460, width=760, yaxis_range=options.get("y_range"))
    return figures.Drawn(fig, figures.tidy_rows(pd.DataFrame(data)))


PLOTS = {"peft_accuracy_vs_parameters": accuracy_vs_parameters, "peft_cka_to_start": cka_lines}


def render(store) -> None:
    st.header("Fine-tuning methods")
    runs = store.runs(probe=[PROBE])
    if runs.empty:
        ui.no_rows(PROBE, MAKE, store.root)
        return
    labels = [f"{r} ({n})" for r, n in zip(runs["run_id"], runs["name"])][::-1]
    chosen = ui.pick("Sweep run", labels, key="peft-run")
    run_id = chosen.split(" ")[0]
    rows = store.read(run_id)
    split = ui.pick("Accuracy on", ["test", "dev"], key="peft-split")
    for key, drawn in (("peft-acc", accuracy_vs_parameters(rows, "Accuracy vs trainable parameters", {"split": split})),
                       ("peft-cka", cka_lines(rows, "What each method changes: CKA of each layer to the start", {}))):
        drawn.figure.update_layout(width=None)
        st.plotly_chart(drawn.figure, width="stretch", key=key)
    st.subheader("Methods")
    ui.table(method_table(rows, split), "peft-table")
    table = cka_table(rows)
    if not table.empty:
        st.subheader("CKA to the start by layer (mean over seeds)")
        ui.table(table, "peft-cka-table")
