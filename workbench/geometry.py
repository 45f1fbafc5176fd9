"""Aligning two vector spaces: orthogonal Procrustes, CSLS retrieval, BLI, self-learning, linear CKA.

Pure numpy/scipy on row-matrices (one row per word, sentence or example); nothing here knows about
models, runners or the results store, so the cross-lingual probe, the PEFT sweep's CKA to the start
and the diagnostics share it (it sits in the library, below drivers and probes alike).

- `procrustes(A, B)`: the orthogonal R minimising ||A R - B||_F (Schönemann 1966; used for word
  translation by Xing et al. 2015 and Conneau et al. 2018). Rows of A are mapped: `A @ R ≈ B`,
  the convention of `scipy.linalg.orthogonal_procrustes(A, B)`. When the two spaces have different
  widths, the narrower one is zero-padded, which makes R an isometric embedding of the narrow space
  into the wide one (a deliberate extension: the papers align equal widths).
- `similarity(X, Y, method)`: cosine, or CSLS = 2 cos(x, y) - r_T(x) - r_S(y) with r the mean cosine
  to the k nearest neighbours in the other space (Conneau et al. 2018, k = 10), which penalises
  "hubs" that are near everything.
- `precision_at_k`: bilingual lexicon induction (BLI) P@k, a source word counting as correct when
  any of its gold translations is among its k best candidates (the MUSE evaluation).
- `self_learning`: Artetxe et al. (2017): start from a tiny seed dictionary (shared numerals,
  identical strings, or given pairs), fit R, re-induce the dictionary, repeat; the dictionary is
  induced from mutual nearest neighbours under CSLS as in MUSE's refinement (Conneau et al. 2018).
- `linear_cka`: linear centred kernel alignment (Kornblith et al. 2019), an alignment-free
  similarity between two representations of the same n examples, invariant to orthogonal maps
  and isotropic scaling (but not to arbitrary invertible linear maps).
  `linear_cka(..., standardize=True)` z-scores every dimension first, the scale-robust variant for
  models with rogue or massive dimensions (Timkey & van Schijndel 2021; Sun et al. 2024);
  `top_dimension_variance_share` says when a layer needs it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
from scipy.linalg import orthogonal_procrustes

from workbench.errors import ConfigError

METHODS = ("cosine", "csls")
_NUMERAL = re.compile(r"\d+(?:[.,:]\d+)*\Z")


# --------------------------------------------------------------------------- preprocessing


def normalize(X: np.ndarray, center: bool = False, unit: bool = True) -> np.ndarray:
    """Optional mean centring, then optional unit length per row (the 'unit + center' of
    Artetxe et al. 2018's normalisation; zero rows stay zero). Returns a new float64 array."""
    X = np.array(X, dtype=np.float64, copy=True)
    if X.ndim != 2:
        raise ConfigError(f"expected a 2-d matrix of row vectors, got shape {X.shape}")
    if center:
        X -= X.mean(axis=0, keepdims=True)
    if unit:
        norms = np.linalg.norm(X, axis=1, keepdims=True)
        X /= np.where(norms > 0, norms, 1.0)
    return X


def _pad(X: np.ndarray, width: int) -> np.ndarray:
    if X.shape[1] == width:
        return X
    return np.hstack([X, np.zeros((X.shape[0], width - X.shape[1]), dtype=X.dtype)])


def pad_to_common(A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zero-pad the narrower of two row-matrices to the wider's width."""
    w = max(A.shape[1], B.shape[1])
    return _pad(A, w), _pad(B, w)


# --------------------------------------------------------------------------- Procrustes


def procrustes(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Orthogonal R (width x width) with `A @ R ≈ B` for paired rows A[i] <-> B[i].

    R = U V^T from the SVD of A^T B (scipy's convention). Widths may differ; see `pad_to_common`.
    Apply it with `apply_map(X, R)`, which pads X the same way.
    """
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    if A.ndim != 2 or B.ndim != 2 or A.shape[0] != B.shape[0]:
        raise ConfigError(f"procrustes needs paired row-matrices, got shapes {A.shape} and {B.shape}")
    if A.shape[0] == 0:
        raise ConfigError("procrustes needs at least one pair")
    A, B = pad_to_common(A, B)
    R, _ = orthogonal_procrustes(A, B)
    return R


def apply_map(X: np.ndarray, R: np.ndarray) -> np.ndarray:
    """X @ R, zero-padding X to R's width first."""
    X = np.asarray(X, dtype=np.float64)
    return _pad(X, R.shape[0]) @ R


def random_rotation(width: int, seed: int) -> np.ndarray:
    """A Haar-random orthogonal matrix (QR of a Gaussian with sign fix; Mezzadri 2007): the
    'random rotation' baseline for any learned map."""
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((width, width)))
    return q * np.sign(np.diag(r))


# --------------------------------------------------------------------------- retrieval


def cosine_matrix(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """[n_x, n_y] cosine similarities (zero rows give 0)."""
    X, Y = pad_to_common(np.asarray(X, dtype=np.float64), np.asarray(Y, dtype=np.float64))
    return normalize(X) @ normalize(Y).T


def _mean_topk(S: np.ndarray, k: int, axis: int) -> np.ndarray:
    """Mean of the k largest entries along `axis` (k capped at that axis's length)."""
    n = S.shape[axis]
    k = min(k, n)
    part = np.partition(S, n - k, axis=axis)
    top = part[n - k:] if axis == 0 else part[:, n - k:]
    return top.mean(axis=axis)


def csls_matrix(X: np.ndarray, Y: np.ndarray, k: int = 10) -> np.ndarray:
    """CSLS(x_i, y_j) = 2 cos(x_i, y_j) - r_T(x_i) - r_S(y_j) (Conneau et al. 2018, eq. 6), where
    r_T(x) is the mean cosine of x to its k nearest rows of Y and r_S(y) that of y to its k nearest
    rows of X. X is the (already mapped) source side."""
    if k < 1:
        raise ConfigError(f"CSLS k must be >= 1, got {k}")
    C = cosine_matrix(X, Y)
    r_t = _mean_topk(C, k, axis=1)  # per source row
    r_s = _mean_topk(C, k, axis=0)  # per target row
    return 2 * C - r_t[:, None] - r_s[None, :]


def similarity(X: np.ndarray, Y: np.ndarray, method: str = "csls", k: int = 10) -> np.ndarray:
    if method == "cosine":
        return cosine_matrix(X, Y)
    if method == "csls":
        return csls_matrix(X, Y, k)
    raise ConfigError(f"retrieval method must be one of {METHODS}, got {method!r}")


def top_k(S: np.ndarray, k: int) -> np.ndarray:
    """[n, min(k, n_y)] column indices of the k best scores per row, best first (ties: lower index)."""
    k = min(k, S.shape[1])
    order = np.argsort(-S, axis=1, kind="stable")
    return order[:, :k]


def precision_at_k(ranked: np.ndarray, gold: Sequence[Iterable[int]], ks: Sequence[int] = (1, 5, 10)) -> dict[int, np.ndarray]:
    """Per query, whether any gold target is among the first k ranked candidates.

    `ranked[i]` are candidate indices for query i, best first; `gold[i]` the set of correct ones
    (several translations allowed). Returns {k: bool array [n_queries]}; the mean is P@k.
    """
    ranked = np.asarray(ranked)
    if len(gold) != len(ranked):
        raise ConfigError(f"{len(ranked)} ranked queries but {len(gold)} gold sets")
    out = {}
    for k in ks:
        head = ranked[:, :k]
        out[int(k)] = np.array([bool(set(g) & set(row.tolist())) for g, row in zip(gold, head)], dtype=bool)
    return out


def retrieval_accuracy(X: np.ndarray, Y: np.ndarray, method: str = "csls", k: int = 10) -> np.ndarray:
    """Paired rows X[i] <-> Y[i]: bool per row whether Y[i] is X[i]'s best match among all rows of Y
    (sentence retrieval, model-to-model retrieval). A tie with the best counts as a hit: identical
    rows (the same word at the same position at layer 0, a repeated sentence) cannot be told apart."""
    S = similarity(X, Y, method, k)
    gold = S[np.arange(len(X)), np.arange(len(X))]
    return gold >= S.max(axis=1) - 1e-9


# --------------------------------------------------------------------------- dictionaries


@dataclass
class Lexicon:
    """A bilingual dictionary over two vocabularies: (source index, target index) pairs."""

    src_words: list[str]
    tgt_words: list[str]
    pairs: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def from_word_pairs(cls, src_words: Sequence[str], tgt_words: Sequence[str],
                        word_pairs: Iterable[tuple[str, str]]) -> "Lexicon":
        """Keep the pairs whose two words are both in the vocabularies (duplicates dropped)."""
        si = {w: i for i, w in enumerate(src_words)}
        ti = {w: i for i, w in enumerate(tgt_words)}
        seen, pairs = set(), []
        for a, b in word_pairs:
            if a in si and b in ti and (si[a], ti[b]) not in seen:
                seen.add((si[a], ti[b]))
                pairs.append((si[a], ti[b]))
        return cls(list(src_words), list(tgt_words), pairs)

    def sources(self) -> list[int]:
        """Distinct source indices in first-seen order."""
        return list(dict.fromkeys(s for s, _ in self.pairs))

    def gold(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for s, t in self.pairs:
            out.setdefault(s, set()).add(t)
        return out

    def split(self, test_fraction: float, seed: int) -> tuple[list[tuple[int, int]], dict[int, set[int]]]:
        """Split by SOURCE word (all translations of a word on one side): train pairs, test gold."""
        if not 0 < test_fraction < 1:
            raise ConfigError(f"test fraction must be in (0, 1), got {test_fraction}")
        src = self.sources()
        rng = np.random.default_rng(seed)
        perm = rng.permutation(len(src))
        n_test = max(1, int(round(test_fraction * len(src))))
        test = {src[i] for i in perm[:n_test]}
        gold = self.gold()
        train = [(s, t) for s, t in self.pairs if s not in test]
        return train, {s: gold[s] for s in src if s in test}


def identical_seed(src_words: Sequence[str], tgt_words: Sequence[str], numerals_only: bool = True) -> list[tuple[int, int]]:
    """Seed pairs of identically spelled words; with `numerals_only`, digit strings only
    ('1', '1990', '3,5'): the 25-pair numeral seed of Artetxe et al. (2017)."""
    ti = {w: i for i, w in enumerate(tgt_words)}
    return [(i, ti[w]) for i, w in enumerate(src_words)
            if w in ti and (not numerals_only or _NUMERAL.match(w))]


# --------------------------------------------------------------------------- BLI and self-learning


@dataclass
class BLIResult:
    correct: dict[int, np.ndarray]  # k -> bool per test source word
    queries: list[int]  # source indices evaluated, in order
    predictions: np.ndarray  # [n_queries, max k] target indices

    def p_at(self, k: int) -> float:
        return float(self.correct[k].mean()) if len(self.queries) else float("nan")


def bli(X: np.ndarray, Y: np.ndarray, gold: dict[int, set[int]], R: np.ndarray | None = None,
        method: str = "csls", k_csls: int = 10, ks: Sequence[int] = (1, 5, 10)) -> BLIResult:
    """Translate the test source words `gold` by retrieval over ALL rows of Y (after mapping X by R
    when given) and score P@k. CSLS's r_S is computed over all source rows, as in MUSE."""
    Xm = apply_map(X, R) if R is not None else np.asarray(X, dtype=np.float64)
    queries = sorted(gold)
    if not queries:
        raise ConfigError("no test words to evaluate")
    if method == "csls":
        C = cosine_matrix(Xm, Y)
        r_s = _mean_topk(C, k_csls, axis=0)
        Cq = C[queries]
        S = 2 * Cq - _mean_topk(Cq, k_csls, axis=1)[:, None] - r_s[None, :]
    else:
        S = similarity(Xm[queries], Y, method, k_csls)
    ranked = top_k(S, max(ks))
    return BLIResult(precision_at_k(ranked, [gold[q] for q in queries], ks), queries, ranked)


def mutual_nn(S: np.ndarray) -> list[tuple[int, int]]:
    """(i, j) with j the best column of row i and i the best row of column j."""
    fwd = np.argmax(S, axis=1)
    bwd = np.argmax(S, axis=0)
    return [(int(i), int(j)) for i, j in enumerate(fwd) if bwd[j] == i]


@dataclass
class SelfLearning:
    R: np.ndarray
    pairs: list[tuple[int, int]]  # the final induced dictionary
    history: list[int]  # dictionary size after each iteration


def self_learning(X: np.ndarray, Y: np.ndarray, seed_pairs: Sequence[tuple[int, int]], n_iter: int = 10,
                  k: int = 10, max_rank: int | None = None, keep_seed: bool = True) -> SelfLearning:
    """Artetxe et al. (2017) self-learning with MUSE's mutual-NN CSLS induction (Conneau et al. 2018).

    Each iteration fits R on the current dictionary and induces the next one as the mutual nearest
    neighbours under CSLS among the first `max_rank` rows of each side (rows are expected in
    frequency order, as both papers restrict induction to frequent words). With `keep_seed` the seed
    pairs stay in the dictionary (a deliberate, conservative choice for tiny vocabularies: Artetxe
    et al. replace it). Stops early when the dictionary stops changing.
    """
    if not seed_pairs:
        raise ConfigError("self-learning needs at least one seed pair")
    if n_iter < 1:
        raise ConfigError(f"n_iter must be >= 1, got {n_iter}")
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    ns = len(X) if max_rank is None else min(max_rank, len(X))
    nt = len(Y) if max_rank is None else min(max_rank, len(Y))
    pairs = sorted(set(map(tuple, seed_pairs)))
    history = []
    R = None
    for _ in range(n_iter):
        s_idx, t_idx = zip(*pairs)
        R = procrustes(X[list(s_idx)], Y[list(t_idx)])
        induced = mutual_nn(csls_matrix(apply_map(X[:ns], R), Y[:nt], k))
        new = set(induced) | (set(map(tuple, seed_pairs)) if keep_seed else set())
        new = sorted(new)
        history.append(len(new))
        if new == pairs:
            break
        pairs = new
    s_idx, t_idx = zip(*pairs)
    R = procrustes(X[list(s_idx)], Y[list(t_idx)])
    return SelfLearning(R, pairs, history)


# --------------------------------------------------------------------------- CKA


CKA_VARIANTS = ("linear", "standardized")


def linear_cka(X: np.ndarray, Y: np.ndarray, standardize: bool = False) -> float:
    """Linear CKA (Kornblith et al. 2019, eq. 5 in feature space):
    ||Y_c^T X_c||_F^2 / (||X_c^T X_c||_F ||Y_c^T Y_c||_F), columns centred. Rows are paired examples;
    the widths may differ.

    `standardize=True` also divides every column by its standard deviation (a constant column stays
    zero), i.e. CKA of the correlation-scaled features. Why: linear CKA weighs each direction by its
    variance, so a single dimension with most of a layer's variance decides the value on its own:
    Kornblith et al. note the index is dominated by the leading principal components, and Llama-style
    models have such dimensions (SmolLM2's layers 3-9: one of 576 dimensions holds 66-83% of the
    variance over words; Sun et al. 2024's "massive activations", Timkey & van Schijndel 2021's
    "rogue dimensions"; per-dimension standardisation is among the postprocessing fixes they
    recommend for similarity measures). The price: CKA is then no longer invariant to rotations of
    the feature space (only to per-dimension scale and shift), and a near-silent dimension counts as
    much as any other."""
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0]:
        raise ConfigError(f"CKA needs paired row-matrices, got shapes {X.shape} and {Y.shape}")
    X = X - X.mean(axis=0, keepdims=True)
    Y = Y - Y.mean(axis=0, keepdims=True)
    if standardize:
        X, Y = _unit_variance_columns(X), _unit_variance_columns(Y)
    # n x n Gram route when n is small relative to the widths (cheaper, same value)
    if X.shape[0] < max(X.shape[1], Y.shape[1]):
        K, L = X @ X.T, Y @ Y.T
        hsic, nx, ny = (K * L).sum(), np.linalg.norm(K), np.linalg.norm(L)
    else:
        hsic = np.linalg.norm(Y.T @ X) ** 2
        nx, ny = np.linalg.norm(X.T @ X), np.linalg.norm(Y.T @ Y)
    if nx == 0 or ny == 0:
        return float("nan")
    return float(hsic / (nx * ny))


def _unit_variance_columns(X: np.ndarray) -> np.ndarray:
    """Centred columns divided by their standard deviation; columns constant up to rounding (sd below
    1e-12 of the largest) are left as they are (zero after centring)."""
    sd = X.std(axis=0, keepdims=True)
    return X / np.where(sd > 1e-12 * sd.max(initial=0.0), sd, 1.0)


def cka_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], standardize: bool = False) -> np.ndarray:
    """[len(xs), len(ys)] linear CKA between every layer pair (model-to-model comparisons);
    `standardize`: the per-dimension z-scored variant (see `linear_cka`)."""
    return np.array([[linear_cka(x, y, standardize) for y in ys] for x in xs])


def top_dimension_variance_share(X: np.ndarray) -> float:
    """The largest single dimension's share of the total variance of X's columns (1/width when all
    dimensions vary alike, near 1 when one dimension dominates): the diagnostic saying when linear
    CKA reads one dimension rather than the representation (see `linear_cka`)."""
    v = np.asarray(X, dtype=np.float64).var(axis=0)
    total = float(v.sum())
    return float(v.max() / total) if total > 0 else float("nan")


def procrustes_retrieval_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], train: np.ndarray,
                                test: np.ndarray, method: str = "cosine", k: int = 10,
                                center: bool = True) -> np.ndarray:
    """[len(xs), len(ys)] retrieval accuracy on the `test` rows after a Procrustes map fitted on
    the `train` rows, for every layer pair (rows of x and y are the same examples)."""
    out = np.zeros((len(xs), len(ys)))
    for i, x in enumerate(xs):
        xn = normalize(x, center=center)
        for j, y in enumerate(ys):
            yn = normalize(y, center=center)
            R = procrustes(xn[train], yn[train])
            out[i, j] = retrieval_accuracy(apply_map(xn[test], R), yn[test], method, k).mean()
    return out


