"""Bigram baselines (workbench/ngram.py): hand-computed values, normalisation, and a loop
reference on real EWT token ids."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from workbench.ngram import bigram_log_probs, bigram_perplexity


def test_hand_computed_probabilities():
    train = np.array([0, 1, 0, 1, 2])  # pairs (0,1) x2, (1,0), (1,2)
    # add-1: P(1|0) = (2 + 1) / (2 + 3)
    assert math.exp(bigram_log_probs(train, [0, 1], 3, "add_k", k=1.0)[0]) == pytest.approx(0.6)
    # Kneser-Ney, D = 0.5, no uniform mass: every w follows exactly one distinct v, P_cont = 1/3;
    # P(1|0) = (2 - 0.5)/2 + 0.5 * 1/2 * 1/3, P(2|0) = 0.5 * 1/2 * 1/3
    kn = dict(smoothing="kneser_ney", discount=0.5, uniform_weight=0.0)
    assert math.exp(bigram_log_probs(train, [0, 1], 3, **kn)[0]) == pytest.approx(0.75 + 1 / 12)
    assert math.exp(bigram_log_probs(train, [0, 2], 3, **kn)[0]) == pytest.approx(1 / 12)
    # context 2 never starts a pair in training: P(w|2) = P_cont(w)
    assert math.exp(bigram_log_probs(train, [2, 0], 3, **kn)[0]) == pytest.approx(1 / 3)


@pytest.mark.parametrize("smoothing", ["add_k", "kneser_ney"])
def test_every_context_is_a_distribution(smoothing):
    rng = np.random.default_rng(0)
    V = 7
    train = rng.integers(0, V - 1, size=300)  # id V-1 never occurs: unseen context and word
    for v in range(V):
        probs = [math.exp(bigram_log_probs(train, [v, w], V, smoothing)[0]) for w in range(V)]
        assert sum(probs) == pytest.approx(1.0, abs=1e-9)
        assert min(probs) > 0


def _kn_reference(train, test, V, D=0.75, u=1e-3):
    """Interpolated Kneser-Ney bigram with plain Python counters (the formula, written out)."""
    pairs = Counter(zip(train[:-1], train[1:]))
    ctx = Counter(train[:-1])
    after = Counter(v for v, _ in pairs)
    before = Counter(w for _, w in pairs)
    total = sum(before.values())
    nll = 0.0
    for v, w in zip(test[:-1], test[1:]):
        pc = (1 - u) * before[w] / total + u / V
        p = (max(pairs[(v, w)] - D, 0) + D * after[v] * pc) / ctx[v] if ctx[v] else pc
        nll -= math.log(p)
    return nll / (len(test) - 1)


def test_matches_loop_reference_on_real_text(tokenizers, ewt_train):
    tok = tokenizers["gpt"]
    V = len(tok)
    ids = [i for s in ewt_train[:3000] for i in tok(s.text)["input_ids"]]
    train, test = ids[:-8000], ids[-8000:]
    kn = bigram_perplexity(np.array(train), np.array(test), V)
    assert kn.nll == pytest.approx(_kn_reference(train, test, V), rel=1e-9)
    assert kn.n_predicted == len(test) - 1
    # a unigram (add-0.01) is worse than both bigrams, and KN beats add-k on real text
    counts = np.bincount(train, minlength=V) + 0.01
    unigram_nll = float(-np.log(counts[test[1:]] / counts.sum()).mean())
    addk = bigram_perplexity(np.array(train), np.array(test), V, smoothing="add_k", k=0.01)
    assert kn.nll < addk.nll < unigram_nll


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="ids must lie"):
        bigram_log_probs([0, 5], [0, 1], 3)
    with pytest.raises(ValueError, match="smoothing"):
        bigram_log_probs([0, 1], [0, 1], 3, smoothing="witten_bell")
