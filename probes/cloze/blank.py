"""The linear probe's input: each item's words with the blank written the tokenizer's way."""

from __future__ import annotations

import numpy as np

from workbench.running.lm_inputs import BLANK


# --------------------------------------------------------------------------- probe on the blank's vector


def blank_word(tokenizer) -> str:
    if tokenizer.mask_token:
        return tokenizer.mask_token
    vocab = tokenizer.get_vocab()
    for s in ("<extra_id_0>", "<sentinel_0>"):
        if s in vocab:
            return s
    return "_"


def probe_words(items, tokenizer, causal: bool) -> tuple[list[list[str]], np.ndarray]:
    """Word lists of the items (blank written as `blank_word`) and the word to read per item."""
    bw = blank_word(tokenizer)
    sents, where = [], []
    for it in items:
        words = it.text.replace(BLANK, f" {BLANK} ").split()
        k = words.index(BLANK)
        words[k] = bw
        sents.append(words)
        where.append(len(words) - 1 if causal else k)
    return sents, np.asarray(where)
