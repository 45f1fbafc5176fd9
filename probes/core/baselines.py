"""Baselines a probe's accuracy is read against, and how rows say they are baselines.

- Hewitt & Liang (2019) control tasks: every word TYPE gets a fixed random label drawn from the
  task's label distribution (`control_labels`, `label_distribution`); selectivity = task accuracy -
  control accuracy, so a probe that memorises word types instead of reading structure scores low;
- the majority class of the training labels (`majority_baseline`);
- `mark_baselines`: rows declare in their data (`extra.baseline`) that they measure a baseline, so the
  app and the figures draw any probe's baselines without a table of names.

The randomly initialised twin is a derived model, not a function here:
`ModelHandle.derive("random_init", ...)` (workbench/running/models.py).
"""

from __future__ import annotations

import hashlib
from typing import Mapping, Sequence

import numpy as np

from workbench.errors import ConfigError


BASELINE_KEY = "baseline"  # extra key: the baseline a row measures (the app draws such rows as baselines)
BASELINE_FOR_KEY = "baseline_for"  # extra key: the metric whose panel a baseline line is drawn in


def mark_baselines(rows, baselines: Mapping[str, str | tuple[str, str]]):
    """Declare which rows are baselines, in their data: {metric: name} or {metric: (name, for_metric)}
    sets `extra["baseline"] = name` (and `extra["baseline_for"] = for_metric`: the metric the line is a
    reference for, e.g. majority for accuracy) on the rows of that metric. The app and the figures
    draw a row by this marker (app/data.py `row_kinds`), so a new probe's baselines need no app
    change. A row already marked keeps its marker (the runner marks every row of a random-init twin)."""
    from workbench.store.results import decode_extra, to_json

    rows = rows.copy()
    for metric, spec in baselines.items():
        name, of = (spec, None) if isinstance(spec, str) else spec
        pick = (rows["metric"] == metric).to_numpy()
        if not pick.any():
            continue
        marked = []
        for i, e in zip(np.flatnonzero(pick), rows["extra"].to_numpy()[pick]):
            ex = decode_extra(e)
            if BASELINE_KEY not in ex:
                ex[BASELINE_KEY] = name
                if of is not None:
                    ex[BASELINE_FOR_KEY] = of
            marked.append(to_json(ex, f"column 'extra', row {i}"))
        rows.loc[pick, "extra"] = marked
    return rows


def label_distribution(labels, num_classes: int) -> np.ndarray:
    """Empirical class distribution [C] of integer labels."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes).astype(np.float64)
    return counts / max(counts.sum(), 1.0)


def control_labels(types: Sequence[str], distribution: np.ndarray, seed: int) -> np.ndarray:
    """Hewitt & Liang (2019) control task: each word TYPE gets one label drawn from `distribution`.

    The draw for a type depends only on (seed, type) - a hash mapped through the inverse CDF - so
    a type keeps its control label across train/dev/test and across calls, whatever order or
    subset of the data is passed. Use the task's empirical train distribution (`label_distribution`).
    """
    p = np.asarray(distribution, dtype=np.float64)
    if p.ndim != 1 or (p < 0).any() or p.sum() <= 0:
        raise ConfigError(f"control_labels: distribution must be non-negative with positive sum, got {p}")
    cdf = np.cumsum(p / p.sum())
    uniq, inverse = np.unique(np.asarray(list(types), dtype=object).astype(str), return_inverse=True)
    u = np.array(
        [int.from_bytes(hashlib.blake2b(f"{seed}\x00{t}".encode(), digest_size=8).digest(), "little") / 2**64 for t in uniq]
    )
    per_type = np.minimum(np.searchsorted(cdf, u, side="right"), len(p) - 1)
    return per_type[inverse].astype(np.int64)


def majority_baseline(y_train, y_eval) -> tuple[int, float]:
    """(most frequent train label, its accuracy on y_eval)."""
    y_train, y_eval = np.asarray(y_train), np.asarray(y_eval)
    label = int(np.bincount(y_train).argmax())
    return label, float((y_eval == label).mean()) if len(y_eval) else float("nan")
