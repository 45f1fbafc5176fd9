"""Encoder-decoder denoising objectives: T5 span corruption (Raffel et al. 2020) and BART text
infilling + sentence permutation (Lewis et al. 2020).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.objectives.mlm import expand_spans, round_half_up


def _as_ids(ids, name: str = "ids") -> torch.Tensor:
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.dim() != 1:
        raise ValueError(f"{name} must be a 1-d sequence, got shape {tuple(ids.shape)}")
    return ids.cpu()


def _round(x: float) -> int:
    return int(round_half_up(torch.tensor(x, dtype=torch.float64)))


def random_segmentation(n_items: int, n_segments: int, generator: torch.Generator) -> torch.Tensor:
    """Split ``n_items`` into ``n_segments`` non-empty parts, all compositions equally likely."""
    if not 1 <= n_segments <= n_items:
        raise ValueError(f"cannot split {n_items} items into {n_segments} non-empty segments")
    # choose n_segments - 1 of the n_items - 1 gaps as cut points
    cuts = torch.randperm(n_items - 1, generator=generator)[: n_segments - 1].sort().values + 1
    edges = torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.tensor([n_items])])
    return edges.diff()


def random_spans_noise_mask(
    length: int, *, generator: torch.Generator, noise_density: float = 0.15, mean_span_length: float = 3.0
) -> torch.Tensor:
    """T5's ``random_spans_noise_mask``: bool [length], True = noise.

    ``n_noise = round(length * density)`` (clamped to 1..length-1), ``n_spans = max(1,
    round(n_noise / mean_span))``; noise and non-noise tokens are each split into ``n_spans``
    non-empty segments by a uniformly random segmentation and interleaved starting with non-noise
    (so, as in T5, the sequence starts with kept text and ends with a noise span).
    """
    if length < 2:
        raise ValueError(f"span corruption needs at least 2 tokens, got {length}")
    if not 0.0 < noise_density < 1.0 or mean_span_length <= 0:
        raise ValueError(f"bad noise_density={noise_density} or mean_span_length={mean_span_length}")
    n_noise = min(max(_round(length * noise_density), 1), length - 1)
    n_spans = max(_round(n_noise / mean_span_length), 1)
    n_spans = min(n_spans, n_noise, length - n_noise)
    noise_lengths = random_segmentation(n_noise, n_spans, generator)
    keep_lengths = random_segmentation(length - n_noise, n_spans, generator)
    interleaved = torch.stack([keep_lengths, noise_lengths], 1).flatten()
    segment, _ = expand_spans(interleaved)
    return segment % 2 == 1


def t5_span_corruption(
    ids: torch.Tensor,
    *,
    sentinel_ids: Sequence[int],
    generator: torch.Generator,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
    eos_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(input_ids, target_ids)`` for one sequence ``ids`` [T] without specials.

    Input: the text with noise span j replaced by ``sentinel_ids[j]``; target: for each span j,
    ``sentinel_ids[j]`` followed by the dropped tokens. ``eos_id`` (if given) is appended to both,
    as T5 does. ValueError if there are more spans than sentinels or fewer than 2 tokens.
    """
    ids = _as_ids(ids)
    noise = random_spans_noise_mask(
        len(ids), generator=generator, noise_density=noise_density, mean_span_length=mean_span_length
    )
    span_start = noise & ~torch.cat([torch.tensor([False]), noise[:-1]])
    n_spans = int(span_start.sum())
    if n_spans > len(sentinel_ids):
        raise ValueError(f"{n_spans} noise spans but only {len(sentinel_ids)} sentinel ids")
    sentinels = torch.as_tensor(list(sentinel_ids)[:n_spans], dtype=torch.long)
    span_index = torch.cumsum(span_start.long(), 0) - 1
    # input: kept tokens, and a sentinel in place of each span's first token
    inp = torch.where(span_start, sentinels[span_index.clamp(min=0)], ids)[~noise | span_start]
    # target: the noise tokens, each span preceded by its sentinel
    tgt_slots = torch.stack([torch.where(span_start, sentinels[span_index.clamp(min=0)], -1), ids], 1)
    keep_slot = torch.stack([span_start, noise], 1)
    tgt = tgt_slots[keep_slot]
    if eos_id is not None:
        eos = torch.tensor([eos_id])
        inp, tgt = torch.cat([inp, eos]), torch.cat([tgt, eos])
    return inp, tgt


def t5_reconstruct(
    input_ids: torch.Tensor, target_ids: torch.Tensor, sentinel_ids: Sequence[int], *, eos_id: int | None = None
) -> torch.Tensor:
    """Inverse of :func:`t5_span_corruption`: put each sentinel's target tokens back into the input."""
    inp, tgt = _as_ids(input_ids, "input_ids").tolist(), _as_ids(target_ids, "target_ids").tolist()
    if eos_id is not None:
        inp = inp[:-1] if inp and inp[-1] == eos_id else inp
        tgt = tgt[:-1] if tgt and tgt[-1] == eos_id else tgt
    sentinel_set = {int(s) for s in sentinel_ids}
    fills: dict[int, list[int]] = {}
    current = None
    for tok in tgt:
        if tok in sentinel_set:
            current = tok
            fills[current] = []
        elif current is None:
            raise ValueError("target does not start with a sentinel")
        else:
            fills[current].append(tok)
    out: list[int] = []
    for tok in inp:
        if tok in sentinel_set:
            if tok not in fills:
                raise ValueError(f"sentinel {tok} in the input has no target span")
            out.extend(fills[tok])
        else:
            out.append(tok)
    return torch.tensor(out, dtype=torch.long)


