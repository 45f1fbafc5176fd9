"""The one bootstrap and the one AUC (probes/core/statistics.py) against references: scikit-learn's
roc_auc_score, the explicit resampling loop they vectorise, and a planted clustering."""
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from probes.core import statistics as st


def test_auc_equals_sklearn_with_ties_and_weights():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, size=300).astype(float)  # many ties
    labels = rng.random(300) < 0.4
    assert st.auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    weights = rng.integers(0, 4, size=(5, 300)).astype(float)
    batch = st.auc(scores, labels, weights)
    assert batch.shape == (5,)
    for w, value in zip(weights, batch):
        keep = w > 0
        assert value == pytest.approx(roc_auc_score(labels[keep], scores[keep], sample_weight=w[keep]), abs=1e-12)


def test_auc_of_one_class_is_nan():
    assert np.isnan(st.auc([0.1, 0.2], [True, True]))


def test_resample_blocks_equal_one_draw():
    blocks = np.concatenate(list(st.resample_counts(37, 1000, seed=3)))
    one = np.random.default_rng(3).multinomial(37, np.full(37, 1 / 37), size=1000)
    assert np.array_equal(blocks, one)
    assert (blocks.sum(1) == 37).all()


def test_ratio_bootstrap_equals_explicit_resampling_of_units():
    rng = np.random.default_rng(1)
    n, units = 120, np.repeat(np.arange(30), 4)
    correct = rng.random((3, n)) < np.array([[0.5], [0.7], [0.9]])  # three "layers"
    point, low, high, boot = st.ratio_bootstrap(correct, np.ones(n), units, n_boot=200, seed=5, return_boot=True)
    assert np.allclose(point, correct.mean(1))
    # the same resamples, drawn explicitly: unit j enters counts[j] times with all its items
    counts = np.concatenate(list(st.resample_counts(30, 200, seed=5)))
    explicit = np.array([[np.repeat(row.reshape(30, 4).sum(1), c.astype(int)).sum() / (4 * 30) for row in correct]
                         for c in counts])
    assert np.allclose(boot, explicit)
    assert np.allclose(low, np.quantile(explicit, 0.025, axis=0)) and np.allclose(high, np.quantile(explicit, 0.975, axis=0))
    assert (low < point).all() and (point < high).all()


def test_clustered_intervals_are_wider_when_items_of_a_unit_agree():
    """A planted clustering: every item of a document has the document's outcome. Resampling items
    treats 400 items as independent (too narrow); resampling the 20 documents does not."""
    rng = np.random.default_rng(2)
    doc_outcome = rng.random(20) < 0.5
    units = np.repeat(np.arange(20), 20)
    values = doc_outcome[units].astype(float)
    _, lo_items, hi_items = st.ratio_bootstrap(values, None, None, n_boot=1000, seed=0)
    _, lo_docs, hi_docs = st.ratio_bootstrap(values, None, units, n_boot=1000, seed=0)
    assert (hi_docs - lo_docs) > 3 * (hi_items - lo_items)


def test_auc_bootstrap_pairs_resamples_and_resamples_documents():
    rng = np.random.default_rng(4)
    units = np.repeat(np.arange(50), 6)
    labels = np.tile([True, False], 150)
    scores = labels + rng.normal(0, 1.0, 300)
    point, low, high, boot = st.auc_bootstrap(scores, labels, units, n_boot=300, seed=9, return_boot=True)
    assert point == pytest.approx(roc_auc_score(labels, scores))
    assert low < point < high and boot.shape == (300,)
    # same units and seed -> the same resamples: a shifted copy of the scores gives identical replicates
    again = st.auc_bootstrap(scores + 10, labels, units, n_boot=300, seed=9, return_boot=True)[3]
    assert np.array_equal(boot, again)


def test_ratio_bootstrap_rejects_mismatched_units():
    with pytest.raises(ValueError, match="unit ids"):
        st.ratio_bootstrap(np.ones(5), None, np.arange(4))
