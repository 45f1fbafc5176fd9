"""Where in depth a task is decoded (Tenney et al. 2019, "BERT rediscovers the classical NLP
pipeline"), from per-layer scores and their bootstrap replicates.

Statistics of one per-layer curve s_0 .. s_L (vectorised: `scores` is [..., L]):

- expected layer: Tenney et al.'s differential score Delta_l = s_l - s_(l-1) and
  E[l] = sum_l l * Delta_l / sum_l Delta_l. Tenney et al. take s_l from cumulative scalar mixes of
  layers 0..l, where Delta_l >= 0; our probes are fitted per layer, so a deeper layer can score
  lower; a drop counts as 0 (a layer cannot remove what a cumulative mix already had).
- gain centre: the per-layer stand-in for Tenney et al.'s centre of gravity (sum_l l * s_l over the
  scalar-mix weights s_l, which a per-layer probe does not have): weights w_l = max(s_l - s_0, 0),
  each layer's gain over the embedding layer, normalised; centre = sum_l l * w_l.
- peak layer: argmax_l s_l (the first, on a tie), and its bootstrap distribution: the share of
  resamples in which each layer is the best (ties shared equally); its interval is the alpha/2 and
  1 - alpha/2 quantiles of that distribution.

Confidence intervals: the probes store, next to each layer's score, the score on every bootstrap
resample of the evaluation units (sentences, documents or examples) in `extra["boot"]`; the
resamples are the same for every layer of one task (one seeded draw), so each replicate is a
whole curve and every statistic above is computed per replicate (percentile interval, Efron &
Tibshirani 1993).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from probes.core.statistics import ALPHA, percentile_interval
from workbench.store.results import decode_extra

BOOT_KEY = "boot"  # extra key of a per-layer row: the metric on each bootstrap resample
BOOT_DECIMALS = 5
MAX_STORED_BOOT = 1000


def _layers(scores: np.ndarray, layers) -> np.ndarray:
    return np.arange(scores.shape[-1], dtype=np.float64) if layers is None else np.asarray(layers, dtype=np.float64)


def expected_layer(scores, layers: Sequence[int] | None = None) -> np.ndarray:
    """E[l] = sum l * max(Delta_l, 0) / sum max(Delta_l, 0) over a curve [..., L]; NaN where no layer improves."""
    s = np.asarray(scores, dtype=np.float64)
    lay = _layers(s, layers)
    delta = np.clip(np.diff(s, axis=-1), 0, None)
    total = delta.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (delta * lay[1:]).sum(-1) / np.where(total > 0, total, 1), np.nan)


def gain_centre(scores, layers: Sequence[int] | None = None) -> np.ndarray:
    """sum l * w_l with w_l = max(s_l - s_0, 0) normalised, over a curve [..., L]; NaN where no layer beats layer 0."""
    s = np.asarray(scores, dtype=np.float64)
    lay = _layers(s, layers)
    gain = np.clip(s - s[..., :1], 0, None)
    total = gain.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (gain * lay).sum(-1) / np.where(total > 0, total, 1), np.nan)


def peak_layer(scores, layers: Sequence[int] | None = None) -> np.ndarray:
    """The best layer of a curve [..., L] (the first, on a tie)."""
    s = np.asarray(scores, dtype=np.float64)
    empty = np.isnan(s).all(-1)
    best = _layers(s, layers)[np.argmax(np.where(np.isnan(s), -np.inf, s), axis=-1)]
    return np.where(empty, np.nan, best)


def peak_shares(boot) -> np.ndarray:
    """[B, L] replicate curves -> [L]: the share of replicates in which each layer is the best,
    a tie split equally among the tied layers (NaN scores never best)."""
    b = np.asarray(boot, dtype=np.float64)
    b = b[~np.isnan(b).all(1)]  # a resample where no layer has a score (e.g. no positive pair) says nothing
    best = b == np.max(np.where(np.isnan(b), -np.inf, b), axis=1, keepdims=True)
    return (best / best.sum(1, keepdims=True)).mean(0)


def _ci(values: np.ndarray, alpha: float) -> tuple[float, float]:
    """Percentile interval of one statistic's replicates (`statistics.percentile_interval`: NaN
    replicates, e.g. a resample where no layer improves, left out)."""
    low, high = percentile_interval(np.asarray(values, dtype=np.float64), alpha)
    return float(low), float(high)


def summarise(point, boot=None, layers: Sequence[int] | None = None, alpha: float = ALPHA) -> dict[str, Any]:
    """Expected layer, gain centre and peak layer of one curve with percentile CIs from paired
    replicates `boot` [B, L] (None: no CIs), and the peak share per layer.

    Returns {"expected_layer": (value, low, high), "gain_centre": ..., "peak_layer": ...,
    "peak_share": [L] or None}."""
    p = np.asarray(point, dtype=np.float64)
    lay = _layers(p, layers)
    out: dict[str, Any] = {}
    for name, fn in (("expected_layer", expected_layer), ("gain_centre", gain_centre)):
        value = float(fn(p, lay))
        lo, hi = _ci(np.asarray(fn(np.asarray(boot, dtype=np.float64), lay), dtype=np.float64), alpha) \
            if boot is not None else (float("nan"), float("nan"))
        out[name] = (value, lo, hi)
    out["peak_share"] = peak_shares(boot) if boot is not None else None
    if boot is None:
        out["peak_layer"] = (float(peak_layer(p, lay)), float("nan"), float("nan"))
    else:  # quantiles of the argmax distribution, ties split as in peak_share (a flat curve spans every layer)
        cdf = np.cumsum(out["peak_share"])
        lo, hi = (float(lay[min(int(np.searchsorted(cdf, prob - 1e-9)), len(lay) - 1)]) for prob in (alpha / 2, 1 - alpha / 2))
        out["peak_layer"] = (float(peak_layer(p, lay)), lo, hi)
    return out


STATS = {"expected_layer": expected_layer, "gain_centre": gain_centre, "peak_layer": peak_layer}


def difference(point_a, boot_a, point_b, boot_b, layers: Sequence[int] | None = None,
               alpha: float = ALPHA) -> dict[str, tuple[float, float, float]]:
    """stat(curve a) - stat(curve b) for every statistic in STATS, with a percentile interval.

    Two tasks are scored on different units (documents vs sentences), so their resamples are
    independent draws: replicate i of a is paired with replicate i of b (the first min(B_a, B_b)),
    which is the two-sample bootstrap of the difference. No replicates: NaN interval."""
    lay = _layers(np.asarray(point_a, dtype=np.float64), layers)
    out = {}
    for name, fn in STATS.items():
        value = float(fn(np.asarray(point_a, dtype=np.float64), lay) - fn(np.asarray(point_b, dtype=np.float64), lay))
        if boot_a is None or boot_b is None:
            out[name] = (value, float("nan"), float("nan"))
            continue
        n = min(len(boot_a), len(boot_b))
        diff = fn(np.asarray(boot_a, dtype=np.float64)[:n], lay) - fn(np.asarray(boot_b, dtype=np.float64)[:n], lay)
        out[name] = (value, *_ci(np.asarray(diff, dtype=np.float64), alpha))
    return out


def boot_extras(boot, extra: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """One `extra` per layer: `extra` plus that layer's replicates (boot [B, L], rounded; at most
    MAX_STORED_BOOT of them, the first ones, so every layer keeps the same resamples)."""
    b = np.round(np.asarray(boot, dtype=np.float64)[:MAX_STORED_BOOT], BOOT_DECIMALS)
    return [dict(extra or {}, **{BOOT_KEY: [None if not np.isfinite(v) else float(v) for v in b[:, l]]})
            for l in range(b.shape[1])]


def curve_with_replicates(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(layers, scores, replicates [B, L] or None) of one model's per-layer rows of one task and
    metric; None when a layer has no stored replicates or their counts differ."""
    rows = rows[rows["layer"].notna()].sort_values("layer")
    layers = rows["layer"].astype(int).to_numpy()
    values = rows["value"].to_numpy(dtype=np.float64)
    reps = [decode_extra(e).get(BOOT_KEY) for e in rows["extra"]] if "extra" in rows else [None]
    if not reps or any(r is None for r in reps) or len({len(r) for r in reps}) != 1:
        return layers, values, None
    boot = np.array([[np.nan if v is None else v for v in r] for r in reps], dtype=np.float64).T
    return layers, values, boot


def depth_rows(metric: str, point, boot, layers: Sequence[int], alpha: float = ALPHA) -> tuple[dict, dict, dict]:
    """Per-layer peak shares and the peak layer of one curve, in `layer_rows` form for a probe:
    ({f"{metric}_peak_share": [L]}, {f"{metric}_peak_layer": [1]}, its CI {...: ([lo], [hi])})."""
    s = summarise(point, boot, layers, alpha)
    value, lo, hi = s["peak_layer"]
    name = f"{metric}_peak_layer"
    return {f"{metric}_peak_share": s["peak_share"]}, {name: [value]}, {name: ([lo], [hi])}
