"""Fake-English: the same text in a disjoint copy of the alphabet (K et al. 2020, "Cross-lingual
ability of multilingual BERT": shift every character's code point by a constant so the two
"languages" share no characters, hence no subwords, while their structure is identical).

A corpus source `shifted:<name>` (for example `shifted:wikitext2`) is the raw corpus `<name>`
with every text shifted; training on `[wikitext2, shifted:wikitext2]` gives a bilingual model whose
true dictionary is known exactly: word w <-> `shift_text(w)`.

Deliberate differences from a plain constant shift, so the workbench's tokenisers segment both
halves alike: letters and digits (below U+0250) go to the Yi syllables block (U+A000-U+A24F:
letters without case or decompositions, which no normaliser used here lowercases, strips or
splits as CJK); ASCII punctuation and symbols go to the Supplemental Punctuation block
(U+2E00-U+2E1F: still punctuation to BERT's pre-tokeniser); whitespace and every other character
is kept. Special tokens are shared, as in the paper.
"""

from __future__ import annotations

import string

from workbench.errors import ConfigError

PREFIX = "shifted:"
_LETTER_BASE = 0xA000  # Yi syllables
_PUNCT_BASE = 0x2E00  # Supplemental Punctuation
_PUNCT = string.punctuation  # 32 ASCII characters -> U+2E00..U+2E1F


def _table() -> dict[int, str]:
    table = {}
    for cp in range(0x250):
        c = chr(cp)
        if c.isalnum():
            table[cp] = chr(_LETTER_BASE + cp)
    for i, c in enumerate(_PUNCT):
        table[ord(c)] = chr(_PUNCT_BASE + i)
    return table


_SHIFT = _table()


def shift_text(text: str) -> str:
    """The fake-language spelling of `text` (see the module docstring); a bijection on what it changes."""
    return text.translate(_SHIFT)


def is_shifted(source: str) -> bool:
    return source.startswith(PREFIX)


def base_source(source: str) -> str:
    """`shifted:wikitext2` -> `wikitext2`; any other name unchanged."""
    return source[len(PREFIX):] if is_shifted(source) else source


def shifted_documents(source: str):
    """The documents of `shifted:<name>`: doc ids prefixed, texts shifted."""
    from workbench.data.raw import Document, load_documents

    if not is_shifted(source):
        raise ConfigError(f"{source!r} is not a shifted source (expected {PREFIX}<name>)")
    return [Document(PREFIX + d.doc_id, source, shift_text(d.text)) for d in load_documents(base_source(source))]


# ---------------------------------------------------------------- separate position embeddings
# The ablation of K et al. (2020) and Dufter & Schuetze (2020): the fake half reads its own rows of
# the absolute position embedding table (positions offset by a constant), so the two "languages"
# share nothing but the special tokens and the transformer's weights. Decided per segment (the
# `token_type_ids` of a sentence pair): a segment is fake when any of its pieces is spelled in the
# shifted alphabet (an ordinary piece never is), so a pair whose random second segment comes from
# a document of the other language gets each segment's own positions.

_SHIFTED_CODEPOINTS = frozenset(ord(c) for c in _SHIFT.values())


def is_shifted_piece(piece: str) -> bool:
    """True when a vocabulary entry contains a character of the shifted alphabet."""
    return any(ord(c) in _SHIFTED_CODEPOINTS for c in piece)


def shifted_vocabulary_mask(tokenizer):
    """Bool tensor over token ids: True for the ids whose piece is spelled in the shifted alphabet."""
    import torch

    vocab = tokenizer.get_vocab()
    mask = torch.zeros(max(len(tokenizer), max(vocab.values(), default=0) + 1), dtype=torch.bool)
    for piece, idx in vocab.items():
        if is_shifted_piece(piece):
            mask[idx] = True
    return mask


def separate_position_ids(input_ids, attention_mask, token_type_ids, shifted_mask, offset: int):
    """Absolute position ids: 0..L-1 along each row, plus `offset` on the tokens of fake segments."""
    import torch

    rows, L = input_ids.shape
    pos = torch.arange(L, device=input_ids.device).unsqueeze(0).expand(rows, L)
    segment = token_type_ids.long() if token_type_ids is not None else torch.zeros_like(input_ids)
    shifted = shifted_mask.to(input_ids.device)[input_ids.clamp(0, shifted_mask.numel() - 1)] & attention_mask.bool()
    n_segments = int(segment.max()) + 1 if segment.numel() else 1
    fake_segment = torch.zeros(rows, n_segments, dtype=torch.bool, device=input_ids.device)
    fake_segment.scatter_reduce_(1, segment, shifted, reduce="amax")
    return pos + offset * fake_segment.gather(1, segment).long()
