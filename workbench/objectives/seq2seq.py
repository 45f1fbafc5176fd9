"""Encoder-decoder denoising objectives: T5 span corruption (Raffel et al. 2020) and BART text
infilling + sentence permutation (Lewis et al. 2020).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def random_spans_noise_mask(
    length: int, *, generator: torch.Generator, noise_density: float = 0.15, mean_span_length: float = 3.0
) -> torch.Tensor:
    """T5's ``random_spans_noise_mask``: bool [length], True = noise.

    ``n_noise = round(length * density)`` (clamped to 1..length-1), ``n_spans = max(1,
    round(n_noise / mean_span))``; noise and non-noise tokens are each split into ``n_spans``
    non-empty segments by a uniformly random segmentation and interleaved starting with non-noise
    (so, as in T5, the sequence starts with kept text and ends with a noise span).
    """
    raise NotImplementedError


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
    raise NotImplementedError


def t5_reconstruct(
    input_ids: torch.Tensor, target_ids: torch.Tensor, sentinel_ids: Sequence[int], *, eos_id: int | None = None
) -> torch.Tensor:
    """Inverse of :func:`t5_span_corruption`: put each sentinel's target tokens back into the input."""
    raise NotImplementedError


def bart_infilling_plan(
    length: int, *, generator: torch.Generator, mask_ratio: float = 0.3, poisson_lambda: float = 3.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spans for BART infilling: ``(starts, lengths)`` long tensors, sorted by start, non-overlapping."""
    raise NotImplementedError


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
    raise NotImplementedError


def bart_sentence_permutation(sentences: Sequence[Sequence[int]], *, generator: torch.Generator) -> list[list[int]]:
    """Shuffle the sentences of a document uniformly at random (BART sentence permutation)."""
    raise NotImplementedError


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
    raise NotImplementedError
