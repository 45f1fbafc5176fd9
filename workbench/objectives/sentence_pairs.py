"""Sentence-pair examples: next-sentence prediction (Devlin et al. 2019) and sentence-order
prediction (Lan et al. 2020).

A document is a list of sentences, each a list of token ids (no specials). One call builds one
pair, following BERT's ``create_instances_from_document``: from a random start sentence, whole
sentences are gathered until ``max_tokens`` is reached (at least two when the document has two);
segment A is a random-length prefix of that chunk, and segment B the rest (real next) or, for a
random next, sentences of ANOTHER document from a random start up to the remaining length. The
pair is then trimmed to ``max_tokens`` by dropping tokens from the longer segment, from its front
or back at random (BERT's ``truncate_seq_pair``). ``max_tokens`` excludes the special tokens the
collator adds ([CLS] A [SEP] B [SEP] -> pass max_len - 3). Differences from BERT: one random pair
per call (no sweep over the document) and no ``short_seq_prob`` shortening (pass a smaller
``max_tokens`` for that).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Sentences = Sequence[Sequence[int]]


def _randint(high: int, generator: torch.Generator) -> int:
    """Uniform integer in ``[0, high)``."""
    return int(torch.randint(high, (1,), generator=generator))


def _coin(generator: torch.Generator) -> bool:
    return bool(torch.rand(1, generator=generator) < 0.5)


def _flatten(sentences: Sentences) -> list[int]:
    return [int(t) for s in sentences for t in s]


def truncate_pair(
    a: list[int], b: list[int], max_tokens: int, *, generator: torch.Generator
) -> tuple[list[int], list[int]]:
    """BERT's ``truncate_seq_pair``: drop one token at a time from the longer segment, front or back at random."""
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
    a, b = list(a), list(b)
    excess = len(a) + len(b) - max_tokens
    if excess <= 0:
        return a, b
    # all coins in one draw; each step uses one
    coins = (torch.rand(excess, generator=generator) < 0.5).tolist()
    front_a = front_b = 0
    end_a, end_b = len(a), len(b)
    for front in coins:
        if end_a - front_a >= end_b - front_b:
            if front:
                front_a += 1
            else:
                end_a -= 1
        elif front:
            front_b += 1
        else:
            end_b -= 1
    return a[front_a:end_a], b[front_b:end_b]


def _chunk(
    sentences: Sentences, max_tokens: int, generator: torch.Generator, min_sentences: int
) -> list[Sequence[int]]:
    """Consecutive sentences from a random start until ``max_tokens`` (and ``min_sentences``) are reached."""
    n = len(sentences)
    start = _randint(max(1, n - min_sentences + 1), generator)
    chunk: list[Sequence[int]] = []
    size = 0
    for sent in sentences[start:]:
        chunk.append(sent)
        size += len(sent)
        if size >= max_tokens and len(chunk) >= min_sentences:
            break
    return chunk


def _nonempty(sentences: Sentences) -> list[Sequence[int]]:
    """The document without empty sentences (they would make empty segments); ValueError if nothing is left."""
    kept = [s for s in sentences if len(s)]
    if not kept:
        raise ValueError("document has no tokens")
    return kept


def nsp_pair(
    document_sentences: Sentences,
    other_document_sentences: Callable[[torch.Generator], Sentences] | Sequence[Sentences],
    *,
    max_tokens: int,
    generator: torch.Generator,
    document_index: int | None = None,
    random_prob: float = 0.5,
) -> tuple[list[int], list[int], bool]:
    """One NSP pair ``(segment_a, segment_b, is_random_next)``; random next with probability
    ``random_prob`` (BERT: 0.5; the draw is made whatever the probability, so the rest of the pair's
    random stream does not depend on it).

    ``other_document_sentences`` is either a callable ``f(generator) -> sentences`` returning a
    document different from this one, or the whole corpus (a sequence of documents) together with
    ``document_index``, the position of ``document_sentences`` in it (excluded from the draw).
    A document of a single sentence has no real next sentence: it always gives a random next
    (as in BERT); the example builder should skip such documents to keep labels balanced.
    """
    document_sentences = _nonempty(document_sentences)
    is_random = bool(torch.rand(1, generator=generator) < random_prob)  # = _coin at 0.5
    two = len(document_sentences) >= 2
    chunk = _chunk(document_sentences, max_tokens, generator, min_sentences=2 if two else 1)
    if len(chunk) == 1:
        is_random = True
    a_end = 1 + _randint(len(chunk) - 1, generator) if len(chunk) >= 2 else 1
    a = _flatten(chunk[:a_end])
    if is_random:
        if callable(other_document_sentences):
            other = other_document_sentences(generator)
        else:
            corpus = other_document_sentences
            if document_index is None or not 0 <= document_index < len(corpus) or len(corpus) < 2:
                raise ValueError("with a corpus, pass document_index (its position) and >= 2 documents")
            j = _randint(len(corpus) - 1, generator)
            other = corpus[j + (j >= document_index)]
        other = _nonempty(other)
        b = _flatten(_chunk(other, max(1, max_tokens - len(a)), generator, min_sentences=1))
    else:
        b = _flatten(chunk[a_end:])
    a, b = truncate_pair(a, b, max_tokens, generator=generator)
    return a, b, is_random


def sop_pair(
    document_sentences: Sentences,
    *,
    max_tokens: int,
    generator: torch.Generator,
) -> tuple[list[int], list[int], bool]:
    """One SOP pair ``(segment_a, segment_b, is_swapped)``: two consecutive segments of the same
    document, in their order or swapped with probability 0.5. Needs >= 2 non-empty sentences (ValueError)."""
    document_sentences = _nonempty(document_sentences)
    if len(document_sentences) < 2:
        raise ValueError("sentence-order prediction needs a document of at least two sentences")
    is_swapped = _coin(generator)
    chunk = _chunk(document_sentences, max_tokens, generator, min_sentences=2)
    a_end = 1 + _randint(len(chunk) - 1, generator)
    a, b = truncate_pair(_flatten(chunk[:a_end]), _flatten(chunk[a_end:]), max_tokens, generator=generator)
    return (b, a, True) if is_swapped else (a, b, False)
