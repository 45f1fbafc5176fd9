"""MLPs in the iterative pruning procedure (Prasanna et al. 2020: heads and MLPs pruned by
importance, 10% of each pool per step, until below 90% of the full score), their physical
removal (zero-width MLP = masked MLP on outputs), their rows and the app's MLP column."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.test_compress_heads import FAMILIES, L, NH, tiny_batch, head_logits, tiny_classifier
from workbench.drivers import head_pruning as H
from workbench.errors import ConfigError


def _planted(layers=10, heads=6, seed=0):
    """Each head and each MLP carries a value; the metric is the share of value kept."""
    rng = np.random.default_rng(seed)
    head_value, mlp_value = rng.gamma(0.5, size=(layers, heads)), rng.gamma(0.5, size=layers) * 3

    def metric(heads_kept, mlps_kept):
        total = head_value.sum() + mlp_value.sum()
        return float(((head_value * heads_kept).sum() + (mlp_value * mlps_kept).sum()) / total)

    return head_value, mlp_value, metric


def test_mlps_units_remove_the_least_important_mlps_and_leave_the_heads():
    head_value, mlp_value, metric = _planted()
    seen = []

    def importance(heads_kept, mlps_kept):
        seen.append(mlps_kept.copy())
        return head_value, mlp_value

    curve = H.iterative_pruning(head_value.shape, metric, importance, order="good", units="mlps", run_to_end=True)
    # 10 MLPs, 10% of them per step: one per step, to zero
    assert [s.n_mlps_removed for s in curve.steps] == list(range(11))
    assert all(s.n_removed == 0 and s.heads_kept.all() for s in curve.steps)
    order = np.argsort(mlp_value, kind="stable")
    for s in curve.steps:
        assert set(np.flatnonzero(~s.mlps_kept)) == set(order[: s.n_mlps_removed])
    assert len(seen) == 10 and seen[3].sum() == 7  # importance recomputed on the masked model
    assert curve.mlps_prunable == curve.steps[curve.threshold_step].n_mlps_removed
    assert [s.fraction_removed("mlps") for s in curve.steps[:3]] == [0.0, 0.1, 0.2]


def test_both_units_prune_each_pool_by_its_own_rule_and_scores():
    head_value, mlp_value, metric = _planted(layers=20, heads=6)
    # the joint steps (the heads-only and MLP-only steps that follow them by default are
    # tests/test_compress_heads.py's test_units_both_continues_...)
    curve = H.iterative_pruning(head_value.shape, metric, lambda h, m: (head_value, mlp_value), order="good",
                                units="both", threshold=0.5, both_schedule="joint")
    heads_left, mlps_left = 120, 20
    for s in curve.steps[1:]:
        heads_left -= H.heads_to_remove(heads_left, 0.1, total=120)  # 10% of all of each pool per step
        mlps_left -= H.heads_to_remove(mlps_left, 0.1, total=20) if mlps_left else 0
        assert (s.heads_kept.sum(), s.mlps_kept.sum()) == (heads_left, mlps_left)
        # each pool lost its least valuable members (head scores never compared with MLP scores)
        assert set(np.flatnonzero(~s.heads_kept.reshape(-1))) == set(np.argsort(head_value.reshape(-1), kind="stable")[: s.n_removed])
        assert set(np.flatnonzero(~s.mlps_kept)) == set(np.argsort(mlp_value, kind="stable")[: s.n_mlps_removed])
    assert curve.steps[-1].metric < 0.5 <= curve.steps[-2].metric
    s = curve.steps[1]
    assert s.fraction_removed("both") == pytest.approx((12 + 2) / (120 + 20))


def test_random_and_bad_orders_over_mlps_are_seeded_and_worse_than_good():
    head_value, mlp_value, metric = _planted()
    curves = {o: H.iterative_pruning(head_value.shape, metric, lambda h, m: (head_value, mlp_value), order=o, seed=2,
                                     units="mlps", threshold=0.9, run_to_end=True) for o in H.ORDERS}
    assert curves["good"].mlps_prunable >= curves["random"].mlps_prunable >= curves["bad"].mlps_prunable
    assert curves["good"].mlps_prunable > curves["bad"].mlps_prunable
    again = H.iterative_pruning(head_value.shape, metric, None, order="random", seed=2, units="mlps", run_to_end=True)
    assert all(np.array_equal(a.mlps_kept, b.mlps_kept) for a, b in zip(again.steps, curves["random"].steps))
    with pytest.raises(ConfigError, match="units 'layers'"):
        H.iterative_pruning(head_value.shape, metric, None, order="random", units="layers")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_removed_mlp_sliced_to_zero_width_gives_the_masked_outputs(family):
    model, batch = tiny_classifier(family), tiny_batch()
    heads = np.ones((L, NH), bool)
    mlps = np.array([False, True])
    masked = H.apply_mask(copy.deepcopy(model), heads, mlps)
    sliced = H.slice_heads(copy.deepcopy(model), heads, mlps)
    assert not torch.allclose(head_logits(model, batch), head_logits(masked, batch), atol=1e-4)  # the MLP mattered
    torch.testing.assert_close(head_logits(sliced, batch), head_logits(masked, batch), atol=1e-5, rtol=0)
    site = H.attention_sites(sliced)[0]
    width = 1 if family == "gpt2" else 0  # GPT-2's Conv1D keeps one unit with zero output weights
    for parent, name in site.mlp_parents:
        w = getattr(parent, name).weight
        assert (w.shape[1] if family == "gpt2" else w.shape[0]) == width
    removed = H.parameter_count(masked) - H.parameter_count(sliced)
    inter = H.attention_sites(model)[0]
    expected = sum(getattr(p, n).weight.numel() + getattr(p, n).bias.numel() if getattr(p, n).bias is not None
                   else getattr(p, n).weight.numel() for p, n in inter.mlp_parents) + inter.mlp_out.weight.numel()
    per_unit = expected // 64 if family != "gpt2" else expected // (4 * 32)
    assert removed == expected - width * per_unit


def test_rows_and_the_app_matrix_carry_an_mlp_column():
    from app.views.prune_heads import PLOTS, matrix, mlp_column, surviving_heads

    head_value, mlp_value, metric = _planted(layers=3, heads=4)
    rows, masks = [], {}
    for seed in (0, 1):
        curve = H.iterative_pruning(head_value.shape, metric, None, order="random", seed=seed, units="both",
                                    threshold=0.7)
        best = curve.steps[curve.threshold_step]
        masks[seed] = best
        rows += H.curve_rows(curve, model="m", family="bert", seed=seed, task="t")
    df = pd.DataFrame(rows)
    assert sorted(df[df["metric"] == "mlps_prunable"]["value"]) == sorted(float(m.n_mlps_removed) for m in masks.values())
    assert len(df[df["metric"] == "mlp_kept"]) == 2 * 3
    table = surviving_heads(df)
    np.testing.assert_allclose(mlp_column(table, "random"), (masks[0].mlps_kept + masks[1].mlps_kept.astype(float)) / 2)
    np.testing.assert_allclose(matrix(table, "random"), (masks[0].heads_kept + masks[1].heads_kept.astype(float)) / 2)
    drawn = PLOTS["prune_heads_matrix"](df, "Surviving", {})
    z = np.asarray(drawn.figure.data[0].z, float)
    assert z.shape == (3, 5) and list(drawn.figure.data[0].x) == ["0", "1", "2", "3", "MLP"]
    assert drawn.figure.layout.xaxis.type == "category"  # the digits are labels, one tick per column
    np.testing.assert_allclose(z[:, -1], mlp_column(table, "random"))


def test_units_setting_is_checked_naming_the_key():
    assert H.load_settings({"units": "both"}, "p.yaml").units == "both"
    with pytest.raises(ConfigError, match=r"p.yaml: units: 'ffn' is not one of heads, mlps, both"):
        H.load_settings({"units": "ffn"}, "p.yaml")


from tests.test_compress_sweep import FT, pretrained, tokenizer  # noqa: E402,F401  (module fixtures)


@pytest.mark.slow
def test_the_sweep_prunes_heads_and_mlps_and_saves_masked_checkpoints(pretrained, tmp_path):
    import json

    from workbench.drivers.prune_sweep import load_prune_config, run_prune
    from workbench.running.classifier_loading import load_classifier
    from workbench.store.results import ResultsStore

    cfg, ft = load_prune_config({"finetune": {**FT, "checkpoint": str(pretrained), "seeds": [0]},
                                 "methods": ["heads_good"], "heads": {"units": "both", "importance_examples": 16,
                                                                     "threshold": 0.99},
                                 "output_dir": str(tmp_path / "s"), "progress": False})
    result = run_prune(cfg, ft, store=ResultsStore(tmp_path / "runs"))
    points = [p for p in result.points if p["method"] == "heads_good"]
    assert points and all(p["units"] == "both" for p in points)
    first = points[0]  # step 1 (2 layers x 2 heads): 10% of 4 heads -> 1, 10% of 2 MLPs -> 1
    assert (first["n_heads_kept"], first["n_mlps_kept"]) == (3, 1)
    assert first["amount"] == pytest.approx(2 / 6)
    manifest = json.loads((Path(first["checkpoint"]) / "manifest.json").read_text())
    params = manifest["derived_from"][-1]["params"] if isinstance(manifest["derived_from"], list) else manifest["derived_from"]["params"]
    assert params["mlps_kept"] == first["mlps_kept"]
    model = load_classifier(first["checkpoint"])
    sites = H.attention_sites(model)
    for layer, kept in enumerate(first["mlps_kept"]):
        out = sites[layer].mlp_out
        assert (out.weight == 0).all() == (not kept) and (out.bias == 0).all() == (not kept)
    assert (result.rows["metric"] == "mlp_kept").sum() == 2
