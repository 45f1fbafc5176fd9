"""Causal LM labels (one home) and ELMo's bidirectional LM targets (Peters et al. 2018)."""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


def causal_lm_labels(input_ids: torch.Tensor, *, pad_id: int | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Labels for HF causal LMs, which shift internally: a copy of ``input_ids`` with padding -> -100."""
    raise NotImplementedError


def shift_labels(ids: torch.Tensor, *, pad_id: int | None = None) -> torch.Tensor:
    """Explicit next-token targets aligned with positions: ``labels[..., t] = ids[..., t+1]``,
    -100 at the last position and wherever the current or next token is padding (for models that
    do NOT shift internally)."""
    raise NotImplementedError


def bilm_targets(ids: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ELMo targets: ``forward[t] = ids[t+1]``, ``backward[t] = ids[t-1]``; -100 past the ends
    and at padding. With <S>/</S> in ``ids`` the forward LM predicts </S> and the backward LM <S>."""
    raise NotImplementedError
