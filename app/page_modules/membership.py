"""The membership-inference page (probes/membership/): ROC curves per attack on log-scale FPR
(Carlini et al. 2022), the AUC / TPR-at-low-FPR table with how many non-members each FPR rests on,
AUC over training steps (memorisation growing), and the layer-wise membership probe."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import data, figures, ui
from app.fields import row_field
from app.views.probe import probe_rows
from workbench.store.checkpoints import STEP_PREFIX

TITLE = "Membership"


def attack_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (model, step, attack): AUC [CI], TPR at 1% / 0.1% FPR and the non-members behind them."""
    att = rows[rows["layer"].isna()]
    out = []
    for (model, step, task), g in att.groupby(["model", "step", "task"], dropna=False, sort=False):
        get = lambda m, g=g: g[g["metric"] == m]
        auc = get("auc")
        if auc.empty:
            continue
        line = {"model": model, "step": step, "attack": task, "auc": auc["value"].iloc[0],
                "auc_ci": f"[{auc['ci_low'].iloc[0]:.3f}, {auc['ci_high'].iloc[0]:.3f}]", "n": auc["n"].iloc[0],
                "scored_by": row_field(auc.iloc[0], "scored_by", "membership")}  # e.g. ELECTRA's generator or discriminator
        for m in ("tpr_fpr_1pct", "tpr_fpr_0.1pct", "balanced_acc"):
            r = get(m)
            line[m] = r["value"].iloc[0] if len(r) else None
            if m.startswith("tpr") and len(r):
                line[m + "_rests_on"] = row_field(r.iloc[0], "note", "membership")
        out.append(line)
    return pd.DataFrame(out)


def render(store) -> None:
    rows = probe_rows(store, "membership", "Membership inference")
    if rows is None:
        return
    models = list(dict.fromkeys(rows.loc[~data.twin_mask(rows).to_numpy(), "model"].dropna()))
    model = ui.pick("Model", models, key="membership-model")
    mine = rows[rows["model"] == model]
    steps = sorted(mine["step"].dropna().unique())
    if len(steps) > 1:
        step = st.select_slider("Training step", steps, value=steps[-1], key="membership-step")
        mine = mine[mine["step"] == step]
    attacks = sorted(mine.loc[mine["layer"].isna(), "task"].unique())
    chosen = st.multiselect("Attacks", attacks, default=[a for a in attacks if not a.startswith(("mink_", "minkpp_"))
                                                         or a.endswith("_20")], key="membership-attacks")
    if chosen:
        roc = figures.roc_curves(mine, f"ROC, {model}", {"attacks": chosen})
        roc.figure.update_layout(width=None)
        st.plotly_chart(roc.figure, width="stretch", key="membership-roc")
    st.subheader("AUC and TPR at low FPR")
    ui.table(attack_table(rows), "membership-table")
    if rows["step"].nunique() > 1:
        st.subheader("Memorisation over training")
        run = str(model).split("/" + STEP_PREFIX)[0]
        over = figures.auc_over_steps(rows[rows["model"].astype(str).str.startswith(run)],
                                      "Membership AUC over training steps", {"attacks": chosen or None})
        over.figure.update_layout(width=None)
        st.plotly_chart(over.figure, width="stretch", key="membership-steps")
    probe = rows[(rows["task"] == "layer_probe") & rows["metric"].isin(["auc"])]
    if not probe.empty:
        st.subheader("Where in depth is membership decodable (linear probe per layer)")
        curves = figures.layer_curves(probe, "Membership probe AUC by layer", {})
        curves.figure.update_layout(width=None)
        st.plotly_chart(curves.figure, width="stretch", key="membership-layers")
