"""The fine-tuning page (`bertology finetune`, workbench/drivers/finetune.py): the dev curve per epoch with
its spread over seeds, the test score of the best epoch with its 95% t-interval over seeds next to
the baselines (majority; bag-of-words logistic regression, per-word majority tag, scored as spans
for CoNLL-2002 NER), and the split the run recorded (ids per split, the members a membership
attack must find). Sentence tasks report accuracy, UPOS token accuracy, NER conlleval span F1.

Plot kinds for experiments/figures: `finetune_curves` (dev score per epoch, mean over seeds with
the min-max band, baselines dashed) and `finetune_test` (test score per model with its CI and
the per-seed points, baselines as bars)."""

from __future__ import annotations

import pandas as pd

from app import data, figures
from app.axes import is_fraction, unit_axis
from app.fields import row_field
from workbench.store.aggregate import aggregate, per_unit

TITLE = "Fine-tuning"
MAKE = "bertology finetune experiments/finetune_polarity.yaml --checkpoint PATH_OR_HUB_NAME"  # this page's rows
SCORES = ("span_f1", "accuracy")  # the score a task reports (span tasks: span F1), first found wins


def score_metric(rows: pd.DataFrame) -> str:
    """The run's score metric: span_f1 for span tasks, else accuracy."""
    present = set(rows["metric"].dropna())
    for m in SCORES:
        if m in present:
            return m
    raise figures.MissingData("no fine-tuning score rows (accuracy or span_f1)")


