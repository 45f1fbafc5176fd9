"""The prune sweep's result rows and their summary over seeds (`bertology prune`,
`workbench.drivers.prune_sweep`), in a module without torch so the app's Compression page reads
them with the same code that prints the sweep's table.

Stored: per seed and split one `accuracy` row per point (extra: method, amount, sparsity, bits,
rank, parameter counts, mask hash, checkpoint, ...; `build_rows`), beside the head-pruning rows
(`workbench.drivers.head_pruning.curve_rows`). Nothing seed-less: the mean over seeds, its 95%
Student-t interval and sd, and whether a ticket "wins" (Chen et al. 2020: its mean within one sd
over seeds of the full model's mean) are computed when the rows are read (`over_seeds`), through
the one seed statistic `workbench.store.aggregate.aggregate`. Runs written before issue 41 also
stored those as seed-less rows (extra `{"over": "seeds", ...}`); they are left out when read
(`seeded_rows` takes the rows with a seed), so no seed counts twice.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.store.aggregate import aggregate
from workbench.store.results import decode_extra
from workbench.store.rowschema import RowSchema

PROBE = "prune"
# methods whose points are retrained tickets: the ones `wins` is computed for (Chen et al. 2020)
RETRAINED = ("imp", "oneshot", "random", "reinit", "imp_mlm")
# The `extra` of every row of the producer "prune" (checked by the results store,
# `workbench.store.rowschema`): a sweep's points (`build_rows`) and the head-pruning curves and
# re-fine-tuned subnetworks (`workbench.drivers.head_pruning.curve_rows`, experiments/prune_heads.py;
# a sweep adds its name, `sweep`). A statistic over seeds is not a row (a seed-less row with `over`,
# `sd`, `seeds` fails at write time).
POINT_KEYS = {"amount": float, "sparsity": float, "bits": int, "scheme": str, "quantized_parameters": int,
              "rank": int, "round": int, "rewind_step": int, "from_step": int, "parameters": int, "prunable": int,
              "nonzero_parameters": int, "nonzero_prunable": int, "sparsity_measured": float, "mask_sha256": str,
              "checkpoint": str, "n_heads_kept": int, "n_heads": int, "order": str, "pruning_step": int,
              "mlm_steps": int, "n_mlps_kept": int, "n_mlps": int, "units": str}
EXTRA_SCHEMAS = (
    RowSchema(PROBE, "per seed", required={"sweep": str}, optional=POINT_KEYS),
    RowSchema(PROBE, "head pruning curve", required={"method": str, "order": str, "n_heads": int},
              optional={"units": str, "pruning_step": int, "n_removed": int, "n_mlps_removed": int, "threshold": float,
                        "full": float, "subnetwork": str, "at": str, "head": int, "sweep": str}),
    RowSchema(PROBE, "re-fine-tuned subnetwork", required={"method": str, "order": str, "n_kept": int, "checkpoint": str}),
)
SUMMARY_COLUMNS = ["run_id", "model", "task", "split", "metric", "value", "ci_low", "ci_high", "amount", "sd",
                   "seeds", "sparsity_measured", "full_mean", "full_sd"]


def build_rows(points: list[dict], task: str, family: str, run_name: str) -> list[dict]:
    """The results rows of a sweep: per point (one method, amount and seed) and split its accuracy."""
    common = {"family": family, "probe": PROBE, "task": task}
    rows = []
    for p in points:
        extra = {k: p.get(k) for k in POINT_KEYS if p.get(k) is not None}
        extra["sweep"] = run_name
        for split in ("dev", "test"):
            rows.append({**common, "model": p["method"], "seed": p["seed"], "split": split, "metric": "accuracy",
                         "value": p[split]["accuracy"], "n": p[split]["n"], "extra": extra})
    return rows


def seeded_rows(rows: pd.DataFrame, split: str) -> pd.DataFrame:
    """The per-seed accuracy rows of one split with their extras unpacked (amount, bits, nonzero,
    parameters, prunable, nonzero_prunable, sparsity_measured); an older run's seed-less rows are
    not among them."""
    sub = rows[(rows["probe"] == PROBE) & rows["seed"].notna() & (rows["split"] == split) & (rows["metric"] == "accuracy")]
    extras = [decode_extra(e) for e in sub["extra"]]
    return sub.assign(amount=[e.get("amount") for e in extras], bits=[e.get("bits") for e in extras],
                      nonzero=[e.get("nonzero_parameters") for e in extras],
                      parameters=[e.get("parameters") for e in extras],
                      prunable=[e.get("prunable") for e in extras],
                      nonzero_prunable=[e.get("nonzero_prunable") for e in extras],
                      sparsity_measured=[e.get("sparsity_measured") for e in extras]).reset_index(drop=True)


def over_seeds(rows: pd.DataFrame, split: str = "test", metric: str = "accuracy") -> pd.DataFrame:
    """Per (run, task, method, amount) of one split, from the per-seed rows (`aggregate`):

    metric "accuracy": value = the mean accuracy over seeds, ci_low/ci_high its 95% Student-t
    interval, sd (ddof 1; NaN for one seed), seeds, sparsity_measured (its mean over seeds, 0 where
    a point records none);
    metric "wins" (retrained methods, where the full model has more than one seed): value 1.0 when
    the mean lies within one sd of the full model's mean (mean >= full_mean - full_sd, Chen et al.
    2020), else 0.0, with full_mean and full_sd. Groups keep the order of the rows."""
    if metric not in ("accuracy", "wins"):
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    seeded = seeded_rows(rows, split)
    seeded = seeded[seeded["amount"].notna()]
    if seeded.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    seeded = seeded.assign(amount=seeded["amount"].astype(float),
                           sparsity_measured=seeded["sparsity_measured"].astype(float).fillna(0.0))
    if "task" not in seeded.columns:
        seeded = seeded.assign(task=None)
    runs = [c for c in ("run_id", "task") if c in seeded.columns]  # a sweep's full model is its own run's
    by = [*runs, "model", "amount"]
    acc = aggregate(seeded, over="seed", by=by, interval="t")
    sparsity = aggregate(seeded, over="seed", by=by, interval="none", value="sparsity_measured")
    acc = acc.assign(split=split, metric="accuracy", seeds=acc["count"], sparsity_measured=sparsity["value"].to_numpy())
    if metric == "accuracy":
        return acc[[c for c in SUMMARY_COLUMNS if c in acc.columns]]
    full = aggregate(seeded[seeded["model"] == "full"], over="seed", by=runs, interval="sd")
    full = full[full["count"] > 1].rename(columns={"value": "full_mean", "sd": "full_sd", "ci_low": "full_low"})
    wins = acc[acc["model"].isin(RETRAINED)]
    wins = wins.merge(full[[*runs, "full_mean", "full_sd", "full_low"]], on=runs, how="inner")
    wins = wins.assign(metric="wins", value=(wins["value"] >= wins["full_low"]).astype(float),
                       ci_low=np.nan, ci_high=np.nan)
    return wins[[c for c in SUMMARY_COLUMNS if c in wins.columns]].reset_index(drop=True)


def format_table(rows) -> str:
    """Mean test accuracy by method and amount, with the sd over seeds and whether a ticket wins
    (`over_seeds`, from the per-seed rows)."""
    df = pd.DataFrame(rows)
    acc, wins = over_seeds(df, "test"), over_seeds(df, "test", "wins")
    won = {(m, a): v for m, a, v in zip(wins["model"], wins["amount"], wins["value"])}
    lines = [f"{'method':<18} {'amount':>7} {'sparsity':>8} {'test acc':>9} {'sd':>7} {'wins':>5}"]
    for _, r in acc.iterrows():
        w = won.get((r["model"], r["amount"]))
        lines.append(f"{r['model']:<18} {r['amount']:>7.4g} {r['sparsity_measured']:>8.3f} {r['value']:>9.4f} "
                     f"{r['sd']:>7.4f} {'' if w is None else ('yes' if w else 'no'):>5}")
    return "\n".join(lines)
