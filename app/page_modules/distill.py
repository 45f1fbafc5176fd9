"""The distillation page (`bertology distill`, workbench/drivers/distill.py): what each student keeps of its
teacher at what size and speed (Hinton et al. 2015; Sanh et al. 2019), and where its layers sit in
the teacher's: test accuracy against parameters and CPU latency (teacher included), the accuracy
kept per point of the sweep, teacher and student probe curves overlaid (syntax runs over both), and
the student x teacher layer CKA matrix (the alignment probe's model-pair rows, Kornblith et al.
2019) with the layer map it implies (each student layer's most similar teacher layer)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from app import figures
from app.axes import unit_axis
from app.fields import row_field
from workbench.store.aggregate import aggregate

PROBE = "distill"  # the producer of the rows (workbench.drivers.distill.PROBE; importing it would pull in torch)

TITLE = "Distillation"
MAKE = "bertology distill experiments/distill/polarity_minilm_cpu.yaml"  # what makes this page's rows


def tradeoff_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per model of a distill run: role, depth, init, T, alpha, test accuracy (mean over
    seeds, min and max), accuracy kept (% of the teacher), parameters, file bytes, latency."""
    out = []
    # over seeds (`workbench.store.aggregate`): the test accuracy's mean and range, the accuracy kept's mean
    acc = _over_seeds(rows[(rows["metric"] == "accuracy") & (rows["split"] == "test")])
    kept = _over_seeds(rows[rows["metric"] == "accuracy_kept"])
    for model, g in rows.groupby("model", sort=False):
        first = g.iloc[0]
        a = acc.loc[model] if model in acc.index else None
        one = lambda m, g=g: float(g[g["metric"] == m]["value"].iloc[0]) if (g["metric"] == m).any() else np.nan  # noqa: E731
        role = row_field(first, "role", PROBE)
        out.append({"model": model, "role": role, "depth": row_field(first, "depth", PROBE),
                    "init": row_field(first, "init", PROBE), "temperature": row_field(first, "temperature", PROBE),
                    "alpha": row_field(first, "alpha", PROBE),
                    "accuracy": float(a["value"]) if a is not None else np.nan,
                    "accuracy_min": float(a["ci_low"]) if a is not None else np.nan,
                    "accuracy_max": float(a["ci_high"]) if a is not None else np.nan,
                    "seeds": int(a["rows"]) if a is not None else 0,
                    "kept_pct": 100 * float(kept.loc[model, "value"]) if model in kept.index else
                    (100.0 if role == "teacher" else np.nan),
                    "parameters": one("parameters"), "file_bytes": one("file_bytes"), "latency_ms": one("latency_ms")})
    return pd.DataFrame(out)


def _over_seeds(rows: pd.DataFrame) -> pd.DataFrame:
    """Per model: mean over seeds with the min-max range (`workbench.store.aggregate`) and the number of rows."""
    out = aggregate(rows, over="seed", by=["model"], interval="minmax")
    return out.assign(rows=rows.groupby("model", sort=False).size().reindex(out["model"]).to_numpy()).set_index("model")


