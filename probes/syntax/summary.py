"""The syntax run's summary table (`format_layer_table`)."""

from __future__ import annotations

import math

import pandas as pd

from probes.core import runner
from probes.core.rows import probe_schema
from probes.syntax.settings import NAME

# The `extra` of the syntax probe's rows (`probes.syntax.tasks`; checked when written, `workbench.store.rowschema`).
EXTRA_SCHEMA = probe_schema(NAME, optional={
    "treebank": str, "train_split": str, "pooling": str, "probe_seed": int, "n_train": int, "num_classes": int,
    "unseen_eval_labels": int, "pair_features": str, "classifier": str, "uniform_codelength": float,
    "rank": int, "epochs": int, "lr_decay": float, "standardized": bool, "protocol": str,
    "control_task": str})  # control_task: "hewitt_liang_edges" on arc control rows under arc_control hewitt_liang


RANDOM_INIT_SUFFIX = runner.RANDOM_INIT_SUFFIX


# --------------------------------------------------------------------------- summary table
def format_layer_table(rows: pd.DataFrame) -> str:
    """Per-layer summary of a syntax run: one block per checkpoint and stack (twins folded into their checkpoint).

    Columns: layer, UPOS accuracy [95% CI], UPOS selectivity, UUAS, and the baselines: UPOS majority,
    random-init UPOS accuracy, random-init UUAS, linear-chain UUAS. "-" where a task was not run.
    """
    if rows is None or len(rows) == 0:
        return "(no rows)"
    df = rows[(rows["probe"] == NAME) & rows["layer"].notna()]
    df = df[~df["split"].astype(str).str.contains(":")]
    stacks = [s for s in dict.fromkeys(df["stack"].tolist()) if isinstance(s, str)]
    if len(stacks) > 1:  # an encoder-decoder probed on both stacks: one block per stack
        return "\n\n".join(_format_blocks(df[df["stack"] == s], f" [{s}]") for s in stacks)
    return _format_blocks(df, "")


# The printed table's columns (after "layer") and the frame's (`summary_frame`), in order.
COLUMNS = ("UPOS acc", "UPOS sel", "UUAS", "UPOS majority", "rand-init UPOS", "rand-init UUAS", "chain UUAS")


def summary_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """The numbers of the printed table: one row per (checkpoint, stack, layer), twins folded into
    their checkpoint (the `rand-init` columns); `UPOS acc` with its 95% CI (`UPOS acc ci_low/high`)."""
    frames = list(_frames(_per_layer(rows)).values())
    if not frames:
        return pd.DataFrame(columns=["model", "stack", "layer", COLUMNS[0], "UPOS acc ci_low", "UPOS acc ci_high",
                                     *COLUMNS[1:]])
    return pd.concat(frames, ignore_index=True)


def _per_layer(rows: pd.DataFrame) -> pd.DataFrame:
    if rows is None or len(rows) == 0:
        return pd.DataFrame(columns=["probe", "layer", "split", "model", "stack", "task", "metric"])
    df = rows[(rows["probe"] == NAME) & rows["layer"].notna()]
    return df[~df["split"].astype(str).str.contains(":")]


def _series(df: pd.DataFrame, model, task, metric) -> dict:
    sub = df[(df["model"] == model) & (df["task"] == task) & (df["metric"] == metric)]
    return {int(r.layer): r for r in sub.itertuples()}


