"""Bigram language-model baselines on a tokenizer's ids: the floor a trained causal LM must beat.

A GPT that has learned anything beyond adjacent-token statistics must have a held-out perplexity
below a well-smoothed bigram model fitted on the same training ids and scored on the same
held-out ids. Two smoothings (Chen & Goodman 1998):

- `add_k`: P(w | v) = (c(v, w) + k) / (c(v) + k V);
- `kneser_ney` (interpolated, one discount D): P(w | v) = max(c(v, w) - D, 0) / c(v)
  + D N1+(v •) / c(v) * P_cont(w), where P_cont(w) = N1+(• w) / N1+(• •) is the continuation
  unigram (in how many distinct contexts w appears), itself interpolated with the uniform
  distribution (weight `uniform_weight`) so that no id gets probability zero. A context never
  seen in training falls back to P_cont.

Streams are the `TokenizedCorpus.stream_with_separators()` ids (documents joined by the
separator, as the GPT's blocks are), so the bigram predicts exactly the tokens the GPT predicts
except the first token of each of the GPT's blocks, which has no left context inside its block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import sparse


@dataclass
class BigramScore:
    """Mean negative log-likelihood (nats) per predicted token, its perplexity, and counts."""

    nll: float
    perplexity: float
    n_predicted: int
    smoothing: str


def bigram_counts(ids: np.ndarray, vocab_size: int) -> sparse.csr_matrix:
    """Sparse [V, V] matrix of counts c(v, w) of adjacent pairs (v, w) in one id stream."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"ids must lie in [0, {vocab_size}), got range [{ids.min()}, {ids.max()}]")
    ones = np.ones(max(0, len(ids) - 1), dtype=np.float64)
    return sparse.csr_matrix((ones, (ids[:-1], ids[1:])), shape=(vocab_size, vocab_size))


def bigram_log_probs(
    train_ids: np.ndarray,
    eval_ids: np.ndarray,
    vocab_size: int,
    smoothing: str = "kneser_ney",
    k: float = 0.01,
    discount: float = 0.75,
    uniform_weight: float = 1e-3,
) -> np.ndarray:
    """log P(eval_ids[t] | eval_ids[t-1]) for t = 1..n-1 under a bigram fitted on `train_ids`."""
    counts = bigram_counts(train_ids, vocab_size)
    eval_ids = np.asarray(eval_ids, dtype=np.int64)
    prev, nxt = eval_ids[:-1], eval_ids[1:]
    pair = np.asarray(counts[prev, nxt]).ravel()
    ctx = np.asarray(counts.sum(axis=1)).ravel()[prev]
    if smoothing == "add_k":
        if k <= 0:
            raise ValueError(f"add_k needs k > 0, got {k}")
        return np.log((pair + k) / (ctx + k * vocab_size))
    if smoothing != "kneser_ney":
        raise ValueError(f"smoothing must be 'add_k' or 'kneser_ney', got {smoothing!r}")
    if not 0 < discount < 1:
        raise ValueError(f"discount must be in (0, 1), got {discount}")
    seen = counts.copy()
    seen.data[:] = 1.0
    types_after = np.asarray(seen.sum(axis=1)).ravel()  # N1+(v •)
    types_before = np.asarray(seen.sum(axis=0)).ravel()  # N1+(• w)
    p_cont = (1 - uniform_weight) * types_before / max(1.0, types_before.sum()) + uniform_weight / vocab_size
    p_cont_next = p_cont[nxt]
    safe_ctx = np.maximum(ctx, 1.0)
    p = np.maximum(pair - discount, 0.0) / safe_ctx + discount * types_after[prev] / safe_ctx * p_cont_next
    p = np.where(ctx > 0, p, p_cont_next)
    return np.log(p)


def bigram_perplexity(train_ids: np.ndarray, eval_ids: np.ndarray, vocab_size: int,
                      smoothing: str = "kneser_ney", **kwargs) -> BigramScore:
    """Held-out perplexity of a bigram model (see module docstring) fitted on `train_ids`."""
    logp = bigram_log_probs(train_ids, eval_ids, vocab_size, smoothing=smoothing, **kwargs)
    nll = float(-logp.mean())
    return BigramScore(nll=nll, perplexity=math.exp(nll), n_predicted=len(logp), smoothing=smoothing)