def tradeoff_plot(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """`plot: distill_tradeoff`: test accuracy (mean over seeds, min-max bars) against `options.x`
    (parameters | latency_ms | file_bytes), one marker per point of the sweep, the teacher a star."""
    import plotly.graph_objects as go

    x = options.get("x", "parameters")
    if x not in ("parameters", "latency_ms", "file_bytes"):
        raise figures.MissingData(f"distill_tradeoff: options.x must be parameters, latency_ms or file_bytes, got {x!r}")
    table = tradeoff_table(rows[rows["probe"] == "distill"])
    table = table[table["accuracy"].notna()]
    if table.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no distill accuracy rows")
    fig = go.Figure()
    for (role, init), g in table.groupby(["role", "init"], dropna=False, sort=False):
        label = "teacher" if role == "teacher" else f"students, init {init}"
        fig.add_trace(go.Scatter(
            x=g[x], y=g["accuracy"], mode="markers", name=label,
            marker={"size": 14 if role == "teacher" else 9, "symbol": "star" if role == "teacher" else "circle"},
            error_y={"type": "data", "symmetric": False, "array": g["accuracy_max"] - g["accuracy"],
                     "arrayminus": g["accuracy"] - g["accuracy_min"]},
            text=[f"L{d} T={t} alpha={a}" if r == "student" else "teacher"
                  for d, t, a, r in zip(g["depth"], g["temperature"], g["alpha"], g["role"])],
            hovertemplate="%{text}<br>%{x}<br>accuracy %{y:.4f}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title=x.replace("_", " "), yaxis_title="test accuracy", template="plotly_white",
                      height=440)
    unit_axis(fig)
    return figures.Drawn(fig, table[["model", "role", "depth", "init", "temperature", "alpha", x, "accuracy",
                                     "accuracy_min", "accuracy_max", "seeds"]].rename(columns={x: "x"}))


def temperature_plot(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """`plot: distill_temperature`: the task-distillation grid of one student (options `depth`, `init`;
    default the first present): test accuracy against the temperature T, one line per alpha > 0 (mean
    over seeds, min-max bars), plain cross-entropy (alpha 0, no T) and the teacher as horizontal lines.
    The question of the sweep (Hinton et al. 2015): does a softer teacher distribution help, and how
    much weight should it get?"""
    import plotly.graph_objects as go

    table = tradeoff_table(rows[rows["probe"] == "distill"])
    students = table[(table["role"] == "student") & table["accuracy"].notna()]
    if students.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no distilled students")
    depth = options.get("depth", students["depth"].iloc[0])
    init = options.get("init", students["init"].iloc[0])
    one = students[(students["depth"] == depth) & (students["init"] == init)]
    soft = one[one["alpha"] > 0].sort_values(["alpha", "temperature"])
    if soft.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no alpha > 0 points for depth {depth}, init {init}")
    fig = go.Figure()
    for alpha, g in soft.groupby("alpha", sort=True):
        fig.add_trace(go.Scatter(x=g["temperature"], y=g["accuracy"], mode="lines+markers", name=f"alpha {alpha:g}",
                                 error_y={"type": "data", "symmetric": False, "array": g["accuracy_max"] - g["accuracy"],
                                          "arrayminus": g["accuracy"] - g["accuracy_min"]},
                                 hovertemplate="T %{x}<br>accuracy %{y:.4f}<extra></extra>"))
    ce = one[one["alpha"] == 0]
    if not ce.empty:
        fig.add_hline(y=float(ce["accuracy"].iloc[0]), line_dash="dash", line_color="gray",
                      annotation_text="cross-entropy only (alpha 0)")
    teacher = table[table["role"] == "teacher"]["accuracy"].dropna()
    if len(teacher):
        fig.add_hline(y=float(teacher.iloc[0]), line_dash="dot", line_color="black", annotation_text="teacher")
    fig.update_layout(title=f"{title} (student: {depth} layers, init {init})", xaxis_title="temperature T",
                      yaxis_title="test accuracy", template="plotly_white", height=440)
    unit_axis(fig)
    fig.update_xaxes(type="log", tickvals=sorted(soft["temperature"].unique()))
    data = pd.concat([soft, ce]).rename(columns={"temperature": "x"})
    return figures.Drawn(fig, data[["model", "depth", "init", "x", "alpha", "accuracy", "accuracy_min", "accuracy_max", "seeds"]])


def implied_layer_map(M: pd.DataFrame) -> pd.Series:
    """For each row layer (student) of a layer x layer similarity matrix, the column layer
    (teacher) it is most similar to: the layer mapping the matrix implies."""
    return M.idxmax(axis=1).astype(int)


def layer_map_plot(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """`plot: distill_layer_map`: a student x teacher CKA matrix (model-pair rows of the alignment
    probe; options model = student, other = teacher, default the first pair) with the implied
    layer map marked (each student layer's most similar teacher layer)."""
    import plotly.graph_objects as go

    from app.page_modules.align import pair_matrices

    mats = {}  # (student, teacher, metric) -> matrix, rows = the model with fewer layers (the student)
    for (a, b, metric), M in pair_matrices(rows).items():
        mats[(a, b, metric) if len(M.index) <= len(M.columns) else (b, a, metric)] = (
            M if len(M.index) <= len(M.columns) else M.T.rename_axis(index="i", columns="j"))
    wanted = {options[k] for k in ("model", "other") if k in options}  # either order
    keys = [k for k in mats if k[2] == options.get("metric", "cka") and wanted <= {k[0], k[1]}]
    if not keys:
        raise figures.MissingData(f"nothing to draw for {title!r}: no model-pair CKA rows for {options}")
    student, teacher, metric = keys[0]
    M = mats[keys[0]]
    mapping = implied_layer_map(M)
    fig = go.Figure(go.Heatmap(z=M.to_numpy(), x=[str(j) for j in M.columns], y=[str(i) for i in M.index], zmin=0,
                               zmax=1, colorscale="Viridis", colorbar={"title": metric},
                               text=M.round(2).to_numpy(), texttemplate="%{text}"))
    fig.add_trace(go.Scatter(x=[str(j) for j in mapping.to_numpy()], y=[str(i) for i in mapping.index], mode="markers",
                             name="most similar teacher layer", marker={"symbol": "x", "size": 12, "color": "red"}))
    fig.update_layout(title=f"{title}: {student} x {teacher}", xaxis_title=f"{teacher} layer (teacher)",
                      yaxis_title=f"{student} layer (student)", template="plotly_white", height=440)
    drawn = M.stack().rename("value").reset_index().rename(columns={"i": "student_layer", "j": "teacher_layer"})
    drawn["implied"] = [mapping[i] == j for i, j in zip(drawn["student_layer"], drawn["teacher_layer"])]
    return figures.Drawn(fig, drawn.assign(model=student, other=teacher, metric=metric))


def pretraining_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per model of a pretraining-distillation run (`workbench.drivers.distill_pretraining`, metric
    `heldout_mlm_loss`): role, depth, init, held-out masked-LM loss (mean over seeds, min, max), its
    gap to the teacher's loss on the same held-out batches, and parameters. DistilBERT (Sanh et al.
    2019) is judged by what its student keeps; here the loss gap is that measure before any task."""
    mlm = rows[rows["metric"] == "heldout_mlm_loss"]
    out = []
    loss = _over_seeds(mlm)
    for model, g in mlm.groupby("model", sort=False):
        first = g.iloc[0]
        out.append({"model": model, "role": row_field(first, "role", PROBE), "depth": row_field(first, "depth", PROBE),
                    "init": row_field(first, "init", PROBE),
                    "loss": float(loss.loc[model, "value"]), "loss_min": float(loss.loc[model, "ci_low"]),
                    "loss_max": float(loss.loc[model, "ci_high"]), "seeds": int(g["seed"].notna().sum()) or 1,
                    "parameters": row_field(first, "parameters", PROBE)})
    table = pd.DataFrame(out)
    if table.empty:
        return table
    teacher = table.loc[table["role"] == "teacher", "loss"]
    table["gap_to_teacher"] = table["loss"] - (float(teacher.iloc[0]) if len(teacher) else np.nan)
    return table


def pretraining_plot(rows: pd.DataFrame, title: str, options: dict) -> figures.Drawn:
    """`plot: distill_pretraining_loss`: each student's held-out masked-LM loss (mean over seeds,
    min-max bars) against its parameters, by initialisation (teacher layers or random), the
    teacher a star: the pretraining half of the distillation question (lower is better)."""
    import plotly.graph_objects as go

    table = pretraining_table(rows[rows["probe"] == "distill"])
    if table.empty:
        raise figures.MissingData(f"nothing to draw for {title!r}: no heldout_mlm_loss rows "
                                  "(`bertology distill` with a `pretraining:` config)")
    fig = go.Figure()
    for (role, init), g in table.groupby(["role", "init"], dropna=False, sort=False):
        fig.add_trace(go.Scatter(
            x=g["parameters"], y=g["loss"], mode="markers",
            name="teacher" if role == "teacher" else f"students, init {init}",
            marker={"size": 14 if role == "teacher" else 9, "symbol": "star" if role == "teacher" else "circle"},
            error_y={"type": "data", "symmetric": False, "array": g["loss_max"] - g["loss"],
                     "arrayminus": g["loss"] - g["loss_min"]},
            text=[f"L{d} init {i}" if r == "student" else "teacher" for d, i, r in zip(g["depth"], g["init"], g["role"])],
            hovertemplate="%{text}<br>%{x} parameters<br>held-out MLM loss %{y:.3f}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="parameters", yaxis_title="held-out masked-LM loss",
                      template="plotly_white", height=440)
    return figures.Drawn(fig, table.rename(columns={"parameters": "x"}))


PLOTS = {"distill_tradeoff": tradeoff_plot, "distill_temperature": temperature_plot, "distill_layer_map": layer_map_plot,
         "distill_pretraining_loss": pretraining_plot}


def render(store) -> None:
    import streamlit as st

    from app import ui
    from app.views.probe import probe_rows

    rows = probe_rows(store, "distill", "Distillation: what a student keeps of its teacher", command=MAKE)
    if rows is None:
        return
    table = tradeoff_table(rows)
    st.subheader("Accuracy against size and speed")
    for x in ("parameters", "latency_ms"):
        ui.chart(lambda: tradeoff_plot(rows, f"test accuracy vs {x.replace('_', ' ')}", {"x": x}), f"distill-{x}")
    ui.table(table[table["accuracy"].notna()], "distill-table")
    try:
        drawn = temperature_plot(rows, "test accuracy vs temperature", {})
    except figures.MissingData:
        drawn = None
    if drawn is not None:
        st.subheader("The temperature and the soft targets' weight")
        drawn.figure.update_layout(width=None)
        st.plotly_chart(drawn.figure, width="stretch", key="distill-temperature")
    pretraining = pretraining_table(rows)
    if not pretraining.empty:
        st.subheader("Pretraining distillation: held-out masked-LM loss against parameters")
        drawn = pretraining_plot(rows, "held-out MLM loss vs parameters", {})
        drawn.figure.update_layout(width=None)
        st.plotly_chart(drawn.figure, width="stretch", key="distill-pretraining")
        ui.table(pretraining, "distill-pretraining-table")

    runs = ui.catalog_or_stop(store)
    from app import data

    models = set(rows["model"].dropna())
    st.subheader("Teacher and student probe curves")
    syntax_runs = data.filter_runs(runs, probes=["syntax"])
    loaded = data.query(store, syntax_runs, probe="syntax") if not syntax_runs.empty else None
    curves = loaded.rows[loaded.rows["model"].map(lambda m: any(str(m).startswith(x) or x.endswith(str(m))
                                                                for x in models))] if loaded is not None else None
    if curves is None or curves.empty:
        st.info("No syntax rows of these models yet: `bertology run experiments/distill/probe_students.yaml`.")
    else:
        from app.views.probe import panel_curves

        panel_curves(curves, [("upos", "accuracy"), ("structural-distance", "uuas")], "distill-syntax")
    st.subheader("Student layers against teacher layers (linear CKA)")
    align_runs = data.filter_runs(runs, probes=["align"])
    pairs = data.query(store, align_runs, probe="align").rows if not align_runs.empty else pd.DataFrame()
    if pairs.empty:
        st.info("No model-pair rows yet: `bertology probe align --tasks model-pair --checkpoint TEACHER "
                "--checkpoint STUDENT`.")
        return
    from app.page_modules.align import pair_matrices

    keys = [k for k in pair_matrices(pairs) if k[2] == "cka"]
    if not keys:
        st.info("The alignment runs hold no CKA model-pair rows.")
        return
    a, b, _ = st.selectbox("Model pair", keys, format_func=lambda k: f"{k[0]}  x  {k[1]}", key="distill-pair")
    drawn = layer_map_plot(pairs, "Linear CKA", {"model": a, "other": b})  # rows: the one with fewer layers
    drawn.figure.update_layout(width=None)
    st.plotly_chart(drawn.figure, width="stretch", key="distill-cka")
    implied = drawn.data[drawn.data["implied"]].sort_values("student_layer")
    st.caption("Implied layer map (student layer -> most similar teacher layer): "
               + ", ".join(f"{i} -> {j}" for i, j in zip(implied["student_layer"], implied["teacher_layer"])))
