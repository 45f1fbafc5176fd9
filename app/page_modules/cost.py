"""The cost page (workbench/cost.py): what every checkpoint under the runs root cost to make, in
the shape of Strubell et al. (2019, Table 3: hardware, hours, kWh x PUE, CO2e), own and along its
lineage, and cost next to what the model knows: a probe score against the checkpoint's total
training compute, in one of two measures (option `flops`): `flops`, the full count (every matmul a
step computes: attention scores and weighted values, the LM/MLM heads, each fine-tuning method's
passes), or `kaplan_flops`, Kaplan et al. (2020)'s C = 6ND (N the non-embedding parameters), the
measure their loss-against-compute laws are drawn in; compare with their figures only in the latter.

Plot kinds for experiments/figures: `cost_table` (the Strubell-shaped table, from the rows
`bertology cost PATH... --record` writes) and `score_vs_flops` (probe rows joined with cost rows
by checkpoint name: best layer's score per checkpoint against its total FLOPs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from app import figures
from app.axes import is_fraction, unit_axis
from app.fields import row_field
from workbench.store.aggregate import aggregate

TITLE = "Cost"
MAKE = "bertology train experiments/train/bert_small.yaml"  # makes checkpoints, this page's rows
COST_METRICS = ("flops", "kaplan_flops", "device_hours", "energy_kwh", "co2e_kg")
# the two compute measures a score can be drawn against (workbench.cost: the full count, Kaplan's 6ND)
FLOPS_MEASURES = {"flops": "training FLOPs (full count)", "kaplan_flops": "6ND (Kaplan et al. 2020)"}


def checkpoints_under(root: str | Path) -> list[Path]:
    """Every checkpoint the workbench made under a runs root: training steps and fine-tuned best/ folders."""
    root = Path(root)
    found = sorted(root.glob("train/*/seed-*/step-*")) + sorted(root.glob("train/*/step-*"))
    found += sorted(root.glob("finetune/*/seed-*/best"))
    return [p for p in found if (p / "config.json").is_file()]


def cost_wide(rows: pd.DataFrame) -> pd.DataFrame:
    """Cost rows (probe "cost") as one line per checkpoint: own and total of each metric, hardware,
    energy source and lineage (the newest run's record of a checkpoint wins)."""
    sub = rows[rows["probe"] == "cost"]
    if sub.empty:
        return pd.DataFrame()
    out = []
    for model, g in sub.groupby("model", sort=False):
        if "run_id" in g:
            g = g[g["run_id"] == g["run_id"].max()]
        first = g.iloc[0]
        line = {"model": model, "family": first["family"], "step": first["step"],
                "hardware": row_field(first, "hardware", "cost") or "unknown",
                "energy": row_field(first, "energy_source", "cost") or "unknown",
                "lineage": " <- ".join(row_field(first, "lineage", "cost") or []) or
                ("(trained elsewhere: no cost record)" if row_field(first, "untracked", "cost") else "(from scratch)")}
        for split in ("own", "total"):
            for m in COST_METRICS:
                v = g[(g["split"] == split) & (g["metric"] == m)]["value"]
                line[f"{split}_{m}"] = float(v.iloc[0]) if len(v) and pd.notna(v.iloc[0]) else None
        out.append(line)
    return pd.DataFrame(out)


def _fmt(v, spec):
    return "unknown" if v is None or (isinstance(v, float) and np.isnan(v)) else format(v, spec)


def cost_table(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """Strubell et al. (2019) Table 3's columns for the models trained here: model, hardware,
    device-hours, kWh (x PUE), CO2e (kg), plus training FLOPs; own cost and the lineage total."""
    import plotly.graph_objects as go

    wide = cost_wide(rows)
    if wide.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no cost rows (bertology cost PATH... --record)")
    part = options.get("part", "total")
    cols = {"Model": wide["model"], "Hardware": wide["hardware"],
            "Training FLOPs": [_fmt(v, ".3g") for v in wide[f"{part}_flops"]],
            "6ND": [_fmt(v, ".3g") for v in wide[f"{part}_kaplan_flops"]],
            "Device-hours": [_fmt(v, ".4f") for v in wide[f"{part}_device_hours"]],
            "kWh·PUE": [_fmt(v, ".3g") for v in wide[f"{part}_energy_kwh"]],
            "CO2e (kg)": [_fmt(v, ".3g") for v in wide[f"{part}_co2e_kg"]],
            "Energy": [e.split(":")[0] for e in wide["energy"]], "Lineage": wide["lineage"]}
    fig = go.Figure(go.Table(
        columnwidth=[3, 2, 1.2, 1.1, 1.1, 1.1, 1.1, 1, 3],
        header={"values": list(cols), "align": "left", "fill_color": "lightgrey", "line_color": "grey",
                "font": {"color": "black", "size": 12}},
        cells={"values": [list(v) for v in cols.values()], "align": "left", "fill_color": "white",
               "line_color": "lightgrey", "font": {"color": "black", "size": 11}, "height": 26}))
    fig.update_layout(title=f"{title} ({part}: {'own + ancestors' if part == 'total' else 'own'})",
                      height=200 + 46 * len(wide), width=1200, margin={"l": 10, "r": 10})
    return figures.Drawn(fig, wide)


def best_scores(rows: pd.DataFrame, task: str | None, metric: str | None) -> pd.DataFrame:
    """Per checkpoint (model): the best layer's value of `metric` on `task` (mean over seeds first;
    layer-less rows count as one layer), baselines and random-init twins left out."""
    from app import data

    sub = rows[rows["probe"] != "cost"]
    if task:
        sub = sub[sub["task"] == task]
    if metric:
        sub = sub[sub["metric"] == metric]
    if not sub.empty:
        sub = sub[~(data.baseline_mask(sub).to_numpy() | data.twin_mask(sub).to_numpy())]
    if sub.empty:
        return pd.DataFrame(columns=["model", "task", "metric", "score", "layer"])
    mean = aggregate(sub.assign(layer=sub["layer"].astype("Float64").fillna(-1)), over="seed",
                     by=["model", "task", "metric", "layer"], interval="none")  # mean over seeds, workbench.store.aggregate
    best = mean.loc[mean.groupby(["model", "task", "metric"], sort=False)["value"].idxmax()]
    best = best.assign(layer=best["layer"].where(best["layer"] >= 0, None))
    return best.rename(columns={"value": "score"})[["model", "task", "metric", "score", "layer"]].reset_index(drop=True)


def score_vs_flops(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """What a model knows against what it cost: best-layer probe score (options task, metric) per
    checkpoint against its total training compute, option `flops` (`FLOPS_MEASURES`: the full count,
    default, or Kaplan's 6ND; log axis; checkpoints at 0, e.g. step 0, drawn at the left edge and
    marked). The axis title names the measure drawn."""
    import plotly.graph_objects as go

    from workbench.errors import ConfigError

    measure = options.get("flops", "flops")
    if measure not in FLOPS_MEASURES:
        raise ConfigError(f"option flops must be one of {', '.join(FLOPS_MEASURES)}, got {measure!r}")
    wide = cost_wide(rows)
    scores = best_scores(rows, options.get("task"), options.get("metric"))
    if wide.empty or scores.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: needs cost rows and probe rows of the same checkpoints")
    if measure != "flops":  # the chosen measure under the one column name the join and the plot read
        wide = wide.drop(columns=["total_flops"]).rename(columns={f"total_{measure}": "total_flops"})
    joined = scores.merge(wide[["model", "total_flops", "family"]], on="model", how="inner")
    joined = joined[joined["total_flops"].notna()]
    if joined.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no probed checkpoint has a known cost")
    positive = joined.loc[joined["total_flops"] > 0, "total_flops"]
    edge = float(positive.min()) / 10 if len(positive) else 1.0
    joined["x"] = joined["total_flops"].where(joined["total_flops"] > 0, edge)
    joined["run"] = [str(m).split("/step-")[0] for m in joined["model"]]
    fig = go.Figure()
    for (run, task, metric), g in joined.sort_values("total_flops").groupby(["run", "task", "metric"], sort=False):
        fig.add_trace(go.Scatter(x=g["x"], y=g["score"], mode="lines+markers", name=f"{run}: {task} {metric}",
                                 text=[f"{m}<br>{f:.3g} {measure}, layer {l}" for m, f, l in
                                       zip(g["model"], g["total_flops"], g["layer"])], hoverinfo="text+y"))
    fig.update_layout(title=title, xaxis_type="log", xaxis_title=f"total {FLOPS_MEASURES[measure]} (0 drawn at {edge:.2g})",
                      yaxis_title="best-layer score", template="plotly_white", height=440, width=760)
    if joined["metric"].map(is_fraction).all():  # accuracy, UUAS, F1, ...: 0..1
        unit_axis(fig)
    return figures.Drawn(fig, joined.drop(columns=["x"]))


PLOTS = {"cost_table": cost_table, "score_vs_flops": score_vs_flops}


def render(store) -> None:
    import streamlit as st

    from app import data, ui
    from workbench.cost import cost_rows

    st.header("Cost of every checkpoint")
    st.caption("FLOPs are analytic (3 x forward matmuls per token, workbench/cost.py); energy is measured (RAPL, "
               "NVML) where the machine exposes a counter, else estimated from a power figure (the Energy column "
               "says which); kWh include the PUE, CO2e the grid intensity recorded in each checkpoint's manifest.")
    found = checkpoints_under(store.root)
    if not found:
        st.info(f"No checkpoints under {store.root} yet: run `{MAKE}` (or `bertology finetune ...`); every "
                f"checkpoint's manifest records its cost.")
        return
    runs = sorted({str(p.relative_to(store.root)).split("/seed-")[0].split("/step-")[0] for p in found})
    chosen = st.multiselect("Training / fine-tuning runs", runs, default=runs, key="cost-runs")
    last_only = st.checkbox("Only the last checkpoint of each seed", value=True, key="cost-last")
    picked = [p for p in found if str(p.relative_to(store.root)).split("/seed-")[0].split("/step-")[0] in chosen]
    if last_only:
        last: dict[Path, Path] = {}
        for p in picked:
            last[p.parent] = p
        picked = list(last.values())
    rows = pd.DataFrame(cost_rows(picked))
    if rows.empty:
        st.info("nothing selected")
        return
    rows["run_id"] = "live"
    part = st.radio("Cost", ["total", "own"], horizontal=True, key="cost-part")
    table = cost_table(rows, "What each checkpoint cost", {"part": part})
    ui.table(table.data, "cost-table")
    st.subheader("What the model knows vs what it cost")
    probes = data.catalog(store)
    probes = data.filter_runs(probes, probes=["syntax", "cloze", "coref", "align"]) if not probes.empty else probes
    if probes.empty:
        st.info("No probe runs yet: probe some of these checkpoints (e.g. bertology probe syntax --checkpoint "
                "runs/train/NAME/seed-0) to draw score against FLOPs.")
        return
    all_rows = pd.DataFrame(cost_rows(found)).assign(run_id="live")
    loaded = ui.cached_query(store, probes)
    ui.show_problems(loaded.problems)
    known = loaded.rows[loaded.rows["model"].isin(set(all_rows["model"]))]
    if known.empty:
        st.info("No probe rows of these checkpoints yet.")
        return
    task = ui.pick("Task", sorted(known["task"].dropna().unique()), key="cost-task")
    metric = ui.pick("Metric", sorted(known.loc[known["task"] == task, "metric"].dropna().unique()), key="cost-metric")
    measure = st.radio("Compute", list(FLOPS_MEASURES), format_func=FLOPS_MEASURES.get, horizontal=True,
                       key="cost-measure",
                       help="full count: every matmul the steps compute; 6ND: Kaplan et al. (2020)'s C = 6 x "
                            "non-embedding parameters x tokens, the measure their compute laws are drawn in")
    drawn = score_vs_flops(pd.concat([all_rows, known], ignore_index=True),
                           f"{task} {metric} vs {FLOPS_MEASURES[measure]}", {"task": task, "metric": metric, "flops": measure})
    drawn.figure.update_layout(width=None)
    st.plotly_chart(drawn.figure, width="stretch", key="cost-score-flops")
    ui.table(drawn.data, "cost-score-table")
