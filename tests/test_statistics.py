"""The one bootstrap and the one AUC (probes/core/statistics.py) against references: scikit-learn's
roc_auc_score, the explicit resampling loop they vectorise, and a planted clustering."""
import warnings

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


# --------------------------------------------------------------------------- the syntax rows stay identical
# Verbatim copies of the bootstrap the syntax probe used before probes/core/statistics.py (probes/core/engine.py
# `per_sentence_sums`, `bootstrap_ci`, `sentence_bootstrap` and the draws of probes/syntax/
# `length_averaged_ci`, at commit 20902e4), kept here as the reference: the probe now calls
# `ratio_bootstrap` and `resample_counts`, and its rows must not change.
def _old_per_sentence_sums(values, sentence_ids, num_sentences=None):
    values = np.asarray(values, dtype=np.float64)
    sid = np.asarray(sentence_ids, dtype=np.int64)
    s = int(num_sentences) if num_sentences is not None else (int(sid.max()) + 1 if len(sid) else 0)
    flat = values.reshape(-1, values.shape[-1])
    out = np.zeros((flat.shape[0], s))
    for i in range(flat.shape[0]):
        out[i] = np.bincount(sid, weights=flat[i], minlength=s)
    return out.reshape(*values.shape[:-1], s)


def _old_bootstrap_ci(numerators, denominators=None, n_boot=1000, alpha=0.05, seed=0, return_boot=False):
    num = np.asarray(numerators, dtype=np.float64)
    s = num.shape[-1]
    flat = num.reshape(-1, s)
    den = np.ones(s) if denominators is None else np.asarray(denominators, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        point = flat.sum(1) / den.sum()
    rng = np.random.default_rng(seed)
    stats = []
    for start in range(0, n_boot, 256):
        counts = rng.multinomial(s, np.full(s, 1.0 / s), size=min(256, n_boot - start)).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            stats.append((counts @ flat.T) / (counts @ den)[:, None])
    boot = np.concatenate(stats)
    low = np.nanquantile(boot, alpha / 2, axis=0)
    high = np.nanquantile(boot, 1 - alpha / 2, axis=0)
    shape = num.shape[:-1]
    if return_boot:
        return point.reshape(shape), low.reshape(shape), high.reshape(shape), boot.reshape(len(boot), *shape)
    return point.reshape(shape), low.reshape(shape), high.reshape(shape)


def _old_sentence_bootstrap(correct, sentence_ids, n_boot=1000, alpha=0.05, seed=0, return_boot=False):
    sid = np.asarray(sentence_ids, dtype=np.int64)
    _, sid = np.unique(sid, return_inverse=True)
    s = int(sid.max()) + 1 if len(sid) else 0
    num = _old_per_sentence_sums(np.asarray(correct, dtype=np.float64), sid, s)
    den = np.bincount(sid, minlength=s).astype(np.float64)
    return _old_bootstrap_ci(num, den, n_boot=n_boot, alpha=alpha, seed=seed, return_boot=return_boot)


def _sentences(seed=0, n_sent=60, layers=4):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 30, n_sent)
    sid = np.repeat(np.arange(0, 3 * n_sent, 3), lengths)  # ids with gaps, as eval subsets have
    correct = rng.random((layers, len(sid))) < np.linspace(0.4, 0.9, layers)[:, None]
    return correct, sid, lengths


@pytest.mark.parametrize("n_boot", [1, 300, 1000])
def test_ratio_bootstrap_is_bit_identical_to_the_old_sentence_bootstrap(n_boot):
    """Every bootstrap call of the syntax probe, old and new, on the same data: equal to the last bit."""
    correct, sid, lengths = _sentences()
    # accuracy with replicates (classification tasks), control accuracy, selectivity (a difference)
    new = st.ratio_bootstrap(correct, None, sid, n_boot=n_boot, seed=7, return_boot=True)
    old = _old_sentence_bootstrap(correct, sid, n_boot=n_boot, seed=7, return_boot=True)
    for a, b in zip(new, old):
        np.testing.assert_array_equal(a, b)
    diff = correct.astype(np.float64) - correct[::-1]
    for a, b in zip(st.ratio_bootstrap(diff, None, sid, n_boot=n_boot, seed=7),
                    _old_sentence_bootstrap(diff, sid, n_boot=n_boot, seed=7)):
        np.testing.assert_array_equal(a, b)
    # UUAS: per-sentence sums over per-sentence totals; root accuracy: one hit per sentence
    per_sentence = _old_per_sentence_sums(correct, np.unique(sid, return_inverse=True)[1])
    for a, b in zip(st.ratio_bootstrap(per_sentence, lengths.astype(float), n_boot=n_boot, seed=3),
                    _old_bootstrap_ci(per_sentence, lengths, n_boot=n_boot, seed=3)):
        np.testing.assert_array_equal(a, b)
    hits = correct[:, :40].astype(float)
    for a, b in zip(st.ratio_bootstrap(hits, None, n_boot=n_boot, seed=3),
                    _old_bootstrap_ci(hits, np.ones(40), n_boot=n_boot, seed=3)):
        np.testing.assert_array_equal(a, b)


