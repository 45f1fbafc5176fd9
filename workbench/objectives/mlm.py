"""BERT masked language modelling (Devlin et al. 2019), token-level and whole-word.

Selection rule (both modes): per sequence, the budget is ``k = max(1, round_half_up(rate * n))``
tokens, ``n`` = number of non-special tokens. Token-level masking picks exactly ``k`` positions
uniformly without replacement. Whole-word masking (Google's BERT-WWM release) visits the words in
a random order and takes a word when all its pieces still fit in the budget, skipping words that
would overshoot (Google's ``create_pretraining_data.py`` rule), so never more than ``k`` tokens and
almost always exactly ``k``. The 80/10/10 decision ([MASK] / random id / unchanged) is drawn
independently per TOKEN in both modes, as in BERT-WWM. All chosen tokens are predicted.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


def default_candidate_ids(vocab_size: int, special_ids) -> torch.Tensor:
    """All ids in ``[0, vocab_size)`` except ``special_ids``: the pool for the 10% random replacements."""
    raise NotImplementedError


def mask_tokens(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    generator: torch.Generator,
    rate: float = 0.15,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
    word_ids: torch.Tensor | None = None,
    candidate_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask ``input_ids`` [B, T] for MLM; returns ``(masked_input_ids, labels)``.

    ``special_mask`` [B, T] bool marks never-masked tokens (CLS/SEP/PAD...). ``word_ids`` [B, T]
    (-1 at specials) switches on whole-word masking; a word is a maximal run of consecutive
    non-special tokens with the same word id (so ids restarting in a second segment are fine).
    ``candidate_ids`` is the pool of random replacements; default: every id in ``[0, vocab_size)``
    except ``mask_token_id`` and the ids found at special positions of this batch (pass it
    explicitly from the tokenizer's special ids for a batch-independent pool).
    ``labels`` hold the original id at every chosen position and -100 elsewhere.
    """
    raise NotImplementedError
