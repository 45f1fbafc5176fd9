"""Where in depth (Tenney et al. 2019) with bootstrap CIs: probes/core/depth.py, the replicates the
probes store, and the coref_depth figure on a planted results table."""

import json

import numpy as np
import pandas as pd
import pytest

from probes.core import depth
from probes.core.statistics import auc_bootstrap, ratio_bootstrap
from probes.core.rows import layer_rows

# task A peaks at layer 1, task B at layer 3
CURVE_A = np.array([0.5, 0.9, 0.8, 0.7])
CURVE_B = np.array([0.5, 0.6, 0.7, 0.9])
# by hand: A's positive deltas +0.4 at l=1 (then drops count 0) -> E = 1;
# B's deltas +0.1 (l=1), +0.1 (l=2), +0.2 (l=3) -> E = (0.1 + 0.2 + 0.6) / 0.4 = 2.25
E_A, E_B = 1.0, 0.9 / 0.4
# gain centre: gains over layer 0, A: 0, .4, .3, .2 -> (0.4 + 0.6 + 0.6) / 0.9; B: 0, .1, .2, .4 -> (0.1 + 0.4 + 1.2) / 0.7
G_A, G_B = 1.6 / 0.9, 1.7 / 0.7


def test_statistics_match_hand_computation():
    assert depth.expected_layer(CURVE_A) == pytest.approx(E_A)
    assert depth.expected_layer(CURVE_B) == pytest.approx(E_B)
    assert depth.gain_centre(CURVE_A) == pytest.approx(G_A)
    assert depth.gain_centre(CURVE_B) == pytest.approx(G_B)
    assert depth.peak_layer(CURVE_A) == 1 and depth.peak_layer(CURVE_B) == 3
    # vectorised over replicates, and layers relabelled (attention rows start at layer 1)
    both = np.stack([CURVE_A, CURVE_B])
    np.testing.assert_allclose(depth.expected_layer(both, [1, 2, 3, 4]), [E_A + 1, E_B + 1])
    # nothing improves on layer 0: no depth to report
    assert np.isnan(depth.expected_layer([0.9, 0.8, 0.7])) and np.isnan(depth.gain_centre([0.9, 0.8, 0.7]))
    # ties share the peak: two replicates, layers 1 and 2 tie in the first
    np.testing.assert_allclose(depth.peak_shares([[0.1, 0.5, 0.5], [0.1, 0.2, 0.6]]), [0, 0.25, 0.75])
    # a resample without a score (NaN: e.g. no positive pair drawn) is left out, a NaN layer is never best
    np.testing.assert_allclose(depth.peak_shares([[np.nan, np.nan, np.nan], [0.1, np.nan, 0.3]]), [0, 0, 1])
    assert np.isnan(depth.peak_layer([[np.nan, np.nan], [0.2, 0.1]])).tolist() == [True, False]
    # a flat curve (a probe that kept the prior): every layer ties, so the peak's interval spans them all
    assert depth.summarise([0.45] * 4, np.full((30, 4), 0.45))["peak_layer"] == (0.0, 0.0, 3.0)


def test_bootstrap_replicates_are_paired_and_give_the_stored_ci():
    rng = np.random.default_rng(0)
    correct = rng.random((3, 400)) < np.array([[0.6], [0.7], [0.8]])
    sid = np.repeat(np.arange(40), 10)
    acc, lo, hi, boot = ratio_bootstrap(correct, None, sid, n_boot=300, seed=5, return_boot=True)
    assert boot.shape == (300, 3)
    np.testing.assert_allclose(lo, np.nanquantile(boot, 0.025, axis=0))
    np.testing.assert_allclose(hi, np.nanquantile(boot, 0.975, axis=0))
    np.testing.assert_allclose(np.stack([acc, lo, hi]), np.stack(ratio_bootstrap(correct, None, sid, n_boot=300, seed=5)))
    # paired: layer 1 = layer 0 on every resample when their per-sentence values are equal
    same = np.stack([correct[0], correct[0]])
    b = ratio_bootstrap(same.reshape(2, 40, 10).sum(-1), np.full(40, 10.0), n_boot=50, seed=1, return_boot=True)[3]
    np.testing.assert_array_equal(b[:, 0], b[:, 1])
    # the document bootstraps of the coref probe (probes.core.statistics): replicates match their CIs
    units = np.repeat(np.arange(20), 20)
    _, rlo, rhi, rboot = ratio_bootstrap(correct[:, :400].astype(float), None, units, 200, 3, return_boot=True)
    np.testing.assert_allclose(rlo, np.nanquantile(rboot, 0.025, axis=0))
    np.testing.assert_allclose(rhi, np.nanquantile(rboot, 0.975, axis=0))
    y = rng.random(400) < 0.3
    _, alo, _, aboot = auc_bootstrap(y + rng.normal(0, 1, 400), y, units, 50, 3, return_boot=True)
    assert aboot.shape == (50,) and alo == pytest.approx(np.nanquantile(aboot, 0.025))


