"""The coreference run's summary table (`format_summary`)."""

from __future__ import annotations

import pandas as pd

from probes.core import runner
from probes.core.rows import probe_schema
from workbench.store.results import decode_extra

# The `extra` of the coref probe's rows (`probes.coref.tasks`; checked when written, `workbench.store.rowschema`).
EXTRA_SCHEMA = probe_schema("coref", optional={
    "k": int, "span": str, "pooling": str, "n_train": int, "positive_rate": float, "pair_features": str,
    "probe_seed": int, "num_classes": int, "features": str, "train": str, "stop": str, "paper_parallelism_f1": float,
    "data": str, "evaluated": int, "out_of_window": int, "head": int, "criterion": str, "best_head": int,
    "chosen_on": str, "chosen_value": float, "best_layer": int, "candidates": list, "lm_kind": str})


# --------------------------------------------------------------------------- summary
SUMMARY_METRICS = (("gum-pairs", "auc"), ("gum-pairs", "antecedent_accuracy"), ("gum-entity-type", "accuracy"),
                   ("gap", "f1"), ("gap", "bias"), ("attention-heads", "best_head_accuracy"),
                   ("attention-heads", "best_head_accuracy_lenient"), ("attention-heads", "best_head_gap"))


def _peak_lines(rows: pd.DataFrame) -> list[str]:
    """`task metric: peak layer L [low, high]` from the `<metric>_peak_layer` rows (bootstrap of the argmax)."""
    peaks = rows[rows["layer"].isna() & rows["metric"].astype(str).str.endswith("_peak_layer")]
    return [f"  {r['task']:<16} {r['metric'][: -len('_peak_layer')]:<20} peak layer {r['value']:.0f} "
            f"[{r['ci_low']:.0f}, {r['ci_high']:.0f}]" for _, r in peaks.iterrows()]


def _overall_head_lines(rows: pd.DataFrame) -> list[str]:
    """`metric: best head L-H value [low, high] (chosen on <split>)` from the `<metric>_overall` rows."""
    best = rows[rows["layer"].isna() & (rows["task"] == "attention-heads")
                & rows["metric"].astype(str).str.endswith("_overall")]
    lines = []
    for _, r in best.iterrows():
        ex = decode_extra(r["extra"])
        lines.append(f"  attention-heads  {r['metric']:<36} head {ex.get('best_layer')}-{ex.get('best_head')} "
                     f"{r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] on {r['split']}, "
                     f"chosen on {ex.get('chosen_on')}")
    return lines


def format_summary(rows: pd.DataFrame) -> str:
    """Per model: layers x the headline metrics (with the share of bootstrap resamples in which the
    layer is the best, where stored) and the peak layer's CI; then the data-only baselines once."""
    if rows is None or len(rows) == 0:
        return "(no rows)"
    df = rows[rows["layer"].notna()]
    blocks = []
    for (model, stack), sub in df.groupby(["model", "stack"], sort=False, dropna=False):
        cols = [(t, m) for t, m in SUMMARY_METRICS if ((sub["task"] == t) & (sub["metric"] == m)).any()]
        if not cols:
            continue
        layers = sorted(set(sub["layer"].astype(int)))
        table = [["layer"] + [f"{t} {m}" for t, m in cols]]
        for layer in layers:
            cells = [str(layer)]
            for t, m in cols:
                v = sub[(sub["layer"] == layer) & (sub["task"] == t) & (sub["metric"] == m)]
                if v.empty:
                    cells.append("-")
                    continue
                r = v.iloc[0]
                cell = f"{r['value']:.3f}"
                ex = decode_extra(r["extra"])
                if "best_head" in ex:
                    cell += f" (h{ex['best_head']})"
                share = sub[(sub["layer"] == layer) & (sub["task"] == t) & (sub["metric"] == f"{m}_peak_share")]
                if not share.empty:
                    cell += f" [best {share['value'].iloc[0]:.0%}]"
                cells.append(cell)
            table.append(cells)
        mine = rows[(rows["model"] == model) & (rows["stack"] == stack)]
        peaks = _peak_lines(mine) + _overall_head_lines(mine)
        blocks.append(f"== {model} [{stack}]\n" + runner.aligned(table) + ("\n" + "\n".join(peaks) if peaks else ""))
    base = df[df["extra"].map(lambda e: decode_extra(e).get("baseline") not in (None, "random_init"))]
    if not base.empty:
        first = base.sort_values("layer").groupby(["task", "metric"], sort=False).first().reset_index()
        lines = [f"  {r['task']:<16} {r['metric']:<34} {r['value']:.3f}" for _, r in first.iterrows()]
        blocks.append("== data-only baselines\n" + "\n".join(lines))
    return "\n\n".join(blocks)
