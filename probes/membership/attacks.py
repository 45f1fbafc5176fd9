"""Membership-inference math: attack scores, LiRA, metrics, length-matched samples (numpy/scipy/sklearn only).

Sign convention, once for the whole probe: every score returned here is a MEMBERSHIP score,
higher = more likely a member. The reference implementations use the opposite sign for some
attacks (MIMIR returns loss-like values, lower = member; tensorflow-privacy's LiRA scores are
lower = member); each function says how its value relates to theirs, so an AUC computed on our
score equals theirs computed with their convention (`roc_auc_score(is_member, -their_score)`).

Attacks (per example; `logprobs` = the scored tokens' natural-log probabilities):
- LOSS (Yeom et al. 2018): -mean token NLL.                          MIMIR LOSSAttack = +NLL.
- zlib (Carlini et al. 2021): -(NLL / zlib-compressed length in bytes). MIMIR ZLIBAttack = NLL / zlib.
- reference_diff (Watson et al. 2022's difficulty calibration; MIMIR's "ref"): reference NLL - target NLL.
                                                                     MIMIR ReferenceAttack = target - ref.
- reference_ratio (Carlini et al. 2021, Sec. 6.2: the ratio of log-perplexities, target / reference):
  -(target NLL / reference NLL) (a mean token NLL is a log-perplexity). `reference` is the old name
  of reference_diff (what the probe computed before the two were told apart), kept as an alias.
- Min-K% Prob (Shi et al. 2023): mean of the lowest k% token log-probs. MIMIR MinKProbAttack = -that.
- Min-K%++ (Zhang et al. 2024): mean of the lowest k% of (log p(x_t) - mu_t) / sigma_t, where mu_t,
  sigma_t are the mean and deviation of log p(z) for z ~ p(. | x_<t).
- LiRA (Carlini et al. 2022) on a logit-scaled confidence phi (`scaled_logit_*`):
  online  = log N(phi; mu_in, sd_in) - log N(phi; mu_out, sd_out)   (tf-privacy compute_score_lira = -this)
  offline = log Pr[Z <= phi], Z ~ N(mu_out, sd_out)                  (paper's one-sided test; monotone in
            tf-privacy's offline (phi - mu_out) / sd_out, its sign=-1 score being the negative)
  centres are per-example medians of the shadow statistics; deviations per example, or with
  `fix_variance` one global deviation (as Carlini et al.'s code: the std of all IN / all OUT values).
  `equal_counts` (our addition, off by default): when the target is a model of a balanced shadow set
  (each example IN for exactly ceil(N/2) models, Carlini et al.'s `keep` design), the shadows'
  membership is tied to the target's (N = 9: a target member has 4 IN / 4 OUT shadows, a target
  non-member 5 IN / 3 OUT), and with per-model offsets of phi the smaller group's noisier median
  biases online LiRA below 0.5 without any memorisation (simulated: AUC 0.446 per-example, 0.477
  fixed deviation, over 40 draws; 0.50 with independent keeps). `equal_shadow_counts` drops shadows
  at random (seeded) so that every example has the same numbers of IN and OUT shadows (the minimum
  over examples), which removes the tie (simulated: 0.502).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
from scipy import stats
from sklearn.metrics import roc_curve

from probes.core.statistics import auc_bootstrap

MINK_RATIOS = (0.05, 0.1, 0.2, 0.3, 0.5)
DEFAULT_K = 0.2
FPR_POINTS = (0.01, 0.001)


# --------------------------------------------------------------------------- per-example statistics
def mean_nll(logprobs: np.ndarray) -> float:
    """Mean negative log-likelihood per scored token (MIMIR's `loss`)."""
    lp = np.asarray(logprobs, dtype=np.float64)
    if lp.size == 0:
        raise ValueError("no scored tokens")
    return float(-lp.mean())


def zlib_length(text: str) -> int:
    """Bytes of the zlib-compressed UTF-8 text (MIMIR's zlib entropy; default compression level)."""
    return len(zlib.compress(text.encode("utf-8")))


def loss_score(nll: np.ndarray) -> np.ndarray:
    return -np.asarray(nll, dtype=np.float64)


def zlib_score(nll: np.ndarray, texts) -> np.ndarray:
    lengths = np.array([zlib_length(t) for t in texts], dtype=np.float64)
    return -np.asarray(nll, dtype=np.float64) / lengths


def reference_diff_score(nll_target: np.ndarray, nll_reference: np.ndarray) -> np.ndarray:
    """Reference NLL - target NLL: the target's loss calibrated by how hard a reference model trained
    on other data finds the text (Watson et al. 2022; MIMIR's ReferenceAttack = target - ref)."""
    return np.asarray(nll_reference, dtype=np.float64) - np.asarray(nll_target, dtype=np.float64)


def reference_ratio_score(nll_target: np.ndarray, nll_reference: np.ndarray) -> np.ndarray:
    """-(log ppl_target / log ppl_reference): Carlini et al. 2021's ratio of log-perplexities (Sec. 6.2,
    "Comparing to Other Neural Language Models"), where a mean token NLL is the log-perplexity; a member
    has a small ratio, so the membership score is its negative."""
    ref = np.asarray(nll_reference, dtype=np.float64)
    if (ref <= 0).any():
        raise ValueError("reference_ratio needs a positive reference NLL (a log-perplexity) for every text")
    return -np.asarray(nll_target, dtype=np.float64) / ref


reference_score = reference_diff_score  # the old name (before reference_ratio existed): same function


def _lowest_k_mean(values: np.ndarray, k: float) -> float:
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = max(1, int(len(v) * k))  # MIMIR: int(len * k); at least one token
    return float(v[:n].mean())


def mink_score(logprobs: np.ndarray, k: float = DEFAULT_K) -> float:
    """Min-K% Prob of one text: the mean of its lowest k-fraction token log-probabilities."""
    if not 0 < k <= 1:
        raise ValueError(f"k must be in (0, 1], got {k}")
    return _lowest_k_mean(logprobs, k)


def minkpp_score(logprobs: np.ndarray, mu: np.ndarray, sigma: np.ndarray, k: float = DEFAULT_K) -> float:
    """Min-K%++ of one text: mean of the lowest k-fraction of (log p - mu) / sigma per token."""
    if not 0 < k <= 1:
        raise ValueError(f"k must be in (0, 1], got {k}")
    z = (np.asarray(logprobs, np.float64) - np.asarray(mu, np.float64)) / np.maximum(np.asarray(sigma, np.float64), 1e-12)
    return _lowest_k_mean(z, k)


def scaled_logit_from_mean_logprob(mean_logprob: np.ndarray) -> np.ndarray:
    """LiRA's logit scaling for a text: p = exp(mean token log-prob) (the geometric-mean token
    probability), phi = log p - log(1 - p), computed stably."""
    lp = np.minimum(np.asarray(mean_logprob, dtype=np.float64), -1e-12)
    return lp - np.log(-np.expm1(lp))


def scaled_logit_from_logits(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """LiRA's logit scaling for a classifier (Carlini et al. 2022, Sec. VI-A): phi = log p_y - log(1 - p_y)
    = z_y - logsumexp(z_other), from the raw logits (stable where p_y is near 1)."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    zy = z[np.arange(len(y)), y]
    others = z.copy()
    others[np.arange(len(y)), y] = -np.inf
    m = others.max(1)
    lse = m + np.log(np.exp(others - m[:, None]).sum(1))
    return zy - lse


# --------------------------------------------------------------------------- LiRA
def _centre_and_sd(stat: np.ndarray, mask: np.ndarray, fix_variance: bool) -> tuple[np.ndarray, np.ndarray]:
    x = np.where(mask, stat, np.nan)
    with np.errstate(all="ignore"):
        centre = np.nanmedian(x, axis=1)
        sd = np.full(len(x), np.nanstd(x)) if fix_variance else np.nanstd(x, axis=1)
    return centre, sd


def lira_online(target: np.ndarray, shadow_stats: np.ndarray, in_mask: np.ndarray, out_mask: np.ndarray | None = None,
                fix_variance: bool = False, eps: float = 1e-30) -> np.ndarray:
    """Online LiRA: per example i, Gaussians fitted to the shadow statistics of models that trained on
    it (IN) and that did not (OUT); score = log N(target; IN) - log N(target; OUT) (higher = member).

    shadow_stats, in_mask, out_mask: [n_examples, n_shadows] (out_mask default ~in_mask; a shadow
    whose pool lacks the example is neither); an example needs >= 1 IN and >= 1 OUT shadow (with
    one, the per-example deviation is 0: use fix_variance)."""
    target, shadow_stats, in_mask, out_mask = _lira_inputs(target, shadow_stats, in_mask, out_mask)
    if (in_mask.sum(1) < 1).any() or (out_mask.sum(1) < 1).any():
        raise ValueError("online LiRA needs at least one IN and one OUT shadow model for every example")
    mu_in, sd_in = _centre_and_sd(shadow_stats, in_mask, fix_variance)
    mu_out, sd_out = _centre_and_sd(shadow_stats, out_mask, fix_variance)
    return stats.norm.logpdf(target, mu_in, sd_in + eps) - stats.norm.logpdf(target, mu_out, sd_out + eps)


def lira_offline(target: np.ndarray, shadow_stats: np.ndarray, in_mask: np.ndarray, out_mask: np.ndarray | None = None,
                 fix_variance: bool = False, eps: float = 1e-30) -> np.ndarray:
    """Offline LiRA: only the OUT shadows; score = log Pr[Z <= target], Z ~ N(OUT) (higher = member:
    the target model is more confident on x than models that never saw it)."""
    target, shadow_stats, in_mask, out_mask = _lira_inputs(target, shadow_stats, in_mask, out_mask)
    if (out_mask.sum(1) < 1).any():
        raise ValueError("offline LiRA needs at least one OUT shadow model for every example")
    mu_out, sd_out = _centre_and_sd(shadow_stats, out_mask, fix_variance)
    return stats.norm.logcdf(target, mu_out, sd_out + eps)


def equal_shadow_counts(in_mask: np.ndarray, out_mask: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """IN/OUT masks [n_examples, n_shadows] thinned at random (seeded) to the same number of IN and
    of OUT shadows for every example: the minimum count over examples of each (module docstring)."""
    in_mask, out_mask = np.asarray(in_mask, bool).copy(), np.asarray(out_mask, bool).copy()
    rng = np.random.default_rng(seed)
    for mask in (in_mask, out_mask):
        k = int(mask.sum(1).min())
        for i in np.nonzero(mask.sum(1) > k)[0]:
            on = np.nonzero(mask[i])[0]
            mask[i, rng.choice(on, len(on) - k, replace=False)] = False
    return in_mask, out_mask


def _lira_inputs(target, shadow_stats, in_mask, out_mask):
    target = np.asarray(target, dtype=np.float64)
    shadow_stats = np.asarray(shadow_stats, dtype=np.float64)
    in_mask = np.asarray(in_mask, dtype=bool)
    out_mask = ~in_mask if out_mask is None else np.asarray(out_mask, dtype=bool)
    if (shadow_stats.shape != in_mask.shape or out_mask.shape != in_mask.shape or shadow_stats.ndim != 2
            or len(target) != len(shadow_stats)):
        raise ValueError(f"shapes differ: target {target.shape}, shadow_stats {shadow_stats.shape}, "
                         f"in_mask {in_mask.shape}, out_mask {out_mask.shape}")
    if (in_mask & out_mask).any():
        raise ValueError("a shadow model is both IN and OUT for an example")
    return target, shadow_stats, in_mask, out_mask


# --------------------------------------------------------------------------- metrics
@dataclass
class RocResult:
    """Metrics of one attack: AUC with a bootstrap CI, TPR at low FPR, balanced accuracy, ROC points."""

    auc: float
    auc_ci: tuple[float, float]
    tpr_at: dict[float, float]
    fp_allowed: dict[float, int]  # non-members that may score above the threshold at that FPR
    balanced_accuracy: float
    n_members: int
    n_nonmembers: int
    fpr: np.ndarray = field(repr=False)
    tpr: np.ndarray = field(repr=False)

    def fpr_note(self, at: float) -> str:
        """What a TPR at FPR `at` rests on, in words (0.1% of 1,000 non-members is one example)."""
        k = self.fp_allowed[at]
        if k == 0:
            return f"no false positive allowed among {self.n_nonmembers} non-members (TPR at FPR 0)"
        if k == 1:
            return f"one non-member ({at:g} of {self.n_nonmembers}): the threshold is a single example"
        return f"{k} non-members of {self.n_nonmembers}"


def roc_metrics(scores: np.ndarray, is_member: np.ndarray, n_boot: int = 1000, seed: int = 0,
                fprs=FPR_POINTS, units=None) -> RocResult:
    """ROC metrics of membership scores (higher = member) against the ground truth.

    AUC and its CI: `probes.core.statistics.auc_bootstrap`, resampling `units` (the document of each
    example: passages of one document are correlated, and membership is decided per document, so
    resampling passages gives intervals that are too narrow); None: every example is its own unit.
    TPR at FPR x: the highest TPR of a threshold whose FPR <= x (Carlini et al. 2022's Table);
    it rests on floor(x * n_nonmembers) non-members. Balanced accuracy: at the best threshold,
    (1 + max(TPR - FPR)) / 2, optimistic like tf-privacy's attacker advantage (threshold seen)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(is_member, dtype=bool)
    if not np.isfinite(s).all():
        raise ValueError("membership scores must be finite")
    pos, neg = np.nonzero(y)[0], np.nonzero(~y)[0]
    if len(pos) == 0 or len(neg) == 0:
        raise ValueError("need both members and non-members")
    auc, lo, hi = auc_bootstrap(s, y, units=units, n_boot=n_boot, seed=seed)
    fpr, tpr, _ = roc_curve(y, s)
    tpr_at = {x: float(tpr[fpr <= x].max()) for x in fprs}
    fp_allowed = {x: int(np.floor(x * len(neg) + 1e-9)) for x in fprs}
    bal = float((1 + np.max(tpr - fpr)) / 2)
    return RocResult(float(auc), (float(lo), float(hi)), tpr_at, fp_allowed, bal, len(pos), len(neg), fpr, tpr)


def roc_points(result: RocResult, max_points: int = 200) -> list[tuple[float, float]]:
    """The ROC curve thinned to at most `max_points` (first and last kept), for storing with the rows."""
    idx = np.unique(np.round(np.linspace(0, len(result.fpr) - 1, min(max_points, len(result.fpr)))).astype(int))
    return [(float(result.fpr[i]), float(result.tpr[i])) for i in idx]


# --------------------------------------------------------------------------- samples
def length_matched(member_lengths, nonmember_lengths, n_max: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (members, non-members) of equal-size samples with identical length histograms:
    within each length, min(#members, #non-members) of each are drawn (seeded); then pairs are
    thinned to `n_max` per side. Lengths are integers (words of a passage) or any sortable keys
    (e.g. "source|words" to match on both)."""
    ml, nl = np.asarray(member_lengths), np.asarray(nonmember_lengths)
    rng = np.random.default_rng(seed)
    pairs_m, pairs_n = [], []
    for length in np.intersect1d(ml, nl):
        a, b = np.nonzero(ml == length)[0], np.nonzero(nl == length)[0]
        k = min(len(a), len(b))
        pairs_m.append(rng.choice(a, k, replace=False))
        pairs_n.append(rng.choice(b, k, replace=False))
    if not pairs_m:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pm, pn = np.concatenate(pairs_m), np.concatenate(pairs_n)
    if n_max is not None and len(pm) > n_max:
        keep = rng.choice(len(pm), n_max, replace=False)
        pm, pn = pm[keep], pn[keep]
    return np.sort(pm), np.sort(pn)


def rank_in_group(groups, seed: int) -> np.ndarray:
    """Per item, its place (0, 1, ...) among its group's items in a seeded random order: keeping the
    items of rank < c keeps a random c of every group (nested as c grows)."""
    groups = np.asarray(groups)
    rank = np.empty(len(groups), np.int64)
    seen: dict = {}
    for i in np.random.default_rng(seed).permutation(len(groups)):
        rank[i] = seen.get(groups[i], 0)
        seen[groups[i]] = rank[i] + 1
    return rank


def capped_length_matched(member_keys, nonmember_keys, member_groups, nonmember_groups, n: int | None,
                          seed: int) -> tuple[np.ndarray, np.ndarray, int | None]:
    """`length_matched` on passages capped at c per document on BOTH sides, c the smallest cap that
    still fills n pairs (None: no cap was needed or none suffices). Why: the held-out split has ~9x
    fewer documents, so an uncapped draw takes several passages of each held-out document (1,000
    non-members from ~230 documents); a cap spreads both groups over more documents, and applying
    the same cap to both keeps them drawn the same way (each document contributes in proportion to
    min(its passages, c) in either group; spreading only the non-members would let document length,
    and the topics that go with it, tell the groups apart). Returns (members, non-members, c)."""
    mk, nk = np.asarray(member_keys), np.asarray(nonmember_keys)
    m_rank, n_rank = rank_in_group(member_groups, seed), rank_in_group(nonmember_groups, seed + 1)

    def draw(cap):
        m_ok, n_ok = np.nonzero(m_rank < cap)[0], np.nonzero(n_rank < cap)[0]
        im, inn = length_matched(mk[m_ok], nk[n_ok], n, seed)
        return m_ok[im], n_ok[inn]

    top = int(max(m_rank.max(initial=0), n_rank.max(initial=0))) + 1  # no cap at all
    if n is None or len(draw(top)[0]) < n:
        return (*length_matched(mk, nk, n, seed), None)
    low, high = 1, top  # pairs grow with the cap: the smallest cap that fills n, by bisection
    while low < high:
        mid = (low + high) // 2
        if len(draw(mid)[0]) >= n:
            high = mid
        else:
            low = mid + 1
    return (*draw(low), low if low < top else None)


def grouped_split(groups, labels, seed: int, test_fraction: float = 0.5) -> np.ndarray:
    """Train mask of a seeded train/test split that keeps every group (document) on one side and is
    stratified by label: per label, the groups are permuted and taken into train until half of
    that label's items are in (Scikit-learn's GroupShuffleSplit, stratified by hand, as membership
    is a property of the group). Passages of one document share topic and style: split at random,
    a probe can learn the documents of its test half from their other passages (issue 26's audit:
    a model-free TF-IDF classifier read AUC 0.53 that way). A group whose items carry different
    labels is an error."""
    groups, labels = np.asarray(groups), np.asarray(labels)
    if len(groups) != len(labels):
        raise ValueError(f"grouped_split: {len(groups)} groups for {len(labels)} labels")
    if not 0 < test_fraction < 1:
        raise ValueError(f"grouped_split: test_fraction must lie in (0, 1), got {test_fraction}")
    names, index = np.unique(groups, return_inverse=True)
    per_group_labels = [np.unique(labels[index == g]) for g in range(len(names))]
    mixed = [names[g] for g, l in enumerate(per_group_labels) if len(l) > 1]
    if mixed:
        raise ValueError(f"grouped_split: group(s) with more than one label, e.g. {list(mixed[:3])}")
    group_label = np.array([l[0] for l in per_group_labels])
    sizes = np.bincount(index, minlength=len(names))
    rng = np.random.default_rng(seed)
    train_groups = np.zeros(len(names), bool)
    for label in np.unique(group_label):
        candidates = rng.permutation(np.nonzero(group_label == label)[0])
        target = (1 - test_fraction) * sizes[candidates].sum()
        taken = np.cumsum(sizes[candidates])
        n_take = int(np.searchsorted(taken, target, side="left")) + 1  # until >= the target share
        n_take = min(max(n_take, 1), len(candidates) - 1) if len(candidates) > 1 else len(candidates)
        train_groups[candidates[:n_take]] = True
    return train_groups[index]


def tfidf_control_scores(texts, is_member, train, seed: int = 0) -> np.ndarray:
    """A model-free membership classifier: TF-IDF word features + logistic regression, fitted on the
    `train` items, membership scores (log-odds) of the others. It sees only the texts, so any AUC
    above chance it reaches is the sample's composition (topic, style, source of the two groups),
    not the model's memory: the control of the layer probe, which should sit at chance with a
    split by document (issue 26's audit). Defaults of scikit-learn's TfidfVectorizer and
    LogisticRegression (C = 1)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    texts = list(texts)
    y = np.asarray(is_member, dtype=bool)
    train = np.asarray(train, dtype=bool)
    vec = TfidfVectorizer()
    x_train = vec.fit_transform([t for t, k in zip(texts, train) if k])
    clf = LogisticRegression(max_iter=1000, random_state=seed).fit(x_train, y[train])
    return clf.decision_function(vec.transform([t for t, k in zip(texts, train) if not k]))


def length_summary(lengths) -> dict:
    """n, mean and quantiles of a length distribution (reported for members and non-members)."""
    v = np.asarray(lengths, dtype=np.float64)
    if v.size == 0:
        return {"n": 0}
    q = np.percentile(v, [0, 25, 50, 75, 100])
    return {"n": int(v.size), "mean": round(float(v.mean()), 3),
            "min": float(q[0]), "q25": float(q[1]), "median": float(q[2]), "q75": float(q[3]), "max": float(q[4])}
