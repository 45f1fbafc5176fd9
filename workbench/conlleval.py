"""Span-level precision, recall and F1 of BIO tag sequences, scored as the CoNLL shared tasks'
`conlleval` script does (Tjong Kim Sang 2002; Tjong Kim Sang & De Meulder 2003).

A chunk (entity) is a maximal run of tags of one type. conlleval's rules, which differ from a
strict BIO reading and are what published CoNLL-2002/2003 F1 scores use:

- `B-X` always starts a chunk of type X;
- `I-X` starts a chunk when the previous tag is `O` or of another type (an `I-` without its `B-`
  is NOT an error, it opens a chunk);
- a chunk ends before `O`, before any `B-`, and before a tag of another type (`B-PER I-LOC` is two
  chunks: PER then LOC); sentences end chunks.

A predicted chunk is correct when a gold chunk has the same type, start and end. Precision =
correct / predicted chunks, recall = correct / gold chunks, F1 their harmonic mean (0 when there is
nothing correct); conlleval prints them x 100, this module returns fractions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field


def _split(tag: str) -> tuple[str, str]:
    """('B'|'I'|'O', type) of a BIO tag; `O` has type ''. A tag without a B-/I- prefix is read as
    I- of that type, as conlleval does (IOBES tags are not supported)."""
    if tag == "O" or tag == "":
        return "O", ""
    if len(tag) > 2 and tag[1] == "-" and tag[0] in "BI":
        return tag[0], tag[2:]
    return "I", tag


def chunks(tags: Sequence[str]) -> list[tuple[int, int, str]]:
    """The chunks of one sentence as (start, end exclusive, type), by conlleval's rules."""
    out: list[tuple[int, int, str]] = []
    start, kind = None, ""
    for i, tag in enumerate(list(tags) + ["O"]):  # the sentence end closes the last chunk
        prefix, typ = _split(tag)
        if start is not None and (prefix in ("B", "O") or typ != kind):
            out.append((start, i, kind))
            start = None
        if prefix != "O" and start is None:
            start, kind = i, typ
    return out


@dataclass
class SpanScore:
    precision: float
    recall: float
    f1: float
    correct: int
    predicted: int
    gold: int
    token_accuracy: float
    per_type: dict[str, dict] = field(default_factory=dict)


def _prf(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    p = correct / predicted if predicted else 0.0
    r = correct / gold if gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def span_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> SpanScore:
    """conlleval's overall and per-type scores over sentences of gold and predicted tags."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    correct, n_pred, n_gold = Counter(), Counter(), Counter()
    tok_right = tok_all = 0
    for g, p in zip(gold, predicted):
        if len(g) != len(p):
            raise ValueError(f"a sentence has {len(g)} gold tags but {len(p)} predicted")
        gc, pc = set(chunks(g)), set(chunks(p))
        for c in gc:
            n_gold[c[2]] += 1
        for c in pc:
            n_pred[c[2]] += 1
        for c in gc & pc:
            correct[c[2]] += 1
        tok_right += sum(a == b for a, b in zip(g, p))
        tok_all += len(g)
    per_type = {}
    for t in sorted(set(n_gold) | set(n_pred)):
        p, r, f = _prf(correct[t], n_pred[t], n_gold[t])
        per_type[t] = {"precision": p, "recall": r, "f1": f, "correct": correct[t], "predicted": n_pred[t],
                       "gold": n_gold[t]}
    c, np_, ng = sum(correct.values()), sum(n_pred.values()), sum(n_gold.values())
    p, r, f = _prf(c, np_, ng)
    return SpanScore(p, r, f, c, np_, ng, tok_right / tok_all if tok_all else float("nan"), per_type)
