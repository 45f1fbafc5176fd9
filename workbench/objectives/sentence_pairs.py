"""Sentence-pair examples: next-sentence prediction (Devlin et al. 2019) and sentence-order
prediction (Lan et al. 2020).

A document is a list of sentences, each a list of token ids (no specials). One call builds one
pair, following BERT's ``create_instances_from_document``: from a random start sentence, whole
sentences are gathered until ``max_tokens`` is reached (at least two when the document has two);
segment A is a random-length prefix of that chunk, and segment B the rest (real next) or, for a
random next, sentences of ANOTHER document from a random start up to the remaining length. The
pair is then trimmed to ``max_tokens`` by dropping tokens from the longer segment, from its front
or back at random (BERT's ``truncate_seq_pair``). ``max_tokens`` excludes the special tokens the
collator adds ([CLS] A [SEP] B [SEP] -> pass max_len - 3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Sentences = Sequence[Sequence[int]]


def truncate_pair(a: list[int], b: list[int], max_tokens: int, *, generator: torch.Generator) -> tuple[list[int], list[int]]:
    """BERT's ``truncate_seq_pair``: drop one token at a time from the longer segment, front or back at random."""
    raise NotImplementedError


def nsp_pair(
    document_sentences: Sentences,
    other_document_sentences: Callable[[torch.Generator], Sentences] | Sequence[Sentences],
    *,
    max_tokens: int,
    generator: torch.Generator,
    document_index: int | None = None,
) -> tuple[list[int], list[int], bool]:
    """One NSP pair ``(segment_a, segment_b, is_random_next)``; random next with probability 0.5.

    ``other_document_sentences`` is either a callable ``f(generator) -> sentences`` returning a
    document different from this one, or the whole corpus (a sequence of documents) together with
    ``document_index``, the position of ``document_sentences`` in it (excluded from the draw).
    A document of a single sentence has no real next sentence: it always gives a random next
    (as in BERT); the example builder should skip such documents to keep labels balanced.
    """
    raise NotImplementedError


def sop_pair(
    document_sentences: Sentences,
    *,
    max_tokens: int,
    generator: torch.Generator,
) -> tuple[list[int], list[int], bool]:
    """One SOP pair ``(segment_a, segment_b, is_swapped)``: two consecutive segments of the same
    document, in their order or swapped with probability 0.5. Needs >= 2 sentences (ValueError)."""
    raise NotImplementedError
