"""The cloze run's summary table."""

from __future__ import annotations

import pandas as pd

from probes.cloze.scoring import metric_name
from probes.core import runner


def summary(rows: pd.DataFrame) -> str:
    """Per model and task: zero-shot accuracy [CI], nonsense control, majority/random, and the best
    layer of the lens and of the probe."""
    if rows.empty:
        return "(no rows)"
    lines = []
    header = ["model", "task", "zero-shot [95% CI]", "nonsense", "majority", "random", "lens best (layer)",
              "lens nonsense there", "probe best (layer)", "weighted score"]
    pmi = (rows.metric == metric_name("zero_shot_acc", "pmi")).any()
    if pmi:  # the calibrated rule beside the raw one (probes.cloze.scoring)
        header[4:4] = ["zero-shot PMI [95% CI]", "nonsense PMI"]
    table = [header]
    def one(g, metric, ci=False):
        r = g[g.metric == metric]
        if r.empty:
            return "-"
        r = r.iloc[-1]
        return f"{r.value:.3f} [{r.ci_low:.2f}, {r.ci_high:.2f}]" if ci and pd.notna(r.ci_low) else f"{r.value:.3f}"

    def best(g, metric):
        r = g[g.metric == metric]
        if r.empty:
            return "-"
        r = r.loc[r.value.idxmax()]
        return f"{r.value:.3f} ({int(r.layer)})"

    def at_lens_best(g, rule="raw"):
        lens, ctl = g[g.metric == metric_name("lens_acc", rule)], g[g.metric == metric_name("lens_nonsense_acc", rule)]
        if lens.empty or ctl.empty:
            return "-"
        r = ctl[ctl.layer == lens.loc[lens.value.idxmax(), "layer"]]
        return f"{r.value.iloc[-1]:.3f}" if len(r) else "-"

    for (model, task), g in rows.groupby(["model", "task"], sort=False):
        maj = rows[(rows.task == task) & (rows.metric == "majority_acc")]
        rnd = rows[(rows.task == task) & (rows.metric == "random_acc")]
        line = [model, task, one(g, "zero_shot_acc", True), one(g, "nonsense_acc"),
                f"{maj.value.iloc[0]:.3f}" if len(maj) else "-", f"{rnd.value.iloc[0]:.3f}" if len(rnd) else "-",
                best(g, "lens_acc"), at_lens_best(g), best(g, "probe_acc"), one(g, "weighted_score")]
        if pmi:
            line[4:4] = [one(g, metric_name("zero_shot_acc", "pmi"), True), one(g, metric_name("nonsense_acc", "pmi"))]
        table.append(line)
    lines.append(runner.aligned(table))
    for rule, what in (("raw", "Logit lens"), ("pmi", "Logit lens, PMI-calibrated (content-free template subtracted per layer)")):
        lens = lens_layer_table(rows, rule)
        if len(lens) > 1:
            lines += ["", f"{what} by layer, real items vs the nonsense-word control (gap: paired, 95% CI):",
                      runner.aligned(lens)]
    return "\n".join(lines)


def lens_layer_table(rows: pd.DataFrame, scoring: str = "raw") -> list[list[str]]:
    """Text cells, one line per (model, task, stack, layer) with lens rows: lens_acc [CI],
    lens_nonsense_acc [CI], lens_nonsense_gap [CI] (header first); `scoring` "pmi": their
    calibrated counterparts (lens_pmi_acc, ...)."""
    def cell(r):
        if r is None:
            return "-"
        ci = f" [{r.ci_low:.2f}, {r.ci_high:.2f}]" if pd.notna(r.ci_low) else ""
        return f"{r.value:.3f}{ci}"

    table = [["model", "task", "stack", "layer", "lens [95% CI]", "nonsense control", "lens - control"]]
    names = [metric_name(m, scoring) for m in ("lens_acc", "lens_nonsense_acc", "lens_nonsense_gap")]
    sub = rows[rows.metric.isin(names) & rows.layer.notna()]
    for (model, task, stack, layer), g in sub.groupby(["model", "task", "stack", "layer"], sort=False):
        get = {m: g[g.metric == m].iloc[-1] for m in g.metric.unique()}
        table.append([model, task, str(stack), str(int(layer)), *(cell(get.get(m)) for m in names)])
    return table
