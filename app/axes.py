"""Value axes of the app's charts: a score that is a fraction (accuracy, F1, UUAS, AUC, P@1, ...) is
drawn on 0..1, so two charts of one score compare by eye and a band of mean +- sd that leaves
[0, 1] is not drawn as values no model can have (issue 40: the Compression page drew accuracy on
-0.5..1). Plotly's autorange otherwise fits the data and every shape, bands included."""

from __future__ import annotations

import re

UNIT_RANGE = [0.0, 1.0]
# Metric names that are fractions in [0, 1]: exact names, and names ending in one of these (so
# `zero_shot_acc`, `span_f1`, `accuracy_unmapped`, `p_at_1_rotation` count; `selectivity` and `spearman` do not).
_FRACTION = re.compile(r"(^|_)(accuracy|acc|f1|uuas|auc|p_at_\d+|precision|recall|wins|kept|extractable|uas|las)"
                       r"(_[a-z0-9]+)*$")
_NOT_FRACTION = ("selectivity", "loss", "exposure", "spearman", "displacement", "_z", "delta", "diff")


def is_fraction(metric: str | None) -> bool:
    """Whether values of `metric` are fractions in [0, 1] (accuracy-like), read off its name."""
    m = str(metric or "").lower()
    return bool(_FRACTION.search(m)) and not any(bad in m for bad in _NOT_FRACTION)


def unit_axis(fig, **where) -> None:
    """Set a y axis to 0..1 (`where`: plotly's row=/col= of a subplot; none: the figure's y axis)."""
    fig.update_yaxes(range=list(UNIT_RANGE), autorange=False, **where)


def clip(values, lo: float = UNIT_RANGE[0], hi: float = UNIT_RANGE[1]) -> list[float]:
    """Band edges of a fraction clipped to the axis (mean +- sd can leave [0, 1])."""
    return [min(max(float(v), lo), hi) for v in values]


def unit_panels(fig) -> None:
    """0..1 on every subplot of a layer-curve figure (`app.figures.layer_curves`, subplot titles
    "task: metric") whose metric is a fraction; the other panels keep their autorange."""
    n_panels = sum(1 for k in fig.layout.to_plotly_json() if k.startswith("yaxis")) or 1
    titles = [a.text for a in (fig.layout.annotations or []) if getattr(a, "text", None)][:n_panels]
    for col, title in enumerate(titles, start=1):
        metric = str(title).rsplit(": ", 1)[-1]
        if is_fraction(metric):
            unit_axis(fig, row=1, col=col)
