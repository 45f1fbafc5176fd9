"""Statistics, in one home: the bootstrap every probe's confidence intervals come from, and the AUC.

One resampling scheme serves every metric (Efron & Tibshirani 1993, percentile intervals):

- The unit of resampling is the independent unit of the data (a sentence for syntax, a document
  for coreference and membership, an example where examples are independent), never a word or a
  passage: items of one unit are correlated, and resampling items gives intervals that are too
  narrow. Callers pass `units` (one id per item); items of a unit enter a resample together.
- A resample is a vector of multinomial counts over units (`resample_counts`), drawn from
  `numpy.random.default_rng(seed)`. The same seed and number of units give the same counts, so every
  row (layer, model, metric) evaluated on the same units with the same seed gets the *same*
  resamples: replicates are paired, and differences between layers or models (`probes.core.depth`)
  have honest intervals.
- Every metric uses the same number of resamples (`N_BOOT`, the runner's `--n-boot`).

Why not `scipy.stats.bootstrap`: it resamples observations of independent samples (with
`paired=True` for a common index), but not clusters, and it draws its own resamples per call,
so replicates would not be shared across the rows of a layer sweep. The counts-matrix form also
makes a ratio of sums one matrix product for every row and every resample at once.
"""
from __future__ import annotations

import warnings

import numpy as np

N_BOOT = 1000  # resamples for every confidence interval (the runner's `n_boot` default)
ALPHA = 0.05  # 95% percentile intervals
_CHUNK = 256  # resamples drawn at a time: memory stays [256, units]


def unit_index(units) -> tuple[np.ndarray, int]:
    """(index of each item's unit in 0..U-1, U): units in order of their sorted ids."""
    units = np.asarray(units)
    if units.size == 0:
        return np.zeros(0, dtype=np.int64), 0
    _, inverse = np.unique(units, return_inverse=True)
    return inverse.astype(np.int64), int(inverse.max()) + 1


def resample_counts(n_units: int, n_boot: int = N_BOOT, seed: int = 0):
    """Yield blocks of bootstrap resamples as multinomial counts over units, [<=256, n_units] float64.

    Drawing in blocks gives exactly the same stream as one [n_boot, n_units] draw (numpy draws row
    by row), with bounded memory."""
    rng = np.random.default_rng(seed)
    p = np.full(n_units, 1.0 / n_units) if n_units else np.zeros(0)
    for start in range(0, n_boot, _CHUNK):
        size = min(_CHUNK, n_boot - start)
        if n_units == 0:
            yield np.zeros((size, 0))
        else:
            yield rng.multinomial(n_units, p, size=size).astype(np.float64)


def unit_sums(values, unit_of_item, n_units: int) -> np.ndarray:
    """Sum per-item values [..., N] within units -> [..., U]."""
    values = np.asarray(values, dtype=np.float64)
    flat = values.reshape(-1, values.shape[-1])
    out = np.zeros((flat.shape[0], n_units))
    for i in range(flat.shape[0]):
        out[i] = np.bincount(unit_of_item, weights=flat[i], minlength=n_units)
    return out.reshape(*values.shape[:-1], n_units)


def percentile_interval(boot, alpha: float = ALPHA, axis: int = 0):
    """(low, high) percentile interval of replicates along `axis`, ignoring NaN replicates (a
    resample can have an empty denominator); NaN where every replicate is NaN."""
    boot = np.asarray(boot, dtype=np.float64)
    with warnings.catch_warnings():  # an all-NaN column has a NaN interval by design
        warnings.filterwarnings("ignore", message="All-NaN slice encountered")
        return np.nanquantile(boot, alpha / 2, axis=axis), np.nanquantile(boot, 1 - alpha / 2, axis=axis)


