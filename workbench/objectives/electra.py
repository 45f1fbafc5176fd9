"""ELECTRA replaced-token detection (Clark et al. 2020).

The generator's distribution at each masked position is sampled (no gradient flows through the
sample) with the Gumbel-max trick using noise drawn from the CPU ``generator``, so it works for
logits on any device. The discriminator sees the original sequence with the samples written at
the masked positions; its label is 1 where the token differs from the original (a sample that
happens to equal the original counts as original, 0), 0 everywhere else including specials.
"""

from __future__ import annotations

import torch

from workbench.objectives.mlm import IGNORE_INDEX


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
    if not (masked_input_ids.shape == labels.shape == original_ids.shape == generator_logits.shape[:-1]):
        raise ValueError(
            "shapes differ: masked_input_ids "
            f"{tuple(masked_input_ids.shape)}, labels {tuple(labels.shape)}, original_ids "
            f"{tuple(original_ids.shape)}, generator_logits {tuple(generator_logits.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    chosen = labels != IGNORE_INDEX
    logits = generator_logits.detach()[chosen].float() / temperature  # [M, V]
    # Gumbel-max: argmax(logits + G), G = -log(-log U), samples from softmax(logits)
    u = torch.rand(logits.shape, generator=generator, dtype=torch.float32)
    u = u.clamp_(min=torch.finfo(torch.float32).tiny, max=1.0 - 1e-7).to(logits.device)
    sampled = (logits - torch.log(-torch.log(u))).argmax(-1)
    disc = original_ids.clone()
    disc[chosen] = sampled.to(disc.device, disc.dtype)
    rtd_labels = (disc != original_ids).long()
    return disc, rtd_labels
