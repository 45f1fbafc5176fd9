"""Accuracy-like axes are 0..1 on every page (issue 40: the Compression page drew accuracy on
-0.5..1, plotly's autorange fitting a band of mean +- sd that left [0, 1]). Each chart a page draws
of a fraction (accuracy, span F1, UUAS, AUC, ...) is checked on planted rows: the y axis range is
exactly [0, 1] and nothing drawn (lines, bands, reference rectangles) leaves it; a panel of a
metric that is not a fraction keeps its autorange."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from app import axes, figures
from app.page_modules import cost, distill, finetune
from app.page_modules import prune as prune_page
from tests.test_app_distill import planted_distill_rows as distill_rows_planted
from tests.test_app_finetune_cost import as_rows, planted_cost_rows, planted_finetune_rows
from workbench.drivers.prune_sweep import build_rows

# seeds far apart: the 1-bit and random points' mean +- sd leaves [0, 1] on both sides
SPREAD = {0: 0.02, 1: 0.98}


def _spread_points() -> list[dict]:
    out = []
    for seed, acc in SPREAD.items():
        for method, amount, extra in (("full", 0.0, {}), ("random", 0.5, {}), ("imp", 0.5, {"round": 1}),
                                      ("quantize", 1, {"bits": 1})):
            out.append({"method": method, "amount": amount, "seed": seed, "dev": {"accuracy": acc, "n": 100},
                        "test": {"accuracy": acc if method != "full" else 0.5 + acc / 10, "n": 100},
                        "parameters": 1200, "prunable": 1000, "nonzero_prunable": 500, "nonzero_parameters": 700,
                        "sparsity_measured": amount if method in ("imp", "random") else 0.0, **extra})
    return out


def _assert_unit(fig, where: str) -> None:
    assert list(fig.layout.yaxis.range) == [0.0, 1.0], where
    for trace in fig.data:
        ys = [y for y in (trace.y if trace.y is not None else []) if y is not None and np.isfinite(y)]
        assert all(0.0 <= y <= 1.0 for y in ys), (where, trace.name, ys)
    for shape in fig.layout.shapes or []:
        if shape.yref in (None, "y") and shape.y0 is not None:
            assert 0.0 <= shape.y0 <= 1.0 and 0.0 <= shape.y1 <= 1.0, (where, shape.y0, shape.y1)


def test_compression_figures_draw_accuracy_on_0_to_1_with_bands_clipped():
    rows = pd.DataFrame(build_rows(_spread_points(), "sentence_polarity", "bert", "spread"))
    sd = float(np.std(list(SPREAD.values()), ddof=1))
    assert np.mean(list(SPREAD.values())) - sd < 0 and np.mean(list(SPREAD.values())) + sd > 1  # the planted spread
    for fn in (prune_page.prune_vs_sparsity, prune_page.prune_vs_bits, prune_page.prune_vs_size):
        drawn = fn(rows, fn.__name__, {"split": "test"})
        _assert_unit(drawn.figure, fn.__name__)
    # the data a figure exports keeps the statistic itself (mean +- sd), only the drawing is clipped
    data = prune_page.prune_vs_sparsity(rows, "t", {"split": "test"}).data
    random = data[data["model"] == "random"]
    assert random["low"].item() == pytest.approx(np.mean(list(SPREAD.values())) - sd)


def test_finetune_distill_and_cost_charts_draw_fractions_on_0_to_1():
    rows = as_rows(planted_finetune_rows())  # span F1
    for fn in (finetune.finetune_curves, finetune.finetune_test):
        _assert_unit(fn(rows, "t", {}).figure, fn.__name__)
    planted = distill_rows_planted()
    _assert_unit(distill.tradeoff_plot(planted, "t", {"x": "parameters"}).figure, "distill tradeoff")
    probe = [{"model": m, "family": "bert", "probe": "syntax", "task": "upos", "split": "dev", "metric": "accuracy",
              "layer": layer, "value": v + 0.1 * layer, "extra": {}}
             for m, v in (("r/seed-0/step-0000000", 0.2), ("r/seed-0/step-0000010", 0.5))
             for layer in range(3)]
    drawn = cost.score_vs_flops(as_rows(planted_cost_rows() + probe), "t", {"task": "upos", "metric": "accuracy"})
    _assert_unit(drawn.figure, "score vs flops")


def test_layer_curve_panels_of_fractions_are_0_to_1_and_others_keep_autorange():
    rows = []
    for metric, values in (("accuracy", [0.31, 0.52, 0.61]), ("spearman", [-0.4, 0.1, 0.7])):
        for layer, v in enumerate(values):
            rows.append({"model": "m", "family": "bert", "probe": "syntax", "task": "upos", "split": "dev",
                         "stack": "encoder", "metric": metric, "layer": layer, "value": v, "ci_low": v - 0.05,
                         "ci_high": v + 0.05, "seed": 0, "step": None, "extra": "{}", "run_id": "r", "n": 10})
    drawn = figures.layer_curves(pd.DataFrame(rows), "t", {})  # the exported figure too, not only the app's
    assert list(drawn.figure.layout.yaxis.range) == [0.0, 1.0]  # upos: accuracy
    assert drawn.figure.layout.yaxis2.range is None  # upos: spearman, not a fraction


@pytest.mark.parametrize("metric, fraction", [
    ("accuracy", True), ("span_f1", True), ("uuas", True), ("root_acc", True), ("auc", True), ("p_at_1", True),
    ("zero_shot_acc", True), ("accuracy_epoch", True), ("f1_masculine", True), ("wins", True),
    ("selectivity", False), ("spearman", False), ("exposure", False), ("train_loss_epoch", False), ("cka", False),
    ("displacement", False), ("majority", False)])
def test_which_metrics_are_fractions(metric, fraction):
    assert axes.is_fraction(metric) is fraction