def test_peak_layer_ci_finds_a_planted_peak():
    """Item correctness per document: layer 2 is planted 15 points better than layer 1; layers 3 and 4
    are the same data (a tie). The best layer is 2 in (nearly) every resample; the tied pair splits."""
    rng = np.random.default_rng(1)
    n_docs, per_doc = 60, 25
    units = np.repeat(np.arange(n_docs), per_doc)
    p = np.array([0.55, 0.6, 0.75, 0.5])
    correct = (rng.random((4, len(units))) < p[:, None]).astype(float)
    correct = np.vstack([correct, correct[3:4]])  # layer 4 = layer 3
    point, _, _, boot = ratio_bootstrap(correct, None, units, 400, 0, return_boot=True)
    s = depth.summarise(point, boot)
    assert s["peak_layer"] == (2.0, 2.0, 2.0)
    assert s["peak_share"][2] > 0.99 and s["peak_share"].sum() == pytest.approx(1.0)
    # a peak that is NOT planted: two equal-probability layers share it, and the CI spans both
    flat = (rng.random((2, len(units))) < 0.7).astype(float)
    point2, _, _, boot2 = ratio_bootstrap(flat, None, units, 400, 0, return_boot=True)
    s2 = depth.summarise(point2, boot2)
    assert 0.05 < s2["peak_share"][0] < 0.95 and (s2["peak_layer"][1], s2["peak_layer"][2]) == (0.0, 1.0)


def _rows(probe, task, metric, model, curve, boot):
    return layer_rows({metric: curve}, probe=probe, task=task, split="dev", model=model,
                      extra=depth.boot_extras(boot, {"probe_seed": 0}))


@pytest.mark.slow
def test_coref_depth_figure_on_a_planted_results_table(tmp_path):
    """Task A (upos, syntax run) peaks at layer 1, task B (gum-pairs auc, coref run) at layer 3: the
    figure's expected layers are the hand computation, ordered, with CIs from the stored replicates;
    it reads the syntax run of the coref run's model, not a newer one of another model."""
    from app.figures import render
    from workbench.store.results import ResultsStore

    rng = np.random.default_rng(0)
    boot_a = CURVE_A + rng.normal(0, 0.01, (200, 4))
    boot_b = CURVE_B + rng.normal(0, 0.01, (200, 4))
    store = ResultsStore(tmp_path / "runs")
    for probe, task, metric, model, curve, boot in [
        ("syntax", "upos", "accuracy", "m", CURVE_A, boot_a),
        ("syntax", "upos", "accuracy", "other", CURVE_B, boot_b),  # newer, another model: not read
        ("coref", "gum-pairs", "auc", "m", CURVE_B, boot_b),
    ]:
        with store.start_run("probe", {"probe": probe}, name=f"{probe}-{model}") as run:
            run.add(_rows(probe, task, metric, model, curve, boot))
            run.finish()
    r = render("coref_depth", store, tmp_path / "fig", formats=("html",))
    data = pd.read_csv(r.folder / "data.csv")
    assert set(data["model"]) == {"m"} and len(r.manifest["run_ids"]) == 2
    def get(task, stat):
        return data[(data["task"] == task) & (data["metric"] == stat)].iloc[0]

    ea, eb = get("upos", "expected_layer"), get("gum-pairs", "expected_layer")
    assert ea["value"] == pytest.approx(E_A) and eb["value"] == pytest.approx(E_B) and ea["value"] < eb["value"]
    assert get("upos", "gain_centre")["value"] == pytest.approx(G_A)
    assert get("gum-pairs", "gain_centre")["value"] == pytest.approx(G_B)
    # the CI is the percentile interval of the statistic over the stored (rounded) replicates
    per_rep = depth.expected_layer(np.round(boot_b, depth.BOOT_DECIMALS))
    assert eb["ci_low"] == pytest.approx(np.quantile(per_rep, 0.025))
    assert eb["ci_high"] == pytest.approx(np.quantile(per_rep, 0.975))
    assert ea["ci_high"] < eb["ci_low"]  # the planted separation is resolved
    assert (get("upos", "peak_layer")[["value", "ci_low", "ci_high"]] == 1).all()
    assert (get("gum-pairs", "peak_layer")[["value", "ci_low", "ci_high"]] == 3).all()
    share = data[(data["task"] == "upos") & (data["metric"] == "peak_share")].sort_values("layer")
    np.testing.assert_allclose(share["value"], [0, 1, 0, 0])
    # the spec's reference (UPOS): B minus A, with the replicates of the two runs paired by index
    d = get("gum-pairs", "expected_layer_minus_upos")
    per_rep = depth.expected_layer(np.round(boot_b, 5)) - depth.expected_layer(np.round(boot_a, 5))
    assert d["value"] == pytest.approx(E_B - E_A) and d["ci_low"] == pytest.approx(np.quantile(per_rep, 0.025))
    assert d["ci_low"] > 0 and (get("gum-pairs", "peak_layer_minus_upos")[["value", "ci_low", "ci_high"]] == 2).all()
    assert not (data["task"] == "upos").loc[data["metric"].str.endswith("_minus_upos")].any()
    # without stored replicates the point estimates stay and the CIs are empty
    with store.start_run("probe", {"probe": "coref"}, name="coref-m-noboot") as run:
        run.add(layer_rows({"auc": CURVE_B}, probe="coref", task="gum-pairs", split="dev", model="m"))
        run.finish()
    data = pd.read_csv(render("coref_depth", store, tmp_path / "fig2", formats=("html",)).folder / "data.csv")
    e = data[(data["task"] == "gum-pairs") & (data["metric"] == "expected_layer")].iloc[0]
    assert e["value"] == pytest.approx(E_B) and np.isnan(e["ci_low"])


def test_boot_extras_round_trip_through_rows():
    boot = np.array([[0.1, 0.2], [0.3, np.nan]])
    rows = layer_rows({"auc": [0.15, 0.25]}, probe="coref", task="gum-pairs", split="dev",
                      extra=depth.boot_extras(boot, {"k": 20}))
    layers, _, back = depth.curve_with_replicates(rows)
    assert json.loads(rows["extra"].iloc[0])["k"] == 20
    np.testing.assert_array_equal(layers, [0, 1])
    np.testing.assert_allclose(back, boot)