def test_length_averaged_ci_of_the_syntax_probe_is_unchanged():
    """DSpr/NSpr intervals (probes/syntax/ `length_averaged_ci`) now draw through `resample_counts`:
    the same intervals as the old loop with its own generator (its statistic, copied verbatim)."""
    from probes.syntax import structural
    from probes.syntax import length_averaged_ci

    rng = np.random.default_rng(5)
    lengths = rng.integers(3, 40, 80)
    values = rng.normal(0.5, 0.2, (3, 80))
    values[1, ::7] = np.nan  # sentences a layer does not count

    def old(values, lengths, n_boot, seed):
        lo, hi = structural.SPEARMAN_LENGTHS
        ok = np.isfinite(values) & ((lengths >= lo) & (lengths <= hi))[None]
        s = values.shape[1]
        uniq, group = np.unique(lengths, return_inverse=True)
        onehot = np.zeros((s, len(uniq)))
        onehot[np.arange(s), group] = 1.0
        rng = np.random.default_rng(seed)
        boots = []
        for start in range(0, n_boot, 256):
            counts = rng.multinomial(s, np.full(s, 1.0 / s), size=min(256, n_boot - start)).astype(np.float64)
            per_layer = []
            for l in range(values.shape[0]):
                w = counts * ok[l][None]
                num = (w * np.where(ok[l], values[l], 0.0)[None]) @ onehot
                den = w @ onehot
                with np.errstate(invalid="ignore", divide="ignore"):
                    means = num / den
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    per_layer.append(np.nanmean(np.where(den > 0, means, np.nan), axis=1))
            boots.append(np.stack(per_layer, axis=1))
        boot = np.concatenate(boots)
        return np.nanquantile(boot, 0.025, axis=0), np.nanquantile(boot, 0.975, axis=0)

    for a, b in zip(length_averaged_ci(values, lengths, 700, 11), old(values, lengths, 700, 11)):
        np.testing.assert_array_equal(a, b)


def test_sentence_bootstrap_against_an_explicit_loop_and_word_resampling():
    """Moved from tests/test_probe_engine.py (`sentence_bootstrap` is now `ratio_bootstrap` with
    sentence units): a planted clustering of correctness by sentence."""
    rng = np.random.default_rng(0)

    def data(n_sent):
        lengths = rng.integers(5, 25, n_sent)
        sid = np.repeat(np.arange(n_sent), lengths)
        p_sent = rng.choice([0.95, 0.4], size=n_sent)  # each sentence mostly right or mostly wrong
        correct = rng.random(len(sid)) < p_sent[sid]
        return np.stack([correct, rng.random(len(sid)) < 0.8]), sid

    small, sid_s = data(100)
    point, low, high = st.ratio_bootstrap(small, None, sid_s, n_boot=2000, seed=0)
    np.testing.assert_allclose(point, small.mean(1))
    assert np.all(low <= point) and np.all(point <= high)
    big, sid_b = data(2000)
    _, l2, h2 = st.ratio_bootstrap(big, None, sid_b, n_boot=2000, seed=0)
    assert np.all((h2 - l2) < 0.5 * (high - low))  # ~ 1/sqrt(20) narrower with 20x the sentences
    loop = []  # reference: explicit loop over resamples of sentence indices
    r = np.random.default_rng(1)
    for _ in range(2000):
        pick = r.integers(0, 100, 100)
        mask = np.concatenate([np.nonzero(sid_s == s)[0] for s in pick])
        loop.append(small[0, mask].mean())
    assert low[0] == pytest.approx(np.quantile(loop, 0.025), abs=0.02)
    assert high[0] == pytest.approx(np.quantile(loop, 0.975), abs=0.02)
    # resampling words instead would ignore the clustering and give a too-narrow interval
    _, wl, wh = st.ratio_bootstrap(small[:1], None, None, n_boot=2000, seed=0)
    assert (wh - wl)[0] < 0.75 * (high - low)[0]


def test_every_probe_uses_the_one_n_boot_by_default():
    """One number of resamples for every metric: the runner's --n-boot default is N_BOOT, and the
    probes' own helpers default to it too (cloze's item bootstrap)."""
    import inspect

    from probes import cloze
    from probes.core import runner

    assert runner.Settings.__dataclass_fields__["n_boot"].default == st.N_BOOT
    assert inspect.signature(cloze.accuracy_ci).parameters["n_boot"].default == st.N_BOOT
