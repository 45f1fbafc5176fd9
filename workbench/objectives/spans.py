"""SpanBERT span masking with span-boundary-objective targets (Joshi et al. 2020).

Span lengths are counted in WORDS and drawn from Geometric(p) restricted to ``1..max_span``.
Like SpanBERT's released sampler (and its reported mean of 3.8 for p=0.2, max 10), the
restriction renormalises the geometric pmf over ``1..max_span`` (lengths above the maximum are
never drawn) rather than piling their mass on ``max_span``; ``clipped_geometric_mean`` is the mean
of that distribution. The start word is uniform over the non-special words; a start inside an
already-masked word is rejected; a span stops early at a segment end (a special token), before an
already-masked word, or at the token budget ``max(1, round(rate * n))``. Spans are whole words
(SpanBERT may cut the last word), so the word that crosses the budget is taken only if that
leaves the count closer to the budget than stopping before it (or nothing is masked yet), and
masking of the sequence ends there. The 80/10/10
decision is drawn once per SPAN (all its tokens become [MASK], all random, or all unchanged).
Spans never overlap but two may touch; then one span's boundary token is itself masked (as can
happen in SpanBERT, whose spans may even overlap).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.objectives.mlm import (
    IGNORE_INDEX,
    check_inputs,
    check_rates,
    expand_spans,
    masking_budget,
    random_replacements,
    resolve_candidates,
    word_groups,
)


@dataclass
class SpanMasking:
    """Output of :func:`span_mask`; all tensors are [B, T] long.

    ``labels``: original id at masked tokens, -100 elsewhere. For each masked token,
    ``left_boundary`` / ``right_boundary`` are the token indices of x_{s-1} and x_{e+1} (just
    outside its span; clamped to 0 / T-1 if the span touches the sequence edge) and
    ``span_position`` its 0-based offset inside the span; all three are -1 at unmasked tokens.
    ``spans`` (only with ``return_spans=True``): per row, ``(start_token, end_token, n_words,
    drawn_words)`` of each placed span in placement order; ``n_words < drawn_words`` when the span
    was cut short (budget met, segment end, or a masked word next to it).
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    left_boundary: torch.Tensor
    right_boundary: torch.Tensor
    span_position: torch.Tensor
    spans: list[list[tuple[int, int, int, int]]] | None = None


def clipped_geometric_pmf(p: float, max_span: int) -> torch.Tensor:
    """pmf over lengths ``1..max_span`` (index 0 = length 1) of Geometric(p) renormalised on that range."""
    if not (0.0 < p <= 1.0) or max_span < 1:
        raise ValueError(f"need 0 < p <= 1 and max_span >= 1, got p={p}, max_span={max_span}")
    lengths = torch.arange(1, max_span + 1, dtype=torch.float64)
    pmf = p * (1.0 - p) ** (lengths - 1)
    return pmf / pmf.sum()


def clipped_geometric_mean(p: float = 0.2, max_span: int = 10) -> float:
    """Analytic mean of :func:`clipped_geometric_pmf` (3.797 for SpanBERT's p=0.2, max 10; the paper reports 3.8)."""
    pmf = clipped_geometric_pmf(p, max_span)
    return float((pmf * torch.arange(1, max_span + 1, dtype=torch.float64)).sum())


def sample_span_lengths(n: int, *, generator: torch.Generator, p: float = 0.2, max_span: int = 10) -> torch.Tensor:
    """Draw ``n`` span lengths (in words) from the clipped geometric; the sampler :func:`span_mask` uses."""
    pmf = clipped_geometric_pmf(p, max_span)
    return torch.multinomial(pmf, n, replacement=True, generator=generator) + 1


class _Draws:
    """Span lengths and uniform start draws, fetched from the torch generator in chunks."""

    def __init__(self, generator: torch.Generator, p: float, max_span: int, chunk: int = 128):
        self.generator, self.p, self.max_span, self.chunk = generator, p, max_span, chunk
        self.lengths: list[int] = []
        self.uniforms: list[float] = []

    def next(self) -> tuple[int, float]:
        if not self.lengths:
            self.lengths = sample_span_lengths(
                self.chunk, generator=self.generator, p=self.p, max_span=self.max_span
            ).tolist()[::-1]
            self.uniforms = torch.rand(self.chunk, generator=self.generator, dtype=torch.float64).tolist()[::-1]
        return self.lengths.pop(), self.uniforms.pop()


