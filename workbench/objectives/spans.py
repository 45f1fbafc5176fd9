"""SpanBERT span masking with span-boundary-objective targets (Joshi et al. 2020).

Span lengths are counted in WORDS and drawn from Geometric(p) restricted to ``1..max_span``.
Like SpanBERT's released sampler (and its reported mean of 3.8 for p=0.2, max 10), the
restriction renormalises the geometric pmf over ``1..max_span`` (lengths above the maximum are
never drawn) rather than piling their mass on ``max_span``; ``clipped_geometric_mean`` is the mean
of that distribution. The start word is uniform over the non-special words; a start inside an
already-masked word is rejected; a span stops early at a segment end (a special token), before an
already-masked word, or once the token budget ``round(rate * n)`` is reached (spans are whole
words, so the last span may overshoot the budget by the extra pieces of one word). The 80/10/10
decision is drawn once per SPAN (all its tokens become [MASK], all random, or all unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


@dataclass
class SpanMasking:
    """Output of :func:`span_mask`; all tensors are [B, T] long.

    ``labels``: original id at masked tokens, -100 elsewhere. For each masked token,
    ``left_boundary`` / ``right_boundary`` are the token indices of x_{s-1} and x_{e+1} (just
    outside its span; clamped to 0 / T-1 if the span touches the sequence edge) and
    ``span_position`` its 0-based offset inside the span; all three are -1 at unmasked tokens.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    left_boundary: torch.Tensor
    right_boundary: torch.Tensor
    span_position: torch.Tensor


def clipped_geometric_pmf(p: float, max_span: int) -> torch.Tensor:
    """pmf over lengths ``1..max_span`` (index 0 = length 1) of Geometric(p) renormalised on that range."""
    raise NotImplementedError


def clipped_geometric_mean(p: float = 0.2, max_span: int = 10) -> float:
    """Analytic mean of :func:`clipped_geometric_pmf` (3.78 for SpanBERT's p=0.2, max 10)."""
    raise NotImplementedError


def sample_span_lengths(n: int, *, generator: torch.Generator, p: float = 0.2, max_span: int = 10) -> torch.Tensor:
    """Draw ``n`` span lengths (in words) from the clipped geometric; the sampler :func:`span_mask` uses."""
    raise NotImplementedError


def span_mask(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    *,
    word_ids: torch.Tensor | None,
    mask_token_id: int,
    vocab_size: int,
    generator: torch.Generator,
    rate: float = 0.15,
    geometric_p: float = 0.2,
    max_span: int = 10,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
    candidate_ids: torch.Tensor | None = None,
) -> SpanMasking:
    """SpanBERT masking of ``input_ids`` [B, T]; ``word_ids`` [B, T] (-1 at specials; None = every
    token is a word). ``candidate_ids``: pool for random replacements (default as in
    :func:`workbench.objectives.mlm.mask_tokens`)."""
    raise NotImplementedError
