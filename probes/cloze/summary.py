"""The cloze run's summary table, and the learning curves' statistics over fine-tuning seeds.

The learning curve is stored per fine-tuning seed (`curve_acc` and `weighted_score` rows with
extra `curve_seed`, `probes.cloze.rows`); `curve_stats` and `weighted_scores` compute the mean,
standard deviation and maximum over seeds when the rows are read, through the one seed statistic
`workbench.store.aggregate.aggregate` (the printed table here, the app's cloze page). Runs written
before issue 41 stored `curve_acc_mean/sd/max` with the per-seed accuracies in `extra.accuracies`:
they are read as the per-seed rows they summarise (`curve_rows`), never as one more seed.
"""

from __future__ import annotations

import pandas as pd

from probes.cloze.scoring import SCORING, metric_name
from probes.core import runner
from workbench.store.aggregate import aggregate
from workbench.store.results import decode_extra

CURVE_STATS_COLUMNS = ["model", "task", "train_size", "mean", "sd", "max", "seeds", "steps", "accuracies"]
RULE_LABELS = {"contextual": "contextual", "pmi_dc": "PMI_DC"}  # the calibrated rules' column labels
LENS_LABELS = {"raw": "Logit lens",
               "contextual": "Logit lens, contextual calibration (content-free template subtracted per layer)",
               "pmi_dc": "Logit lens, domain-conditional PMI (answer tokens, domain premise subtracted per layer)"}
# Runs written before issue 49 stored the contextual rule under the name "pmi" (`probes.cloze.scoring`).
LEGACY_METRICS = {metric_name(m, "pmi"): metric_name(m, "contextual")
                  for m in ("zero_shot_acc", "nonsense_acc", "lens_acc", "lens_nonsense_acc", "lens_nonsense_gap")}


