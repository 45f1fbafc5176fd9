"""Per-layer numbers as tidy rows of the results schema (`workbench.store.results.RESULT_COLUMNS`).

`layer_rows` turns {metric: [L]} (with CIs, sample sizes and extra data) into validated rows; the
runner's `Unit.rows` adds the model's name, family, seed, step and stack.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from workbench.errors import ConfigError
from workbench.store.rowschema import RowSchema

# `extra` keys every probe's rows may carry, written by the shared machinery rather than the probe:
# a baseline row's declaration (`baselines.mark_baselines`, the runner's random-init twins), the
# paired bootstrap replicates of a per-layer metric (`depth.boot_extras`) and their count.
COMMON_EXTRA: dict[str, Any] = {"baseline": str, "baseline_for": str, "boot": list, "n_boot": int}


def probe_schema(probe: str, kind: str = "rows", *, required: Mapping[str, Any] | None = None,
                 optional: Mapping[str, Any] | None = None) -> RowSchema:
    """Declare (register) the `extra` of one kind of a probe's rows, `COMMON_EXTRA` allowed on every
    one: the results store then refuses a row with an undeclared key or a wrong type when it is
    written (`workbench.store.rowschema`)."""
    required = dict(required or {})
    return RowSchema(probe, kind, required=required,
                     optional={**{k: v for k, v in COMMON_EXTRA.items() if k not in required}, **(optional or {})})


def layer_rows(
    metrics: Mapping[str, Sequence[float]],
    *,
    probe: str,
    task: str,
    split: str,
    layers: Sequence[int] | None = None,
    stack: str | None = "encoder",
    n: int | Sequence[int] | None = None,
    ci: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
    extra: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    model: str | None = None,
    family: str | None = None,
    seed: int | None = None,
    step: int | None = None,
):
    """Per-layer metrics -> a DataFrame in the results schema (`workbench.store.results.RESULT_COLUMNS`).

    metrics: {"accuracy": [L], "selectivity": [L], ...}; ci: {"accuracy": (low [L], high [L])};
    extra: one dict for all rows or one per layer. Rows are validated by the results store.
    """
    from workbench.store.results import validate_rows

    lengths = {len(np.atleast_1d(v)) for v in metrics.values()}
    if len(lengths) != 1:
        raise ConfigError(f"layer_rows: metrics have different lengths {sorted(lengths)}")
    n_layers = lengths.pop()
    layers = list(range(n_layers)) if layers is None else [int(l) for l in layers]
    if len(layers) != n_layers:
        raise ConfigError(f"layer_rows: {len(layers)} layer indices for {n_layers} values")
    ci = ci or {}
    unknown = set(ci) - set(metrics)
    if unknown:
        raise ConfigError(f"layer_rows: confidence intervals for unknown metrics {sorted(unknown)}")
    ns = [n] * n_layers if n is None or np.isscalar(n) else list(n)
    extras = list(extra) if isinstance(extra, Sequence) and not isinstance(extra, (str, Mapping)) else [extra] * n_layers
    rows = []
    for name, values in metrics.items():
        values = np.atleast_1d(np.asarray(values, dtype=np.float64))
        low, high = ci.get(name, (None, None))
        for i, layer in enumerate(layers):
            rows.append({
                "model": model, "family": family, "seed": seed, "step": step, "probe": probe, "task": task,
                "split": split, "stack": stack, "layer": layer, "metric": name, "value": float(values[i]),
                "n": None if ns[i] is None else int(ns[i]),
                "ci_low": None if low is None else float(np.asarray(low)[i]),
                "ci_high": None if high is None else float(np.asarray(high)[i]),
                "extra": extras[i],
            })  # fmt: skip
    return validate_rows(rows)
