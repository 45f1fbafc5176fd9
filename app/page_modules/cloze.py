"""The cloze probe's page (probes/cloze/; Talmor et al. 2020, oLMpics): the zero-shot table across
families (accuracy with its CI next to the majority / random baselines and the nonsense-word
control), layer curves (logit-lens accuracy by layer on the real items and on the nonsense-word
control, linear-probe accuracy by layer), learning curves (mean and
spread per training size, the weighted score), and a live cloze box (a sentence with a blank, a
checkpoint of the cloze runs, top-k at the blank per layer through the logit lens).

`PLOTS["cloze_zero_shot"]` draws experiments/figures/cloze_zero_shot_families.yaml: families x tasks,
zero-shot accuracy with its 95% CI, chance marked.

Several runs may hold the same model and task (a rerun with the lens, say): the page and the
figure read the newest run's row for each (model, task, metric, stack, layer)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from app import data, figures, ui
from app.axes import unit_axis
from app.fields import row_field
from app.views.probe import twin_toggle
from probes.cloze.summary import curve_stats
from probes.cloze.summary import weighted_scores as summary_weighted_scores
from workbench.store.checkpoints import SEED_PREFIX, STEP_PREFIX
from workbench.errors import ConfigError
from workbench.families import FAMILIES

TITLE = "Cloze (oLMpics)"
TABLE_METRICS = ("zero_shot_acc", "nonsense_acc", "majority_acc", "random_acc")
LAYER_METRICS = ("lens_acc", "lens_nonsense_acc", "lens_nonsense_gap", "probe_acc", "control_acc")
LAYER_PLOTTED = ("lens_acc", "lens_nonsense_acc", "probe_acc", "control_acc")  # the gap goes in the table
LINE_DASH = {"lens_nonsense_acc": "dash", "control_acc": "dot"}
# per fine-tuning seed (older runs: curve_acc_mean/sd/max, read as the seeds they summarise)
CURVE_METRICS = ("curve_acc", "curve_acc_mean", "curve_acc_sd", "curve_acc_max", "weighted_score")
BLANK_MARKS = ("<blank>", "[MASK]", "<mask>", "___")
DEFAULT_SENTENCE = "A 41 year old person is [MASK] than me in age, if I am a 33 year old person."


# --------------------------------------------------------------------------- numbers (no streamlit)


def short_model(model: str) -> str:
    """`runs/train/x/seed-0/step-0000500` -> `runs/train/x @500` (the label of a training-folder checkpoint)."""
    return re.sub(rf"/{SEED_PREFIX}\d+/{STEP_PREFIX}0*(\d+)$", r" @\1", str(model))


def newest(rows: pd.DataFrame, metrics) -> pd.DataFrame:
    """Rows of `metrics`, the newest run's row per (model, task, metric, stack, layer) (run ids sort
    by time)."""
    sub = rows[rows["metric"].isin(metrics)]
    if "run_id" in sub:
        sub = sub.sort_values("run_id", kind="stable")
    return sub.drop_duplicates(["model", "task", "metric", "stack", "layer"], keep="last")


def _family_order(df: pd.DataFrame) -> pd.DataFrame:
    rank = {f: i for i, f in enumerate(FAMILIES)}
    return df.assign(_f=df["family"].map(lambda f: rank.get(f, len(rank))))


def results_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (model, task): zero-shot accuracy [95% CI], the nonsense-word control [CI],
    majority and random baselines, the test items, and whether the CI lies above / below chance."""
    sub = newest(rows, TABLE_METRICS)
    out = []
    for (model, task), g in sub.groupby(["model", "task"], sort=False):
        get = {m: g[g["metric"] == m].iloc[0] for m in TABLE_METRICS if (g["metric"] == m).any()}
        if "zero_shot_acc" not in get:
            continue
        zs = get["zero_shot_acc"]
        chance = float(get["random_acc"]["value"]) if "random_acc" in get else np.nan
        line = {"family": zs["family"], "model": short_model(model), "task": task, "n": int(zs["n"]),
                "zero_shot": float(zs["value"]), "zero_shot_ci": _ci(zs),
                "nonsense": float(get["nonsense_acc"]["value"]) if "nonsense_acc" in get else np.nan,
                "nonsense_ci": _ci(get["nonsense_acc"]) if "nonsense_acc" in get else "",
                "majority": float(get["majority_acc"]["value"]) if "majority_acc" in get else np.nan,
                "random": chance,
                "vs_chance": ("above" if zs["ci_low"] > chance else "below" if zs["ci_high"] < chance else "at")
                if np.isfinite(chance) and pd.notna(zs["ci_low"]) else "",
                "methods": ", ".join(row_field(zs, "methods", "cloze") or [])}
        out.append(line)
    cols = ["family", "model", "task", "n", "zero_shot", "zero_shot_ci", "nonsense", "nonsense_ci", "majority",
            "random", "vs_chance", "methods"]
    if not out:
        return pd.DataFrame(columns=cols)
    df = _family_order(pd.DataFrame(out))
    return df.sort_values(["_f", "model", "task"], kind="stable")[cols].reset_index(drop=True)