def epoch_curve(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (task, model, epoch): mean, min, max and sd of the dev score over seeds, and how many seeds."""
    cur = rows[(rows["metric"] == f"{metric}_epoch") & (rows["split"] == "dev")].copy()
    if cur.empty:
        return pd.DataFrame(columns=["task", "model", "epoch", "mean", "low", "high", "sd", "seeds"])
    cur["epoch"] = [int(e) for e in row_field(cur, "epoch", "finetune")]
    out = aggregate(cur, over="seed", by=["task", "model", "epoch"], interval="minmax")
    out = out.rename(columns={"value": "mean", "ci_low": "low", "ci_high": "high", "count": "seeds"})
    out = out.sort_values(["task", "model", "epoch"], kind="stable").reset_index(drop=True)
    return out[["task", "model", "epoch", "mean", "low", "high", "sd", "seeds"]]


def score_table(rows: pd.DataFrame, metric: str, split: str = "test") -> pd.DataFrame:
    """One line per (task, model) on `split`: the mean over seeds with its 95% t-interval, the
    per-seed scores, and the baselines (family "baseline") with their own score."""
    sub = rows[(rows["metric"] == metric) & (rows["split"] == split)]
    out = []
    for (task, model), g in sub.groupby(["task", "model"], sort=False):
        seeded = g[g["seed"].notna()]
        # the mean over seeds and its Student-t 95% interval from the per-seed rows
        # (`workbench.store.aggregate`); the seed-less mean runs written before issue 41 also stored
        # is not read (`per_unit`), a baseline's own seed-less row is
        agg = aggregate(seeded, over="seed", by=["task", "model"], interval="t") if len(seeded) else per_unit(g)
        if agg.empty:
            continue
        is_base = (g["family"] == "baseline").all()
        line = {"task": task, "model": model, "kind": "baseline" if is_base else "fine-tuned",
                "score": float(agg["value"].iloc[0]),
                "ci_low": float(agg["ci_low"].iloc[0]) if pd.notna(agg["ci_low"].iloc[0]) else None,
                "ci_high": float(agg["ci_high"].iloc[0]) if pd.notna(agg["ci_high"].iloc[0]) else None,
                "seeds": len(seeded) if not is_base else None,
                "per_seed": ", ".join(f"{v:.4f}" for v in seeded["value"]) if not is_base else "",
                "n": int(g["n"].dropna().iloc[0]) if g["n"].notna().any() and is_base else
                (int(seeded["n"].dropna().iloc[0]) if seeded["n"].notna().any() else None)}
        out.append(line)
    return pd.DataFrame(out)


def split_summary(manifest: dict | None) -> pd.DataFrame:
    """The recorded split (the results manifest's `splits` note): per split, how many ids and the first ones."""
    note = ((manifest or {}).get("notes") or {}).get("splits") or {}
    ids = note.get("ids") or {}
    return pd.DataFrame([{"split": s, "examples": len(v), "first ids": ", ".join(map(str, v[:5])),
                          "split_seed": note.get("split_seed")} for s, v in ids.items()])


def finetune_curves(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """Dev score per epoch: one line per fine-tuned model (mean over seeds, min-max band over seeds),
    each baseline's dev score as a dashed line."""
    import plotly.graph_objects as go

    metric = options.get("metric") or score_metric(rows)
    curve = epoch_curve(rows, metric)
    if curve.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no {metric}_epoch rows")
    fig = go.Figure()
    for (task, model), g in curve.groupby(["task", "model"], sort=False):
        name = f"{model} ({task})" if curve["task"].nunique() > 1 else str(model)
        fig.add_trace(go.Scatter(x=list(g["epoch"]) + list(g["epoch"])[::-1], y=list(g["high"]) + list(g["low"])[::-1],
                                 fill="toself", line={"width": 0}, opacity=0.2, showlegend=False, hoverinfo="skip",
                                 name=f"{name} seed range"))
        fig.add_trace(go.Scatter(x=g["epoch"], y=g["mean"], mode="lines+markers",
                                 name=f"{name}, mean of {int(g['seeds'].max())} seeds"))
    base = score_table(rows, metric, "dev")
    drawn = [curve.assign(kind="model")]
    for _, b in base[base["kind"] == "baseline"].iterrows():
        fig.add_hline(y=b["score"], line_dash="dash", line_color="grey", annotation_text=f"{b['model']} (dev)",
                      annotation_position="bottom right")
        drawn.append(pd.DataFrame([{"task": b["task"], "model": b["model"], "mean": b["score"], "kind": "baseline"}]))
    fig.update_layout(title=title, xaxis_title="epoch", yaxis_title=f"dev {metric}", template="plotly_white",
                      height=420, width=760, xaxis={"dtick": 1})
    if is_fraction(metric):  # accuracy, span F1: 0..1
        unit_axis(fig)
    return figures.Drawn(fig, pd.concat(drawn, ignore_index=True))


def finetune_test(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """Test score of the best dev epoch per model: mean over seeds with its 95% t-interval and the
    seeds as points; baselines as grey bars."""
    import plotly.graph_objects as go

    metric = options.get("metric") or score_metric(rows)
    table = score_table(rows, metric, options.get("split", "test"))
    if table.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no test {metric} rows")
    table["label"] = [f"{m} ({t})" if table["task"].nunique() > 1 else str(m) for m, t in zip(table["model"], table["task"])]
    fig = go.Figure()
    base = table[table["kind"] == "baseline"]
    tuned = table[table["kind"] != "baseline"]
    fig.add_trace(go.Bar(x=base["label"], y=base["score"], marker_color="lightgrey", name="baselines"))
    err_hi = (tuned["ci_high"] - tuned["score"]).fillna(0)
    err_lo = (tuned["score"] - tuned["ci_low"]).fillna(0)
    fig.add_trace(go.Bar(x=tuned["label"], y=tuned["score"], name="fine-tuned (mean over seeds, 95% t-CI)",
                         error_y={"type": "data", "symmetric": False, "array": err_hi, "arrayminus": err_lo}))
    for _, t in tuned.iterrows():
        seeds = [float(v) for v in t["per_seed"].split(", ") if v]
        fig.add_trace(go.Scatter(x=[t["label"]] * len(seeds), y=seeds, mode="markers", marker={"color": "black", "size": 6},
                                 showlegend=False, name="seeds"))
    fig.update_layout(title=title, yaxis_title=f"test {metric}", template="plotly_white", height=420, width=760)
    if is_fraction(metric):
        unit_axis(fig)
    return figures.Drawn(fig, table)


PLOTS = {"finetune_curves": finetune_curves, "finetune_test": finetune_test}


def render(store) -> None:
    import streamlit as st

    from app import ui
    from app.views.probe import select_rows

    st.header("Fine-tuning")
    runs = data.catalog(store)
    runs = data.filter_runs(runs, probes=["finetune"]) if not runs.empty else runs
    if runs.empty:  # any task: --task sentence_polarity, conll2002_es, upos, ...
        ui.no_rows("finetune", MAKE, store.root)
        return
    rows = select_rows(store, runs, "finetune", key="finetune")
    if rows is None:
        return
    tasks = sorted(rows["task"].dropna().unique())
    task = ui.pick("Task", tasks, key="finetune-task")
    sub = rows[rows["task"] == task]
    metric = score_metric(sub)
    st.caption(f"score: {metric} ({'conlleval span F1' if metric == 'span_f1' else 'accuracy'}); the test score "
               f"is the best dev epoch's; intervals are Student-t 95% over seeds")
    for name, fn in (("Dev score per epoch (seed range shaded)", finetune_curves),
                     ("Test score with 95% CI over seeds, next to the baselines", finetune_test)):
        st.subheader(name)
        ui.chart(lambda: fn(sub, f"{task}: {name.split(' (')[0].lower()}", {"metric": metric}), f"finetune-{fn.__name__}")
    st.subheader("Test and dev scores")
    ui.table(pd.concat([score_table(sub, metric, "test").assign(split="test"),
                        score_table(sub, metric, "dev").assign(split="dev")], ignore_index=True), "finetune-table")
    st.subheader("The recorded split")
    for run_id in sub["run_id"].dropna().unique():
        manifest, problems = ui.cached_manifest(store, run_id)
        ui.show_problems(problems)
        summary = split_summary(manifest)
        if summary.empty:
            st.info(f"run {run_id} recorded no split")
            continue
        st.caption(f"run {run_id}: every id per split is in its manifest (notes.splits) and in "
                   f"{(manifest.get('notes') or {}).get('folder', '?')}/splits.json")
        ui.table(summary, f"finetune-split-{run_id}")
