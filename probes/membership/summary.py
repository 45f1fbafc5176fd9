"""The membership run's summary table."""

from __future__ import annotations

import json

import pandas as pd

from probes.core import runner
from probes.core.rows import probe_schema
from probes.membership.settings import CONTROL_TASK

# The `extra` of the membership probe's rows (`probes.membership.tasks`; checked when written, `workbench.store.rowschema`).
EXTRA_SCHEMA = probe_schema("membership", optional={
    "attack": str, "setting": str, "n_members": int, "n_nonmembers": int, "documents": dict, "ci_units": str,
    "scored_by": str | None, "roc_fpr": list, "roc_tpr": list, "sign": str, "fpr": float, "fp_allowed": int,
    "note": str | None, "threshold": str, "n_train": int, "pooling": str, "split": str, "documents_train": dict,
    "what": str})


def _extra(row) -> dict:
    e = row.get("extra")
    return json.loads(e) if isinstance(e, str) else (e if isinstance(e, dict) else {})


def summary(rows: pd.DataFrame) -> str:
    """Per model: the documents behind each group, each attack's AUC [CI over documents] and TPR at
    1% FPR; the layer probe's best layer and the model-free TF-IDF control on the same split."""
    if rows is None or rows.empty:
        return "(no rows)"
    lines = []
    for model, sub in rows.groupby("model", sort=False):
        step = sub["step"].dropna()
        lines.append(f"== {model}" + (f" (step {int(step.iloc[0])})" if len(step) else ""))
        att = sub[sub["layer"].isna() & (sub["task"] != CONTROL_TASK)]
        docs = [_extra(r).get("documents") for _, r in att[att["metric"] == "auc"].iterrows()]
        if docs and docs[0]:
            lines.append(f"attack sample: members from {docs[0]['members']} documents, non-members from "
                         f"{docs[0]['nonmembers']} documents (CIs resample documents)")
        table = [["attack", "AUC", "95% CI", "TPR@1%FPR", "TPR@0.1%FPR", "bal.acc"]]
        for attack, a in att.groupby("task", sort=False):
            get = lambda m, a=a: a[a["metric"] == m]
            auc = get("auc")
            if auc.empty:
                continue
            table.append([attack, f"{auc['value'].iloc[0]:.3f}",
                          f"[{auc['ci_low'].iloc[0]:.3f}, {auc['ci_high'].iloc[0]:.3f}]",
                          f"{get('tpr_fpr_1pct')['value'].iloc[0]:.3f}", f"{get('tpr_fpr_0.1pct')['value'].iloc[0]:.3f}",
                          f"{get('balanced_acc')['value'].iloc[0]:.3f}"])
        if len(table) > 1:
            lines.append(runner.aligned(table))
        lp = sub[(sub["task"] == "layer_probe") & (sub["metric"] == "auc")]
        control = sub[(sub["task"] == CONTROL_TASK) & (sub["metric"] == "auc")]
        if not lp.empty:
            best = lp.loc[lp["value"].idxmax()]
            d = _extra(lp.iloc[0]).get("documents")
            lines.append("layer probe AUC by layer: " + " ".join(f"{v:.3f}" for v in lp.sort_values("layer")["value"])
                         + f" (best layer {int(best['layer'])}; split by document"
                         + (f", test: {d['members']} member / {d['nonmembers']} non-member documents)" if d else ")"))
        for _, c in control.iterrows():
            lines.append(f"model-free TF-IDF control (same split): AUC {c['value']:.3f} "
                         f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}] (a leak of the sample's composition shows here first)")
    return "\n".join(lines)