def _ci(r) -> str:
    return f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if pd.notna(r["ci_low"]) else ""


def layer_table(rows: pd.DataFrame, model: str, task: str) -> pd.DataFrame:
    """Per layer: lens_acc, the lens on the nonsense-word control (lens_nonsense_acc) and the paired
    gap between them (lens_nonsense_gap), probe_acc, control_acc (with CIs) of one model and task;
    the stack says which layers (T5/BART's lens reads the decoder, their probe the chosen stack)."""
    sub = newest(rows[(rows["model"] == model) & (rows["task"] == task) & rows["layer"].notna()], LAYER_METRICS)
    if sub.empty:
        return pd.DataFrame(columns=["metric", "stack", "layer", "value", "ci_low", "ci_high"])
    sub = sub.assign(layer=sub["layer"].astype(int))
    return sub[["metric", "stack", "layer", "value", "ci_low", "ci_high"]].sort_values(
        ["metric", "stack", "layer"]).reset_index(drop=True)


def _newest_run(rows: pd.DataFrame) -> pd.DataFrame:
    """Each (model, task)'s rows of its newest run (run ids sort by time)."""
    if "run_id" not in rows or rows.empty:
        return rows
    newest_id = rows.groupby(["model", "task"], sort=False)["run_id"].transform("max")
    return rows[rows["run_id"] == newest_id]


def curve_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Learning curves: per (model, task, train size) the mean, standard deviation, maximum and
    per-seed test accuracies of the fine-tuned MC head, from each (model, task)'s newest run:
    computed from the per-seed rows (`probes.cloze.summary.curve_stats`, through
    `workbench.store.aggregate`); an older run's stored means are read as its per-seed accuracies."""
    stats = curve_stats(_newest_run(rows[rows["metric"].isin(CURVE_METRICS)]))
    return stats.assign(model=stats["model"].map(short_model),
                        accuracies=stats["accuracies"].map(lambda a: ", ".join(f"{v:.3f}" for v in a))
                        )[["model", "task", "train_size", "mean", "sd", "max", "seeds", "steps", "accuracies"]]


def weighted_scores(rows: pd.DataFrame) -> pd.DataFrame:
    """The weighted score per (model, task) of its newest run: the mean over fine-tuning seeds
    (`probes.cloze.summary.weighted_scores`)."""
    ws = summary_weighted_scores(_newest_run(rows[rows["metric"] == "weighted_score"]))
    return pd.DataFrame({"model": ws["model"].map(short_model), "task": ws["task"],
                         "weighted_score": ws["weighted_score"], "train_sizes": ws["train_sizes"].map(str)}
                        ).reset_index(drop=True)


def checkpoints_of(store, runs: pd.DataFrame) -> list[str]:
    """The checkpoint folders the given runs probed (their manifests, cached), that still exist."""
    found = []
    for run_id in runs["run_id"]:
        m, _ = ui.cached_manifest(store, run_id)
        for ck in (m or {}).get("checkpoints", []) or []:
            path = ck.get("path") if isinstance(ck, dict) else ck
            if path and path not in found and (Path(path) / "config.json").is_file():
                found.append(path)
    return found


def to_blank(sentence: str, mask_token: str | None) -> str:
    """The sentence with its one blank written as `<blank>` (typed as <blank>, [MASK], <mask>, ___ or
    the model's own mask token); ConfigError unless there is exactly one."""
    from workbench.running.lm_inputs import BLANK

    marks = [m for m in dict.fromkeys((*BLANK_MARKS, mask_token)) if m]
    text, n = sentence, 0
    for m in marks:
        n += text.count(m)
        text = text.replace(m, BLANK)
    if n != 1:
        raise ConfigError(f"type exactly one blank ({' or '.join(marks)}); found {n}")
    return text


# --------------------------------------------------------------------------- the figure


