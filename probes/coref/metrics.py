"""Metrics of the pair and GAP probes with their bootstrap CIs (`probes.core.statistics`)."""

from __future__ import annotations

import numpy as np

from probes.core.statistics import auc_bootstrap, percentile_interval, ratio_bootstrap, resample_counts
from probes.coref.gap_scorer import FEMININE, MASCULINE
from probes.coref.items import Pairs, antecedent_correct


# --------------------------------------------------------------------------- metrics
def binary_scores(logits: np.ndarray) -> np.ndarray:
    """Score of the positive class (logit difference) from [..., 2] logits."""
    return logits[..., 1] - logits[..., 0]


def pair_metrics(pred: np.ndarray, scores: np.ndarray, pairs: Pairs, n_boot: int, seed: int,
                 require_positive: float | None = None, return_boot: bool = False) -> tuple[dict, ...]:
    """accuracy, f1, auc, antecedent_accuracy per row of pred/scores ([R, P]) with document-bootstrap CIs
    (`probes.core.statistics`: every metric on the same `n_boot` document resamples)
    (+ {auc, antecedent_accuracy: replicates [n_boot, R]} with `return_boot`)."""
    y = pairs.label.astype(bool)
    pred = np.asarray(pred, dtype=bool)
    tp, fp, fn = pred & y, pred & ~y, ~pred & y
    acc = ratio_bootstrap((pred == y).astype(float), None, pairs.doc, n_boot, seed)
    f1 = ratio_bootstrap(2 * tp.astype(float), (2 * tp + fp + fn).astype(float), pairs.doc, n_boot, seed)
    aucs = [auc_bootstrap(s, y, pairs.doc, n_boot, seed, return_boot=True) for s in scores]
    correct, adoc = antecedent_correct(scores, pairs, require_positive)
    ante = ratio_bootstrap(correct.astype(float), None, adoc, n_boot, seed, return_boot=True)
    metrics = {"accuracy": acc[0], "f1": f1[0], "auc": np.array([a[0] for a in aucs]), "antecedent_accuracy": ante[0]}
    cis = {"accuracy": acc[1:], "f1": f1[1:], "auc": (np.array([a[1] for a in aucs]), np.array([a[2] for a in aucs])),
           "antecedent_accuracy": ante[1:3]}
    if return_boot:
        return metrics, cis, {"auc": np.stack([a[3] for a in aucs], axis=1), "antecedent_accuracy": ante[3]}
    return metrics, cis


def gap_scores_ci(pred_a: np.ndarray, pred_b: np.ndarray, gold_a, gold_b, genders, n_boot: int, seed: int,
                  return_boot: bool = False) -> dict:
    """GAP F1 overall/M/F and bias F/M per row of pred_a/pred_b ([R, N] bool) with an example bootstrap.
    Returns name -> (point [R], low [R], high [R]) (+ replicates [n_boot, R] with `return_boot`, the
    same resamples for every row). Equals `gap_scorer.score_gap` (no missing rows). The resamples
    are `probes.core.statistics.resample_counts` over examples (GAP snippets are independent), so
    they are the ones every other example-level CI of the same seed draws."""
    ga, gb = np.asarray(gold_a, bool), np.asarray(gold_b, bool)
    genders = np.asarray(genders)
    n = len(ga)
    counts = np.vstack([np.ones((1, n)), *resample_counts(n, n_boot, seed)])  # row 0 = the data
    out: dict[str, list] = {k: [] for k in ("f1", "f1_masculine", "f1_feminine", "bias")}
    for pa, pb in zip(np.asarray(pred_a, bool), np.asarray(pred_b, bool)):
        tp = (pa & ga).astype(float) + (pb & gb)
        fp = (pa & ~ga).astype(float) + (pb & ~gb)
        fn = (~pa & ga).astype(float) + (~pb & gb)
        f1s = {}
        for name, mask in (("f1", np.ones(n, bool)), ("f1_masculine", genders == MASCULINE),
                           ("f1_feminine", genders == FEMININE)):
            with np.errstate(invalid="ignore", divide="ignore"):
                num = counts @ (2 * tp * mask)
                den = counts @ ((2 * tp + fp + fn) * mask)
                f1s[name] = np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            f1s["bias"] = np.where(f1s["f1_masculine"] > 0, f1s["f1_feminine"] / np.where(
                f1s["f1_masculine"] > 0, f1s["f1_masculine"], 1), np.nan)
        for k, v in f1s.items():
            boot = v[1:]
            out[k].append((v[0], *percentile_interval(boot), boot))
    res = {k: tuple(np.array(x) for x in zip(*v)) for k, v in out.items()}  # boot: [R, B]
    return {k: (p, lo, hi, b.T) if return_boot else (p, lo, hi) for k, (p, lo, hi, b) in res.items()}