def ratio_bootstrap(numerators, denominators=None, units=None, n_boot: int = N_BOOT, seed: int = 0,
                    alpha: float = ALPHA, return_boot: bool = False):
    """sum(numerators) / sum(denominators) with a percentile bootstrap over units.

    numerators: [..., N] per item (e.g. 1 for a correct word); denominators: [N] or [..., N] (e.g. 1
    per word, so the ratio is an accuracy), or None for a mean over items; units: [N] unit id of each
    item, or None when every item is its own unit (then the items may already be per-unit sums).
    Numerator and denominator are resampled together (a bootstrap of the ratio, not of a mean of
    ratios). Returns (point, low, high), each [...], and with `return_boot` the replicates
    [n_boot, ...]: the same resamples for every leading row (paired across layers).
    """
    num = np.asarray(numerators, dtype=np.float64)
    n = num.shape[-1]
    den = np.ones(n) if denominators is None else np.asarray(denominators, dtype=np.float64)
    den = np.broadcast_to(den, num.shape) if den.shape != (n,) else den
    if den.shape[-1] != n:
        raise ValueError(f"ratio_bootstrap: denominators end in {den.shape[-1]} items, numerators in {n}")
    if units is None:
        n_units = n
        num_u, den_u = num, den
    else:
        if len(units) != n:
            raise ValueError(f"ratio_bootstrap: {len(units)} unit ids for {n} items")
        index, n_units = unit_index(units)
        num_u = unit_sums(num, index, n_units)
        den_u = unit_sums(den, index, n_units)
    lead = num.shape[:-1]
    flat_num = num_u.reshape(-1, n_units)
    shared_den = den_u.ndim == 1
    flat_den = den_u if shared_den else den_u.reshape(-1, n_units)
    with np.errstate(invalid="ignore", divide="ignore"):
        point = flat_num.sum(1) / (flat_den.sum() if shared_den else flat_den.sum(1))
        blocks = []
        for counts in resample_counts(n_units, n_boot, seed):
            top = counts @ flat_num.T
            bottom = (counts @ flat_den)[:, None] if shared_den else counts @ flat_den.T
            blocks.append(top / bottom)
    boot = np.concatenate(blocks) if blocks else np.zeros((0, flat_num.shape[0]))
    low, high = percentile_interval(boot, alpha)
    out = point.reshape(lead), np.asarray(low).reshape(lead), np.asarray(high).reshape(lead)
    return (*out, boot.reshape(len(boot), *lead)) if return_boot else out


def auc(scores, labels, weights=None) -> np.ndarray | float:
    """ROC AUC: P(score of a positive > score of a negative), ties counted half (Mann-Whitney U).

    `weights`: None, [N] (one weighting, e.g. bootstrap multiplicities) -> a float; or [B, N] (B
    weightings at once) -> [B]. It equals `sklearn.metrics.roc_auc_score(labels, scores,
    sample_weight=w)` (tests/test_statistics.py checks it); it is written out here only because a
    bootstrap needs it for a thousand weightings of the same scores: one sort, then every
    weighting is a few matrix operations instead of a thousand calls."""
    scores = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    single = weights is None or np.asarray(weights).ndim == 1
    w = np.ones((1, len(scores))) if weights is None else np.atleast_2d(np.asarray(weights, dtype=np.float64))
    if len(scores) == 0:
        result = np.full(len(w), np.nan)
        return float(result[0]) if single else result
    order = np.argsort(scores, kind="mergesort")
    s_sorted, y_sorted = scores[order], y[order]
    starts = np.flatnonzero(np.r_[True, s_sorted[1:] != s_sorted[:-1]])  # first item of each tie group
    result = np.empty(len(w))
    for b0 in range(0, len(w), _CHUNK):
        ws = w[b0:b0 + _CHUNK][:, order]
        neg = np.add.reduceat(np.where(y_sorted, 0.0, ws), starts, axis=1)  # [b, groups]
        pos = np.add.reduceat(np.where(y_sorted, ws, 0.0), starts, axis=1)
        below = np.cumsum(neg, axis=1) - neg  # negatives strictly below each group
        total = pos.sum(1) * neg.sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            result[b0:b0 + _CHUNK] = np.where(total > 0, (pos * (below + 0.5 * neg)).sum(1) / total, np.nan)
    return float(result[0]) if single else result


def auc_bootstrap(scores, labels, units=None, n_boot: int = N_BOOT, seed: int = 0, alpha: float = ALPHA,
                  return_boot: bool = False):
    """AUC with a percentile bootstrap over units (documents; None: items are independent).

    Each resample weights every item by how often its unit was drawn, so a unit's members and
    non-members enter together, and calls with the same units and seed share their resamples.
    Returns (point, low, high) (+ the replicates [n_boot] with `return_boot`)."""
    scores = np.asarray(scores, dtype=np.float64)
    if units is None:
        index, n_units = np.arange(len(scores)), len(scores)
    else:
        index, n_units = unit_index(units)
    point = auc(scores, labels)
    boot = np.concatenate([auc(scores, labels, counts[:, index]) for counts in resample_counts(n_units, n_boot, seed)]) \
        if n_boot else np.zeros(0)
    low, high = percentile_interval(boot, alpha)
    out = point, float(low), float(high)
    return (*out, boot) if return_boot else out