def cka_matrix_bootstrap(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], units: np.ndarray,
                         counts: Iterable[np.ndarray]) -> np.ndarray:
    """Linear CKA matrices [B, len(xs), len(ys)] on bootstrap resamples of the rows' `units` (e.g. the
    sentence of each word; rows of one unit enter a resample together). `counts` yields blocks of
    multinomial counts over the units (`probes.core.statistics.resample_counts`). Each layer's
    uncentred Gram matrix is computed once ([n, n]); a resample indexes it and centres it, which is
    the same value as `linear_cka` on the resampled rows (duplicated rows included)."""
    units = np.asarray(units)
    _, inverse = np.unique(units, return_inverse=True)
    members = [np.flatnonzero(inverse == u) for u in range(int(inverse.max()) + 1)] if len(units) else []
    grams_x = [(lambda a: a @ a.T)(np.asarray(x, dtype=np.float32)) for x in xs]
    grams_y = [(lambda a: a @ a.T)(np.asarray(y, dtype=np.float32)) for y in ys]

    def centred(K, idx):
        Kb = K[np.ix_(idx, idx)].astype(np.float64)
        r = Kb.mean(axis=0, keepdims=True)
        return Kb - r - r.T + Kb.mean()

    out = []
    for block in counts:
        for c in block:
            idx = np.concatenate([np.repeat(members[u], int(k)) for u, k in enumerate(c) if k > 0])
            kx = [centred(K, idx) for K in grams_x]
            ky = [centred(L, idx) for L in grams_y]
            nx = [np.linalg.norm(k) for k in kx]
            ny = [np.linalg.norm(k) for k in ky]
            out.append([[float(np.vdot(a, b) / (na * nb)) if na > 0 and nb > 0 else np.nan
                         for b, nb in zip(ky, ny)] for a, na in zip(kx, nx)])
    return np.array(out).reshape(-1, len(xs), len(ys))