def legacy_renamed(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with an older run's "pmi" metrics named as the rule they are, contextual
    (zero_shot_pmi_acc -> zero_shot_contextual_acc; their extra still says scoring "pmi")."""
    return rows.assign(metric=rows["metric"].replace(LEGACY_METRICS)) if len(rows) else rows


def curve_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The per-seed learning-curve rows (metric `curve_acc`) with columns train_size, curve_seed and
    steps from their extra; an older run's `curve_acc_mean` row becomes one row per accuracy of its
    `accuracies` (curve_seed = its position), its `curve_acc_sd` / `curve_acc_max` rows are dropped
    (they are statistics of the same seeds)."""
    cols = [c for c in rows.columns if c != "extra"]
    out = []
    for _, r in rows[rows["metric"].isin(("curve_acc", "curve_acc_mean"))].iterrows():
        e = decode_extra(r["extra"])
        base = {**{c: r[c] for c in cols}, "metric": "curve_acc", "train_size": e.get("train_size"),
                "steps": e.get("steps")}
        if r["metric"] == "curve_acc":
            out.append({**base, "curve_seed": e.get("curve_seed")})
        else:
            out += [{**base, "value": float(a), "curve_seed": i} for i, a in enumerate(e.get("accuracies") or [])]
    return pd.DataFrame(out, columns=[*cols, "train_size", "curve_seed", "steps"])


def curve_stats(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (model, task, train size; and run where rows carry run_id): the mean test accuracy over
    fine-tuning seeds, its standard deviation (population sd, ddof 0: what the probe has always
    printed), maximum, the number of seeds, the steps, and the per-seed accuracies (list, seed order)."""
    per = curve_rows(rows)
    if per.empty:
        return pd.DataFrame(columns=CURVE_STATS_COLUMNS)
    per = per.sort_values("curve_seed", kind="stable")
    by = [c for c in ("run_id", "model", "task") if c in per.columns] + ["train_size"]
    out = aggregate(per, over="curve_seed", by=by, interval="none", ddof=0)
    groups = per.groupby(by, dropna=False, sort=False)  # the same groups in the same order as `aggregate`'s
    out = out.assign(mean=out["value"], seeds=out["count"], steps=groups["steps"].first().to_numpy(),
                     accuracies=list(groups["value"].apply(list)))
    # curves in the order they come, each by increasing size
    curve = out.groupby(by[:-1], dropna=False, sort=False).ngroup()
    out = out.assign(_curve=curve).sort_values(["_curve", "train_size"], kind="stable").reset_index(drop=True)
    return out[[*(["run_id"] if "run_id" in by else []), *CURVE_STATS_COLUMNS]]


def weighted_scores(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (model, task; and run): the weighted score of the learning curve, the mean over fine-tuning
    seeds of each seed's score (`probes.cloze.finetune.weighted_score` is linear in the accuracies,
    so this is the score of the mean curve), with the sizes it weighs and the number of seeds."""
    sub = rows[rows["metric"] == "weighted_score"]
    cols = ["model", "task", "weighted_score", "train_sizes", "seeds"]
    if sub.empty:
        return pd.DataFrame(columns=cols)
    by = [c for c in ("run_id", "model", "task") if c in sub.columns]
    out = aggregate(sub, over="curve_seed", by=by, interval="none")
    sizes = sub.drop_duplicates(by)["extra"].map(lambda e: decode_extra(e).get("train_sizes", ""))
    out = out.assign(weighted_score=out["value"], seeds=out["count"], train_sizes=list(sizes))
    return out[[*(["run_id"] if "run_id" in by else []), *cols]]


def summary(rows: pd.DataFrame) -> str:
    """Per model and task: zero-shot accuracy [CI], nonsense control, majority/random, and the best
    layer of the lens and of the probe."""
    if rows.empty:
        return "(no rows)"
    rows = legacy_renamed(rows)
    lines = []
    header = ["model", "task", "zero-shot [95% CI]", "nonsense", "majority", "random", "lens best (layer)",
              "lens nonsense there", "probe best (layer)", "weighted score"]
    # the calibrated rules the run has, beside the raw one (probes.cloze.scoring)
    rules = [r for r in SCORING[1:] if (rows.metric == metric_name("zero_shot_acc", r)).any()]
    header[4:4] = [c for r in rules for c in (f"zero-shot {RULE_LABELS[r]} [95% CI]", f"nonsense {RULE_LABELS[r]}")]
    table = [header]
    ws = weighted_scores(rows)

    def weighted(model, task):
        v = ws.loc[(ws["model"] == model) & (ws["task"] == task), "weighted_score"]
        return f"{v.iloc[-1]:.3f}" if len(v) else "-"

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
                best(g, "lens_acc"), at_lens_best(g), best(g, "probe_acc"), weighted(model, task)]
        line[4:4] = [c for r in rules for c in (one(g, metric_name("zero_shot_acc", r), True),
                                                 one(g, metric_name("nonsense_acc", r)))]
        table.append(line)
    lines.append(runner.aligned(table))
    for rule, what in LENS_LABELS.items():
        lens = lens_layer_table(rows, rule)
        if len(lens) > 1:
            lines += ["", f"{what} by layer, real items vs the nonsense-word control (gap: paired, 95% CI):",
                      runner.aligned(lens)]
    return "\n".join(lines)


def lens_layer_table(rows: pd.DataFrame, scoring: str = "raw") -> list[list[str]]:
    """Text cells, one line per (model, task, stack, layer) with lens rows: lens_acc [CI],
    lens_nonsense_acc [CI], lens_nonsense_gap [CI] (header first); a calibrated `scoring` R: their
    counterparts (lens_R_acc, ...; an older run's "pmi" rows read as contextual)."""
    def cell(r):
        if r is None:
            return "-"
        ci = f" [{r.ci_low:.2f}, {r.ci_high:.2f}]" if pd.notna(r.ci_low) else ""
        return f"{r.value:.3f}{ci}"

    table = [["model", "task", "stack", "layer", "lens [95% CI]", "nonsense control", "lens - control"]]
    names = [metric_name(m, scoring) for m in ("lens_acc", "lens_nonsense_acc", "lens_nonsense_gap")]
    rows = legacy_renamed(rows)
    sub = rows[rows.metric.isin(names) & rows.layer.notna()]
    for (model, task, stack, layer), g in sub.groupby(["model", "task", "stack", "layer"], sort=False):
        get = {m: g[g.metric == m].iloc[-1] for m in g.metric.unique()}
        table.append([model, task, str(stack), str(int(layer)), *(cell(get.get(m)) for m in names)])
    return table