def place_spans(
    starts: list[int], ends: list[int], budget: int, draws: _Draws
) -> list[tuple[int, int, int, int]]:
    """Place SpanBERT spans over one sequence's words; returns ``(first_word, last_word, n_words,
    drawn_words)`` per span.

    ``starts``/``ends`` are each word's first/last token index; two neighbouring words belong to
    the same segment when no token lies between them. The start word is uniform; starting on a
    masked word is rejected; a span grows word by word up to its drawn length, stopping at a
    segment end, before a masked word, or at the token budget (see the module docstring).
    """
    n_words = len(starts)
    masked = [False] * n_words
    count, spans, tries = 0, [], 0
    max_tries = 100 * n_words + 100  # only reached when almost every word is already masked
    while count < budget and tries < max_tries:
        tries += 1
        length, u = draws.next()
        w0 = min(int(u * n_words), n_words - 1)
        if masked[w0]:
            continue
        w, stop = w0, False
        while True:
            size = ends[w] - starts[w] + 1
            if count + size > budget:
                # the word crosses the budget: take it if that lands closer (or nothing is masked yet)
                stop = True
                if count > 0 and count + size - budget > budget - count:
                    break
            masked[w] = True
            count += size
            if w - w0 + 1 >= length or count >= budget or w + 1 >= n_words:
                break
            if masked[w + 1] or starts[w + 1] != ends[w] + 1:
                break
            w += 1
        if not masked[w]:
            w -= 1
        if w >= w0:
            spans.append((w0, w, w - w0 + 1, length))
        if stop:
            break
    return spans


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
    return_spans: bool = False,
) -> SpanMasking:
    """SpanBERT masking of ``input_ids`` [B, T]; ``word_ids`` [B, T] (-1 at specials; None = every
    token is a word). ``candidate_ids``: pool for random replacements (default as in
    :func:`workbench.objectives.mlm.mask_tokens`). With ``return_spans`` the result also carries
    ``spans`` (see :class:`SpanMasking`)."""
    check_inputs(input_ids, special_mask, word_ids)
    check_rates(rate, mask_prob, random_prob)
    device = input_ids.device
    ids = input_ids.cpu()
    special = special_mask.cpu()
    B, T = ids.shape
    group, word_row = word_groups(special, word_ids)
    flat_group = group.flatten()
    pos = torch.arange(B * T)
    real = flat_group >= 0
    n_all = len(word_row)
    # first/last token (column index) of each word
    w_first = torch.full((n_all,), B * T, dtype=torch.long).scatter_reduce(0, flat_group[real], pos[real], "amin")
    w_last = torch.full((n_all,), -1, dtype=torch.long).scatter_reduce(0, flat_group[real], pos[real], "amax")
    w_first, w_last = (w_first % T).tolist(), (w_last % T).tolist()
    budgets = masking_budget((~special).sum(1), rate).tolist()
    row_bounds = torch.searchsorted(word_row, torch.arange(B + 1)).tolist()

    draws = _Draws(generator, geometric_p, max_span)
    span_rows: list[list[tuple[int, int, int, int]]] = []
    for b in range(B):
        lo, hi = row_bounds[b], row_bounds[b + 1]
        placed = place_spans(w_first[lo:hi], w_last[lo:hi], budgets[b], draws)
        span_rows.append([(w_first[lo + a], w_last[lo + z], n, d) for a, z, n, d in placed])

    flat = [(b, s, e) for b, row in enumerate(span_rows) for s, e, _, _ in row]
    n_spans = len(flat)
    span_row = torch.tensor([f[0] for f in flat], dtype=torch.long)
    span_s = torch.tensor([f[1] for f in flat], dtype=torch.long)
    span_e = torch.tensor([f[2] for f in flat], dtype=torch.long)
    span_len = span_e - span_s + 1
    # expand spans to tokens
    tok_span, tok_off = expand_spans(span_len)
    tok_row, tok_col = span_row[tok_span], span_s[tok_span] + tok_off

    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[tok_row, tok_col] = ids[tok_row, tok_col]
    left = torch.full_like(ids, -1)
    right = torch.full_like(ids, -1)
    position = torch.full_like(ids, -1)
    left[tok_row, tok_col] = (span_s[tok_span] - 1).clamp(min=0)
    right[tok_row, tok_col] = (span_e[tok_span] + 1).clamp(max=T - 1)
    position[tok_row, tok_col] = tok_off

    # 80/10/10 once per span
    u = torch.rand(n_spans, generator=generator)[tok_span]
    masked_ids = ids.clone()
    to_mask = u < mask_prob
    to_random = (u >= mask_prob) & (u < mask_prob + random_prob)
    masked_ids[tok_row[to_mask], tok_col[to_mask]] = mask_token_id
    cand = resolve_candidates(ids, special, mask_token_id, vocab_size, candidate_ids)
    masked_ids[tok_row[to_random], tok_col[to_random]] = random_replacements(int(to_random.sum()), cand, generator)
    return SpanMasking(
        masked_ids.to(device),
        labels.to(device),
        left.to(device),
        right.to(device),
        position.to(device),
        span_rows if return_spans else None,
    )