def bart_infilling_plan(
    length: int, *, generator: torch.Generator, mask_ratio: float = 0.3, poisson_lambda: float = 3.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spans for BART infilling: ``(starts, lengths)`` long tensors, sorted by start, non-overlapping.

    Zero-length spans (insertions) have a start but cover nothing; several may share a start.
    """
    if not 0.0 <= mask_ratio < 1.0 or poisson_lambda <= 0:
        raise ValueError(f"bad mask_ratio={mask_ratio} or poisson_lambda={poisson_lambda}")
    budget = _round(length * mask_ratio)
    if budget == 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    # draw in chunks until the lengths cover the budget, then trim the last span to fit exactly
    chunk = max(8, int(2 * budget / poisson_lambda) + 8)
    drawn = torch.zeros(0, dtype=torch.long)
    while int(drawn.sum()) < budget:
        rates = torch.full((chunk,), float(poisson_lambda), dtype=torch.float64)
        drawn = torch.cat([drawn, torch.poisson(rates, generator=generator).long()])
    csum = torch.cumsum(drawn, 0)
    last = int(torch.searchsorted(csum, torch.tensor(budget)))  # first index with csum >= budget
    lengths = drawn[: last + 1].clone()
    lengths[-1] -= int(csum[last]) - budget
    # uniform placement: the unmasked tokens are split into len(lengths)+1 gaps (stars and bars)
    n_spans, unmasked = len(lengths), length - budget
    bars = torch.randperm(unmasked + n_spans, generator=generator)[:n_spans].sort().values
    gaps_before = bars - torch.arange(n_spans)  # unmasked tokens before span i
    starts = gaps_before + torch.cumsum(lengths, 0) - lengths
    return starts, lengths


def bart_text_infilling(
    ids: torch.Tensor,
    *,
    mask_token_id: int,
    generator: torch.Generator,
    mask_ratio: float = 0.3,
    poisson_lambda: float = 3.0,
) -> torch.Tensor:
    """BART text infilling of ``ids`` [T]: returns the noised ids.

    Span lengths ~ Poisson(lambda) are drawn until they cover ``round(mask_ratio * T)`` tokens
    (the last one trimmed to hit the budget exactly); spans, including zero-length ones, are placed
    at uniformly random non-overlapping positions and each is replaced by ONE mask token (a
    zero-length span inserts a mask). Difference from fairseq: spans are token-level and never
    overlap, so the masked fraction is exactly the budget and every span yields its own mask.
    """
    ids = _as_ids(ids)
    starts, lengths = bart_infilling_plan(
        len(ids), generator=generator, mask_ratio=mask_ratio, poisson_lambda=poisson_lambda
    )
    covered = torch.zeros(len(ids), dtype=torch.bool)
    if len(starts):
        span_index, offset = expand_spans(lengths)
        covered[starts[span_index] + offset] = True
    # each span becomes one mask placed just before the token at its start: sort by 2*start for
    # masks and 2*i+1 for kept token i (stable, so masks sharing a start keep their order)
    kept = (~covered).nonzero().squeeze(1)
    keys = torch.cat([2 * starts, 2 * kept + 1])
    values = torch.cat([torch.full((len(starts),), mask_token_id, dtype=torch.long), ids[kept]])
    return values[torch.argsort(keys, stable=True)]


def bart_sentence_permutation(
    sentences: Sequence[Sequence[int]], *, generator: torch.Generator
) -> list[list[int]]:
    """Shuffle the sentences of a document uniformly at random (BART sentence permutation)."""
    order = torch.randperm(len(sentences), generator=generator).tolist()
    return [[int(t) for t in sentences[i]] for i in order]


def bart_noise(
    sentences: Sequence[Sequence[int]],
    *,
    mask_token_id: int,
    generator: torch.Generator,
    mask_ratio: float = 0.3,
    poisson_lambda: float = 3.0,
    permute_sentences: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BART's best setting: permute sentences, then infill. Returns ``(input_ids, target_ids)``
    where targets are the original, unpermuted concatenation."""
    target = torch.tensor([int(t) for s in sentences for t in s], dtype=torch.long)
    order = bart_sentence_permutation(sentences, generator=generator) if permute_sentences else sentences
    permuted = torch.tensor([int(t) for s in order for t in s], dtype=torch.long)
    noised = bart_text_infilling(
        permuted,
        mask_token_id=mask_token_id,
        generator=generator,
        mask_ratio=mask_ratio,
        poisson_lambda=poisson_lambda,
    )
    return noised, target
