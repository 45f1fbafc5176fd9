"""Causal LM labels (one home) and ELMo's bidirectional LM targets (Peters et al. 2018)."""

from __future__ import annotations

import torch

from workbench.objectives.mlm import IGNORE_INDEX


def causal_lm_labels(
    input_ids: torch.Tensor, *, pad_id: int | None = None, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Labels for HF causal LMs, which shift internally: a copy of ``input_ids`` with padding -> -100.

    Padding is where ``attention_mask == 0`` if given, else where ``input_ids == pad_id``.
    (Use ``attention_mask`` when pad and eos share an id, as in GPT-2, so real eos stay predicted.)
    """
    labels = input_ids.clone()
    if attention_mask is not None:
        labels[attention_mask == 0] = IGNORE_INDEX
    elif pad_id is not None:
        labels[input_ids == pad_id] = IGNORE_INDEX
    return labels


def shift_labels(ids: torch.Tensor, *, pad_id: int | None = None) -> torch.Tensor:
    """Explicit next-token targets aligned with positions: ``labels[..., t] = ids[..., t+1]``,
    -100 at the last position and wherever the current or next token is padding (for models that
    do NOT shift internally)."""
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[..., :-1] = ids[..., 1:]
    if pad_id is not None:
        labels[ids == pad_id] = IGNORE_INDEX
        labels[labels == pad_id] = IGNORE_INDEX
    return labels


def bilm_targets(ids: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ELMo targets: ``forward[t] = ids[t+1]``, ``backward[t] = ids[t-1]``; -100 past the ends
    and at padding. With <S>/</S> in ``ids`` the forward LM predicts </S> and the backward LM <S>."""
    forward = shift_labels(ids, pad_id=pad_id)
    backward = shift_labels(ids.flip(-1), pad_id=pad_id).flip(-1)
    return forward, backward
