"""One statistic over units (seeds, canaries, runs): `aggregate(rows, over=..., interval=...)`.

Every page of the app and every figure that draws a mean over seeds goes through this function, so
one number means one thing wherever it is shown. Rows are grouped by `by` (by default every
identifying result column present, less `over`); within a group each row is one unit (one seed,
one canary). Out: one row per group with

    value     the mean over the units
    sd        their standard deviation (`ddof` 1, the sample sd, by default; NaN for one unit.
              `ddof=0`: the population sd, what numpy's `np.std` gives, e.g. the cloze
              learning curve's spread, printed that way since the probe was written)
    count     the number of units
    min, max  their range
    ci_low, ci_high   the interval asked for:
      "t"       Student-t confidence interval of the mean, mean +/- t_{(1+level)/2, n-1} sd / sqrt(n)
                (NaN for one unit: no spread to estimate);
      "minmax"  the range over units (the app's seed band: with the 2-5 seeds a probing study has,
                an sd estimated from them is itself noisy, and the range contains every seed and
                claims nothing more);
      "sd"      mean +/- one sd (Chen et al. 2020's "within one sd of the full model" rule);
      "none"    no interval (NaN).

A bootstrap over seeds is not offered: no page or figure draws one today (the probes' bootstrap CIs
resample evaluation items inside one run and are stored with the rows).

Only per-unit rows are stored (issue 41): every statistic over units is computed here, when rows
are read. Runs written before that also stored the statistic as a row of its own (seed NaN:
fine-tuning's and the prune sweep's mean with its t-interval, extra `{"over": "seeds", ...}`; the
cloze learning curve's `curve_acc_mean/sd/max`). Such a row is not one more unit: `per_unit(rows)`
leaves them out (`stored_aggregates` marks them), so a page that aggregates a store holding old runs
counts each seed once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.errors import ConfigError

INTERVALS = ("t", "minmax", "sd", "none")
# Columns that identify what a row measures; the default grouping is these, less `over`.
KEY_COLUMNS = ("model", "family", "seed", "step", "probe", "task", "split", "stack", "layer", "metric")
OUT_COLUMNS = ("value", "sd", "count", "min", "max", "ci_low", "ci_high")
# Metrics older runs stored as statistics over units (the cloze probe's learning curve, before its
# rows were per fine-tuning seed: `curve_acc` with extra `curve_seed`).
LEGACY_AGGREGATE_METRICS = ("curve_acc_mean", "curve_acc_sd", "curve_acc_max")


def stored_aggregates(rows: pd.DataFrame) -> pd.Series:
    """Which rows are statistics over units that an older run stored (module docstring): a
    seed-less row whose `extra` says what it is a statistic over (`over`), or a row of a
    `LEGACY_AGGREGATE_METRICS` metric. Every other row is one unit."""
    from workbench.store.results import decode_extra

    mask = pd.Series(False, index=rows.index)
    if "metric" in rows.columns:
        mask |= rows["metric"].isin(LEGACY_AGGREGATE_METRICS)
    if "extra" in rows.columns:
        seedless = rows["seed"].isna() if "seed" in rows.columns else pd.Series(True, index=rows.index)
        candidates = seedless.to_numpy() & ~mask.to_numpy()
        if candidates.any():
            # JSON text without the word is not decoded (a store's rows: most are seed-less probe rows)
            over = np.array([(not isinstance(e, str) or '"over"' in e) and "over" in decode_extra(e)
                             for e in rows["extra"].to_numpy()[candidates]], dtype=bool)
            values = mask.to_numpy().copy()
            values[candidates] = over
            mask = pd.Series(values, index=rows.index)
    return mask


def per_unit(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` less the statistics older runs stored beside their per-unit rows (`stored_aggregates`):
    what a read-time `aggregate` should be given."""
    return rows[~stored_aggregates(rows).to_numpy()]


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t interval of the mean of `values`; NaN bounds for one value."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def aggregate(rows: pd.DataFrame, over: str | Sequence[str] = "seed", by: Sequence[str] | None = None,
              interval: str = "t", level: float = 0.95, value: str = "value", ddof: int = 1) -> pd.DataFrame:
    """Mean, sd, count, range and an interval of `value` over the units `over` names, per group `by`.

    `over`: the column(s) whose values are the units (documentation of intent, and left out of the
    default `by`); `by`: the grouping columns (default: KEY_COLUMNS present in `rows`, less
    `over`); missing keys group together. Groups keep their first-appearance order. Rows with a
    NaN value are left out of every statistic (pandas' convention), so a group of NaNs has value
    NaN and count 0. `ddof`: of the `sd` column and the "sd" interval (the t-interval always
    uses the sample sd, ddof 1)."""
    if interval not in INTERVALS:
        raise ConfigError(f"aggregate: unknown interval {interval!r}; choose from {', '.join(INTERVALS)}")
    if not 0 < level < 1:
        raise ConfigError(f"aggregate: level must be in (0, 1), got {level!r}")
    if ddof not in (0, 1):
        raise ConfigError(f"aggregate: ddof must be 0 or 1, got {ddof!r}")
    overs = [over] if isinstance(over, str) else list(over)
    if by is None:
        by = [c for c in KEY_COLUMNS if c in rows.columns and c not in overs]
    by = list(by)
    missing = [c for c in [*by, value] if c not in rows.columns]
    if missing:
        raise ConfigError(f"aggregate: rows have no column(s) {missing}")
    if not by:  # one group: everything
        rows = rows.assign(_all=0)
        by = ["_all"]
    x = pd.to_numeric(rows[value], errors="coerce").astype(float)
    g = x.groupby([rows[c] for c in by], dropna=False, sort=False)
    sample_sd = g.std(ddof=1)
    out = pd.DataFrame({"value": g.mean(), "sd": sample_sd if ddof == 1 else g.std(ddof=0), "count": g.count(),
                        "min": g.min(), "max": g.max()})
    n = out["count"].to_numpy(dtype=float)
    mean, sd = out["value"].to_numpy(dtype=float), out["sd"].to_numpy(dtype=float)
    if interval == "t":
        from scipy import stats

        with np.errstate(invalid="ignore", divide="ignore"):
            q = np.where(n >= 2, stats.t.ppf(0.5 + level / 2, np.maximum(n - 1, 1)), np.nan)
            half = q * sample_sd.to_numpy(dtype=float) / np.sqrt(n)
        lo, hi = mean - half, mean + half
    elif interval == "minmax":
        lo, hi = out["min"].to_numpy(dtype=float), out["max"].to_numpy(dtype=float)
    elif interval == "sd":
        lo, hi = mean - sd, mean + sd
    else:
        lo = hi = np.full(len(out), np.nan)
    out["ci_low"], out["ci_high"] = lo, hi
    out = out.reset_index()
    if by == ["_all"]:
        out = out.drop(columns="_all")
    return out