def _frames(df: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    """(model, stack) -> that checkpoint's table as a frame (one per stack probed)."""
    out = {}
    for stack in dict.fromkeys(df["stack"].tolist()):
        sdf = df[(df["stack"] == stack).fillna(False)] if isinstance(stack, str) else df[df["stack"].isna()]
        for model in [m for m in dict.fromkeys(sdf["model"].tolist()) if not str(m).endswith(RANDOM_INIT_SUFFIX)]:
            twin = model + RANDOM_INIT_SUFFIX
            acc = _series(sdf, model, "upos", "accuracy") or _series(sdf, model, "upos", "mlp_accuracy")
            cols = [acc, _series(sdf, model, "upos", "selectivity") or _series(sdf, model, "upos", "mlp_selectivity"),
                    _series(sdf, model, "structural-distance", "uuas"), _series(sdf, model, "upos", "majority"),
                    _series(sdf, twin, "upos", "accuracy") or _series(sdf, twin, "upos", "mlp_accuracy"),
                    _series(sdf, twin, "structural-distance", "uuas"),
                    _series(sdf, model, "structural-distance", "right_branching_uuas")]
            layers = sorted(set().union(*cols))

            def value(r, field="value"):
                v = None if r is None else getattr(r, field)
                return float("nan") if v is None or pd.isna(v) else float(v)

            data = {"model": model, "stack": stack, "layer": layers, COLUMNS[0]: [value(acc.get(l)) for l in layers],
                    "UPOS acc ci_low": [value(acc.get(l), "ci_low") for l in layers],
                    "UPOS acc ci_high": [value(acc.get(l), "ci_high") for l in layers]}
            data.update({name: [value(c.get(l)) for l in layers] for name, c in zip(COLUMNS[1:], cols[1:])})
            out[(model, stack)] = pd.DataFrame(data)
    return out


def _format_blocks(df: pd.DataFrame, suffix: str) -> str:
    def series(model, task, metric):
        return _series(df, model, task, metric)

    def fmt(r, ci=False):
        if r is None or r.value is None or (isinstance(r.value, float) and math.isnan(r.value)):
            return "-"
        s = f"{r.value:.3f}"
        if ci and pd.notna(r.ci_low) and pd.notna(r.ci_high):
            s += f" [{r.ci_low:.3f},{r.ci_high:.3f}]"
        return s

    def cell(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.3f}"

    models = [m for m in dict.fromkeys(df["model"].tolist()) if not str(m).endswith(RANDOM_INIT_SUFFIX)]
    header = ["layer", "UPOS acc [95% CI]", *COLUMNS[1:]]
    blocks = []
    for frame in _frames(df).values():
        table = [header]
        for r in frame.itertuples(index=False):
            acc, low, high, *rest = r[3:]
            acc_cell = cell(acc) + (f" [{low:.3f},{high:.3f}]" if not (math.isnan(acc) or math.isnan(low)
                                                                      or math.isnan(high)) else "")
            table.append([str(r.layer), acc_cell, *map(cell, rest)])
        blocks.append(f"== {frame['model'].iloc[0]}{suffix}\n" + runner.aligned(table))
    if not blocks:
        return "(no per-layer syntax rows)"
    if len(models) <= MAX_LAYER_BLOCKS:
        return "\n\n".join(blocks)
    # A sweep over many checkpoints: the last one in full, then one line per checkpoint and metric.
    run_ids = df["run_id"].dropna().unique().tolist() if "run_id" in df else []
    show = f"bertology runs show {run_ids[0]}" if len(run_ids) == 1 else "bertology runs show RUN_ID"
    out = [f"(per-layer tables of the other {len(models) - 1} checkpoints: `{show}`)", blocks[-1]]
    for task, metric, label in CHECKPOINT_MATRICES:
        cells = {m: series(m, task, metric) for m in models}
        layers = sorted(set().union(*cells.values()))
        if layers:
            table = [[label + " | layer"] + [str(l) for l in layers]]
            table += [[m] + [fmt(cells[m].get(l)) for l in layers] for m in models]
            out.append(f"== {label} by checkpoint and layer{suffix}\n" + runner.aligned(table))
    return "\n\n".join(out)


MAX_LAYER_BLOCKS = 3  # more checkpoints than this: one matrix per metric instead of a block each
CHECKPOINT_MATRICES = (("upos", "accuracy", "UPOS acc"), ("upos", "selectivity", "UPOS sel"),
                       ("structural-distance", "uuas", "UUAS"), ("structural-depth", "root_acc", "root acc"))
