"""Alignment core: Procrustes against planted maps and scipy's convention, CSLS by hand, P@k,
self-learning from a numeral seed, linear CKA against the HSIC formula."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes

from workbench import geometry as ac
from workbench.errors import ConfigError


def _planted(n=500, d=20, sigma=0.05, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, d))
    Q = ac.random_rotation(d, seed + 1)
    noise = sigma * rng.standard_normal((n, d))
    return A, Q, A @ Q + noise, noise


def test_procrustes_recovers_planted_map_at_noise_floor():
    A, Q, B, noise = _planted()
    R = ac.procrustes(A, B)
    assert np.allclose(R.T @ R, np.eye(20), atol=1e-10)
    residual = np.linalg.norm(A @ R - B)
    floor = np.linalg.norm(noise)
    # least squares over orthogonal maps: never worse than the planted map, and only by the
    # d(d-1)/2 fitted degrees of freedom better than it
    assert residual <= floor + 1e-9
    assert residual >= 0.95 * floor
    # the map itself, not just the fit: its error is the noise projected on the d(d-1)/2 rotation
    # directions, about sigma * sqrt(d(d-1) / (2n)) (= 0.031 here), and grows with the noise
    for sigma in (0.05, 0.5):
        A, Q, B, _ = _planted(sigma=sigma)
        expected = sigma * np.sqrt(20 * 19 / (2 * 500))
        assert 0.5 * expected < np.linalg.norm(ac.procrustes(A, B) - Q) < 2 * expected


def test_procrustes_convention_is_scipys_rows_mapped_by_right_multiplication():
    A, Q, B, noise = _planted(n=200, d=8, sigma=0.01, seed=3)
    R = ac.procrustes(A, B)
    assert np.allclose(R, orthogonal_procrustes(A, B)[0])
    assert np.linalg.norm(ac.apply_map(A, R) - B) < 1.01 * np.linalg.norm(noise)
    # the transpose (the inverse map) is wrong by a wide margin: a swapped convention fails here
    assert np.linalg.norm(A @ R.T - B) > 10 * np.linalg.norm(noise)
    assert np.linalg.norm(R - Q) < np.linalg.norm(R.T - Q) / 10


def test_procrustes_pads_a_narrow_space_into_a_wide_one():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((300, 6))
    Q = ac.random_rotation(10, 5)[:6]  # an isometric embedding of R^6 into R^10
    B = A @ Q
    R = ac.procrustes(A, B)
    assert R.shape == (10, 10)
    assert np.allclose(ac.apply_map(A, R), B, atol=1e-8)
    with pytest.raises(ConfigError):
        ac.procrustes(A, B[:-1])


def test_csls_equals_hand_computation_4x4():
    def unit(deg):
        return [np.cos(np.radians(deg)), np.sin(np.radians(deg))]

    X = np.array([unit(a) for a in (0, 90, 180, 270)])
    Y = np.array([unit(a) for a in (0, 45, 90, 180)])
    c = np.sqrt(0.5)
    cos = np.array([[1, c, 0, -1],
                    [0, c, 1, 0],
                    [-1, -c, 0, 1],
                    [0, -c, -1, 0]])
    # k = 2: mean of the two largest cosines of each source row (r_T) and target column (r_S)
    r_t = np.array([(1 + c) / 2, (1 + c) / 2, (1 + 0) / 2, (0 + 0) / 2])
    r_s = np.array([(1 + 0) / 2, (c + c) / 2, (1 + 0) / 2, (1 + 0) / 2])
    expected = 2 * cos - r_t[:, None] - r_s[None, :]
    got = ac.csls_matrix(X, Y, k=2)
    assert np.allclose(ac.cosine_matrix(X, Y), cos, atol=1e-12)
    assert np.allclose(got, expected, atol=1e-12)
    assert got[0, 0] == pytest.approx(1 - c / 2)  # 2 - (1 + c)/2 - 1/2
    # the hub y1 (cosine c to half the sources) is penalised: x0 prefers y0 by more under CSLS
    assert got[0, 0] - got[0, 1] > 2 * (cos[0, 0] - cos[0, 1])


def test_precision_at_k_with_several_gold_translations():
    ranked = np.array([[2, 0, 1, 3],
                       [1, 2, 0, 3],
                       [3, 1, 2, 0]])
    gold = [{0, 1}, {3}, {2, 3}]
    out = ac.precision_at_k(ranked, gold, ks=(1, 2, 3, 4))
    assert out[1].tolist() == [False, False, True]
    assert out[2].tolist() == [True, False, True]  # 0 in the first two of row 0
    assert out[3].tolist() == [True, False, True]
    assert out[4].tolist() == [True, True, True]
    assert out[1].mean() == pytest.approx(1 / 3)


def test_bli_counts_any_gold_translation_and_uses_all_targets():
    # 3 source words, 4 targets; source 0 has two translations (targets 0 and 1)
    X = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.1]])
    Y = np.array([[0.9, 0.1], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    res = ac.bli(X, Y, {0: {0, 1}, 1: {3}, 2: {3}}, method="cosine", ks=(1, 2))
    assert res.queries == [0, 1, 2]
    assert res.correct[1].tolist() == [True, False, True]
    assert res.p_at(1) == pytest.approx(2 / 3)


def test_lexicon_split_by_source_word_and_numeral_seed():
    lex = ac.Lexicon.from_word_pairs(["a", "b", "c", "1"], ["x", "y", "z", "1"],
                                     [("a", "x"), ("a", "y"), ("b", "z"), ("c", "q"), ("1", "1")])
    assert lex.pairs == [(0, 0), (0, 1), (1, 2), (3, 3)]  # (c, q): q not in the vocabulary
    train, test = lex.split(0.34, seed=0)
    assert len(test) == 1
    (s,) = test
    assert all(src != s for src, _ in train)  # both translations of a test word are held out
    assert test[s] == lex.gold()[s]
    assert ac.identical_seed(["1", "dos", "1990", "casa"], ["casa", "1990", "1"]) == [(0, 2), (2, 1)]
    assert ac.identical_seed(["1", "casa"], ["casa", "1"], numerals_only=False) == [(0, 1), (1, 0)]


def test_self_learning_from_numeral_seed_recovers_planted_mapping():
    rng = np.random.default_rng(0)
    n, d, n_num = 400, 32, 10
    X = rng.standard_normal((n, d))
    Q = ac.random_rotation(d, 100)
    perm = rng.permutation(n)  # source word i is target word perm[i]
    Y = np.empty_like(X)
    Y[perm] = X @ Q + 0.05 * rng.standard_normal((n, d))
    src = [str(i) if i < n_num else f"s{i}" for i in range(n)]
    tgt = [""] * n
    for i in range(n):
        tgt[perm[i]] = src[i] if i < n_num else f"t{i}"
    seed = ac.identical_seed(src, tgt)
    assert len(seed) == n_num

    def accuracy(R):
        return float((np.argmax(ac.csls_matrix(ac.apply_map(X, R), Y), axis=1) == perm).mean())

    s, t = zip(*seed)
    seed_only = accuracy(ac.procrustes(X[list(s)], Y[list(t)]))
    result = ac.self_learning(X, Y, seed, n_iter=20)
    assert seed_only < 0.5  # 10 pairs cannot pin down 32 dimensions
    assert accuracy(result.R) == 1.0
    assert np.linalg.norm(result.R - Q) < 0.1
    assert sorted(result.pairs) == sorted((i, int(perm[i])) for i in range(n))
    assert result.history[-1] == n


def test_random_rotation_baseline_is_orthogonal_and_at_chance():
    A, Q, B, _ = _planted(n=300, d=20)
    R = ac.random_rotation(20, seed=7)
    assert np.allclose(R @ R.T, np.eye(20), atol=1e-10)
    assert not np.allclose(R, ac.random_rotation(20, seed=8))
    assert ac.retrieval_accuracy(A @ R, B, "cosine").mean() < 0.05
    assert ac.retrieval_accuracy(A @ ac.procrustes(A, B), B, "csls").mean() == 1.0


def test_linear_cka():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((60, 12)) @ rng.standard_normal((12, 12))
    Y = X[:, :5] @ rng.standard_normal((5, 9)) + 0.5 * rng.standard_normal((60, 9))
    assert ac.linear_cka(X, X) == pytest.approx(1.0)
    Q = ac.random_rotation(12, 3)
    assert ac.linear_cka(X @ Q * 7.5 + 3.0, Y) == pytest.approx(ac.linear_cka(X, Y))  # rotation, scale, shift
    # not invariant to a generic invertible linear map (Kornblith et al. 2019's point)
    M = rng.standard_normal((12, 12))
    assert abs(ac.linear_cka(X @ M, Y) - ac.linear_cka(X, Y)) > 1e-3

    def hsic(K, L):  # Gretton et al. 2005, biased estimator with the centring matrix H
        n = len(K)
        H = np.eye(n) - np.ones((n, n)) / n
        return np.trace(K @ H @ L @ H) / (n - 1) ** 2

    K, L = X @ X.T, Y @ Y.T
    direct = hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))
    assert ac.linear_cka(X, Y) == pytest.approx(direct, rel=1e-10)
    # the Gram route (n < width) and the feature route agree
    Xw, Yw = X[:8], Y[:8]
    Kw, Lw = Xw @ Xw.T, Yw @ Yw.T
    assert ac.linear_cka(Xw, Yw) == pytest.approx(hsic(Kw, Lw) / np.sqrt(hsic(Kw, Kw) * hsic(Lw, Lw)))
    assert 0 < ac.linear_cka(X, rng.standard_normal((60, 9))) < 0.5
    m = ac.cka_matrix([X, Y], [X, Y])
    assert m.shape == (2, 2) and m[0, 0] == pytest.approx(1) and m[0, 1] == pytest.approx(m[1, 0])


def _hsic_cka(X, Y):  # reference: Gretton et al.'s biased HSIC with the centring matrix, linear kernels
    n = len(X)
    H = np.eye(n) - np.ones((n, n)) / n
    K, L = X @ X.T, Y @ Y.T
    hsic = lambda A, B: np.trace(A @ H @ B @ H)  # noqa: E731
    return hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))


def test_standardized_cka_recovers_structure_hidden_by_a_massive_dimension():
    rng = np.random.default_rng(7)
    n = 400
    Z = rng.standard_normal((n, 6))  # the structure both representations share
    X = Z @ rng.standard_normal((6, 20)) + 0.3 * rng.standard_normal((n, 20))
    Y = Z @ rng.standard_normal((6, 16)) + 0.3 * rng.standard_normal((n, 16))
    base = ac.linear_cka(X, Y)
    assert base > 0.6
    # one extra dimension of Y varies over the examples ~1000x more than the others and carries
    # nothing shared (Sun et al. 2024's massive activations / a rogue dimension): linear CKA collapses
    rogue = 1000.0 * np.abs(rng.standard_normal((n, 1)))
    Ym = np.hstack([Y, rogue])
    assert ac.top_dimension_variance_share(Ym) > 0.99
    assert ac.linear_cka(X, Ym) < 0.05
    # the standardised variant sees it as one of 17 dimensions and recovers the structure
    robust = ac.linear_cka(X, Ym, standardize=True)
    assert robust > 0.5 and robust == pytest.approx(ac.linear_cka(X, Y, standardize=True), abs=0.1)
    # a massive dimension that is constant over the examples is removed by centring in both variants
    Yc = np.hstack([Y, np.full((n, 1), 1e4)])
    assert ac.linear_cka(X, Yc) == pytest.approx(base) and ac.linear_cka(X, Yc, standardize=True) == pytest.approx(
        ac.linear_cka(X, Y, standardize=True))
    # reference computation: z-scored columns (population sd) through the HSIC formula
    zs = lambda A: (A - A.mean(0)) / A.std(0)  # noqa: E731
    assert ac.linear_cka(X, Ym, standardize=True) == pytest.approx(_hsic_cka(zs(X), zs(Ym)), rel=1e-10)
    assert ac.linear_cka(X[:10], Ym[:10], standardize=True) == pytest.approx(_hsic_cka(zs(X[:10]), zs(Ym[:10])),
                                                                            rel=1e-10)  # the n < width route
    # identical features give 1 (and any per-dimension rescaling of them too); independent ones near 0
    assert ac.linear_cka(Ym, Ym, standardize=True) == pytest.approx(1.0)
    assert ac.linear_cka(Ym * rng.uniform(0.01, 100, 17), Ym, standardize=True) == pytest.approx(1.0)
    W = rng.standard_normal((n, 16))
    independent = ac.linear_cka(X, W, standardize=True)
    assert independent == pytest.approx(_hsic_cka(zs(X), zs(W)), rel=1e-10) and independent < 0.1
    # a constant column stays zero instead of dividing by zero
    assert ac.linear_cka(np.hstack([X, np.ones((n, 1))]), Y, standardize=True) == pytest.approx(
        ac.linear_cka(X, Y, standardize=True))
    m = ac.cka_matrix([X], [Y, Ym], standardize=True)
    assert m.shape == (1, 2) and m[0, 1] == pytest.approx(robust)
    assert ac.top_dimension_variance_share(rng.standard_normal((4000, 10))) == pytest.approx(0.1, abs=0.02)


def test_procrustes_retrieval_matrix_peaks_on_the_matching_layer():
    rng = np.random.default_rng(2)
    layers = [rng.standard_normal((200, 16)) for _ in range(3)]
    other = [layers[0] @ ac.random_rotation(16, 1) + 0.05 * rng.standard_normal((200, 16)),
             rng.standard_normal((200, 16))]
    train, test = np.arange(100), np.arange(100, 200)
    m = ac.procrustes_retrieval_matrix(layers, other, train, test)
    assert m.shape == (3, 2)
    assert m[0, 0] == 1.0
    assert m[1, 0] < 0.1 and m[0, 1] < 0.1


def test_retrieval_counts_ties_with_identical_rows_as_hits():
    X = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert ac.retrieval_accuracy(X, X, "cosine").tolist() == [True, True, True]
    Y = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1]])
    assert ac.retrieval_accuracy(X, Y, "cosine").tolist() == [True, False, False]
