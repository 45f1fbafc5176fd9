"""ELECTRA replaced-token detection (Clark et al. 2020).

The generator's distribution at each masked position is sampled (no gradient flows through the
sample) with the Gumbel-max trick using noise drawn from the CPU ``generator``, so it works for
logits on any device. The discriminator sees the original sequence with the samples written at
the masked positions; its label is 1 where the token differs from the original (a sample that
happens to equal the original counts as original, 0), 0 everywhere else including specials.
"""

from __future__ import annotations

import torch


def replaced_token_detection(
    masked_input_ids: torch.Tensor,
    labels: torch.Tensor,
    generator_logits: torch.Tensor,
    *,
    generator: torch.Generator,
    original_ids: torch.Tensor,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(discriminator_input_ids [B, T], rtd_labels [B, T] long 0/1)``.

    Masked positions are ``labels != -100``; ``generator_logits`` is [B, T, V].
    ``masked_input_ids`` is only checked for shape (the discriminator input starts from ``original_ids``).
    """
    raise NotImplementedError