def zero_shot_families(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """Families x tasks: zero-shot accuracy (option `metric`, default zero_shot_acc) with its 95%
    bootstrap CI as error bars, one bar per model grouped by task, chance (1/K, `random_acc`)
    marked per task. Models in the backend's family order; random-init twins left out."""
    import plotly.graph_objects as go

    metric = options.get("metric", "zero_shot_acc")
    sub = newest(rows[~data.twin_mask(rows).to_numpy()], [metric, "random_acc"])
    main = sub[sub["metric"] == metric]
    if main.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no {metric} rows")
    tasks = [t for t in options.get("tasks", []) or sorted(main["task"].unique()) if t in set(main["task"])]
    main = _family_order(main[main["task"].isin(tasks)]).sort_values(["_f", "model"], kind="stable")
    fig = go.Figure()
    for model, g in main.groupby("model", sort=False):
        g = g.set_index("task").reindex(tasks)
        fam = g["family"].dropna()
        label = f"{fam.iloc[0] if len(fam) else '?'}: {short_model(model)}"
        fig.add_trace(go.Bar(x=tasks, y=g["value"], name=label,
                             error_y={"type": "data", "symmetric": False, "array": g["ci_high"] - g["value"],
                                      "arrayminus": g["value"] - g["ci_low"], "thickness": 1}))
    chance = sub[sub["metric"] == "random_acc"].groupby("task")["value"].first().reindex(tasks)
    fig.add_trace(go.Scatter(x=tasks, y=chance, mode="markers", name="chance (1/K)",
                             marker={"symbol": "line-ew", "size": 90, "color": "black", "line": {"width": 2, "color": "black"}}))
    fig.update_layout(title=title, barmode="group", yaxis_title=f"{metric} (95% CI)", yaxis_range=[0, 1],
                      template="plotly_white", height=480, width=max(760, 150 * len(tasks) + 220))
    drawn = main.assign(kind="model")
    ref = sub[(sub["metric"] == "random_acc") & sub["task"].isin(tasks)].drop_duplicates("task").assign(
        kind="baseline:chance", model="chance")
    return figures.Drawn(fig, figures.tidy_rows(pd.concat([drawn, ref], ignore_index=True)))


PLOTS = {"cloze_zero_shot": zero_shot_families}


# --------------------------------------------------------------------------- the page


@st.cache_resource(max_entries=2, show_spinner="loading the model")
def _scorer(path: str):
    from app import model_views
    from workbench.running.lm_scores import lm_scorer

    return lm_scorer(model_views.load(path))


def render(store) -> None:
    import plotly.graph_objects as go

    st.header("Cloze probes (oLMpics, Talmor et al. 2020)")
    runs = data.catalog(store)
    runs = data.filter_runs(runs, probes=["cloze"]) if not runs.empty else runs
    if runs.empty:
        ui.no_rows("cloze", ui.probe_command("cloze"), store.root)
        return
    labels = {r: f"{r}  {n or ''}" for r, n in zip(runs["run_id"], runs["name"])}
    with st.expander(f"Runs ({len(runs)} cloze runs; the newest row per model and task is shown)"):
        chosen = st.multiselect("Runs", runs["run_id"].tolist(), default=runs["run_id"].tolist(),
                                format_func=lambda r: labels.get(r, r), key="cloze-runs")
    loaded = data.query(store, runs[runs["run_id"].isin(chosen)], probe="cloze")
    ui.show_problems(loaded.problems)
    rows = loaded.rows
    if rows.empty:
        st.info("No readable cloze rows in this selection.")
        return

    st.subheader("Zero-shot accuracy per family and task")
    rows = twin_toggle(rows, "cloze", default=False)
    table = results_table(rows)
    ui.table(table, "cloze-table")
    if not table.empty:
        drawn = zero_shot_families(rows, "Zero-shot accuracy (95% CI), chance marked", {})
        drawn.figure.update_layout(width=None)
        st.plotly_chart(drawn.figure, width="stretch", key="cloze-zero-shot")

    st.subheader("Layer by layer: logit lens and linear probe")
    st.caption("lens_nonsense_acc: the lens on the same items with nonsense words for the content words "
               "(answers unchanged). A layer that knows something is above chance on the real items and "
               "at chance on the control (lens_nonsense_gap > 0, its paired CI in the table); a layer that "
               "merely prefers a candidate word scores the same on both.")
    per_layer = rows[rows["metric"].isin(LAYER_METRICS) & rows["layer"].notna()]
    if per_layer.empty:
        st.info("These runs hold no per-layer rows (run with --lens or --probe).")
    else:
        model = ui.pick("Model", list(dict.fromkeys(per_layer["model"])), key="cloze-layer-model",
                        format_func=short_model)
        task = ui.pick("Task", sorted(per_layer.loc[per_layer["model"] == model, "task"].unique()), key="cloze-layer-task")
        curve = layer_table(rows, model, task)
        fig = go.Figure()
        for (metric, stack), g in curve[curve["metric"].isin(LAYER_PLOTTED)].groupby(["metric", "stack"], sort=False):
            dash = LINE_DASH.get(metric, "solid")
            if g["ci_low"].notna().all():
                fig.add_trace(go.Scatter(x=np.r_[g["layer"], g["layer"][::-1]], y=np.r_[g["ci_high"], g["ci_low"][::-1]],
                                         fill="toself", line={"width": 0}, opacity=0.15, showlegend=False,
                                         hoverinfo="skip"))
            fig.add_trace(go.Scatter(x=g["layer"], y=g["value"], mode="lines+markers", name=f"{metric} ({stack})",
                                     line={"dash": dash}))
        base = newest(rows[(rows["model"] == model) & (rows["task"] == task)], ["random_acc", "zero_shot_acc"])
        for metric, style in (("random_acc", "dash"), ("zero_shot_acc", "dashdot")):
            v = base.loc[base["metric"] == metric, "value"]
            if len(v):
                fig.add_hline(y=float(v.iloc[0]), line_dash=style, line_color="grey",
                              annotation_text=metric.replace("_acc", ""))
        fig.update_layout(title=f"{short_model(model)}, {task}", xaxis_title="layer", yaxis_title="accuracy",
                          xaxis_dtick=1, template="plotly_white", height=400)
        unit_axis(fig)
        st.plotly_chart(fig, width="stretch", key="cloze-layers")
        ui.table(curve, "cloze-layer-table")

    curves = curve_table(rows)
    if not curves.empty:
        st.subheader("Learning curves (MC head fine-tuned, mean ± sd over seeds)")
        fig = go.Figure()
        for (model, task), g in curves.groupby(["model", "task"], sort=False):
            fig.add_trace(go.Scatter(x=g["train_size"], y=g["mean"], error_y={"type": "data", "array": g["sd"]},
                                     mode="lines+markers", name=f"{model}, {task} (mean ± sd)"))
            fig.add_trace(go.Scatter(x=g["train_size"], y=g["max"], mode="markers", marker={"symbol": "triangle-up"},
                                     name=f"{model}, {task} (max)"))
        fig.update_layout(xaxis_type="log", xaxis_title="training items", yaxis_title="test accuracy",
                          template="plotly_white", height=400)
        unit_axis(fig)
        st.plotly_chart(fig, width="stretch", key="cloze-curves")
        ui.table(curves, "cloze-curve-table")
        ui.table(weighted_scores(rows), "cloze-weighted")

    live_box(store, runs[runs["run_id"].isin(chosen)])


def live_box(store, runs) -> None:
    """Type a sentence with one blank, pick a checkpoint the runs probed: top-k at the blank per
    layer (workbench.running.logit_lens.blank_topk), tokens as the text a person reads (app.model_views.readable_lens)."""
    from app.model_views import TOKEN_NOTE, readable_lens
    from workbench.running.logit_lens import blank_topk

    st.subheader("Live cloze box: top-k at the blank, layer by layer")
    paths = checkpoints_of(store, runs)
    if not paths:
        st.info("None of the checkpoints these runs probed is on disk any more.")
        return
    path = st.selectbox("Checkpoint", paths, index=len(paths) - 1, key="cloze-live-ckpt")
    data.confine(path, data.allowed_roots(store.root))  # the app reads only under its roots
    scorer = _scorer(path)
    sentence = st.text_input("Sentence with one blank ([MASK], <mask>, <blank> or ___)", DEFAULT_SENTENCE,
                             key="cloze-live-text")
    k = st.slider("top k", 1, 10, 5, key="cloze-live-k")
    top = readable_lens(scorer, blank_topk(scorer, to_blank(sentence, scorer.handle.tokenizer.mask_token), k))
    st.caption(TOKEN_NOTE)
    wide = top.assign(cell=[f"{t} ({p:.3f})" for t, p in zip(top["token"], top["prob"])]).pivot(
        index="layer", columns="rank", values="cell")
    st.caption(f"{scorer.kind} head ({type(scorer.model).__name__}): {top.attrs.get('reads', '')}")
    ui.table(wide, "cloze-live-table", hide_index=False)
