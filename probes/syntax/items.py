"""Task items: per word (tags, relations) or per word pair (arcs and sampled non-arcs) of a treebank."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from workbench.errors import ConfigError


# --------------------------------------------------------------------------- task items
@dataclass
class Items:
    """The examples of one classification task on one set of sentences.

    cols: word positions (one array per word; two for pairs) into the activations of the split;
    labels/types: gold label and control-task type key per item; sentence: index of the item's
    sentence within the set (for bootstrapping); counts: what was built or left out.
    """

    cols: list[np.ndarray]
    labels: list[str]
    types: list[str]
    sentence: np.ndarray
    counts: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)


def arcs(heads: Sequence[int]) -> list[tuple[int, int]]:
    """0-based (head, dependent) pairs of a sentence, the root arc left out."""
    return [(h - 1, d) for d, h in enumerate(heads) if h > 0]


def sample_non_arcs(heads: Sequence[int], k: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Up to `k` ordered pairs (a, b), a != b, linked by no arc in either direction, without replacement."""
    n = len(heads)
    linked = np.zeros((n, n), dtype=bool)
    for h, d in arcs(heads):
        linked[h, d] = linked[d, h] = True
    np.fill_diagonal(linked, True)
    candidates = np.flatnonzero(~linked.ravel())
    take = rng.choice(candidates, size=min(k, len(candidates)), replace=False) if k > 0 else candidates[:0]
    return [(int(c // n), int(c % n)) for c in np.sort(take)]


def build_items(task: str, sentences, offsets: np.ndarray, sentence_ids: Sequence[int] | None = None,
                seed: int = 0, deprel_subtypes: bool = True) -> Items:
    """Items of a classification task for `sentences[sentence_ids]`; offsets locate their words.

    `offsets` are the activation offsets of the full list `sentences`. For `arc`, the negatives of
    sentence i are drawn with a generator seeded by (seed, i), so they do not depend on which other
    sentences are in the set.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    ids = range(len(sentences)) if sentence_ids is None else [int(i) for i in sentence_ids]
    a_idx, b_idx, labels, types, sent = [], [], [], [], []
    counts: Counter = Counter()
    for j, i in enumerate(ids):
        s, base = sentences[i], int(offsets[i])
        if task in ("upos", "xpos"):
            tags = s.upos if task == "upos" else s.xpos
            for w, (form, tag) in enumerate(zip(s.words, tags)):
                a_idx.append(base + w)
                labels.append(tag)
                types.append(form)
                sent.append(j)
            counts["words"] += len(s.words)
            continue
        pos = arcs(s.heads)
        counts["root_arcs_left_out"] += len(s.heads) - len(pos)
        if task == "deprel":
            for h, d in pos:
                rel = s.deprels[d] if deprel_subtypes else s.deprels[d].split(":")[0]
                a_idx.append(base + h)
                b_idx.append(base + d)
                labels.append(rel)
                types.append(s.words[d])
                sent.append(j)
            counts["arcs"] += len(pos)
        elif task == "arc":
            neg = sample_non_arcs(s.heads, len(pos), np.random.default_rng([seed, i]))
            counts["positive_pairs"] += len(pos)
            counts["negative_pairs"] += len(neg)
            counts["negative_shortfall"] += len(pos) - len(neg)
            for (h, d), label in [(p, "arc") for p in pos] + [(p, "none") for p in neg]:
                a_idx.append(base + h)
                b_idx.append(base + d)
                labels.append(label)
                types.append(f"{s.words[h]}\x00{s.words[d]}")
                sent.append(j)
        else:
            raise ConfigError(f"not a classification task: {task!r}")
    cols = [np.asarray(a_idx, dtype=np.int64)] + ([np.asarray(b_idx, dtype=np.int64)] if task in ("deprel", "arc") else [])
    return Items(cols, labels, types, np.asarray(sent, dtype=np.int64), dict(counts))


# Hewitt & Liang (2019)'s behaviours of a word type in the dependency edge control task
EDGE_BEHAVIOURS = ("self", "first", "last")


def edge_control_heads(words: Sequence[str], seed: int) -> list[int]:
    """0-based control head of every word of a sentence under Hewitt & Liang (2019, "Designing and
    Interpreting Probes with Control Tasks", Sec. 3.2)'s control task for dependency edge
    prediction: each word TYPE is given one behaviour, drawn once at random (uniformly over the
    three, as we read their definition) and kept wherever the type occurs: attach to itself, to the
    first word of the sentence, or to the last. The draw is `baselines.control_labels`' (a hash of
    (seed, type)), so a type keeps its behaviour across splits and subsets."""
    from probes.core.baselines import control_labels

    if not words:
        return []
    behaviour = control_labels(list(words), np.full(len(EDGE_BEHAVIOURS), 1 / len(EDGE_BEHAVIOURS)), seed)
    last = len(words) - 1
    return [i if b == 0 else 0 if b == 1 else last for i, b in enumerate(behaviour)]


def build_edge_control_items(sentences, offsets: np.ndarray, sentence_ids: Sequence[int] | None = None,
                             seed: int = 0) -> Items:
    """The arc task's items under Hewitt & Liang's edge control (`edge_control_heads`), as pairs
    like the gold arc items (`build_items("arc")`). Positives: (control head, dependent) for every
    word that has a gold head (the same dependents, so as many positives as the gold task; the root
    word is left out as there). Negatives: the same dependent attached by one of the two OTHER
    behaviours (its own position, the first or the last word, whichever the type was not given;
    one drawn per dependent with the generator seeded by (seed, i)), so that where a pair's head
    sits (itself, first, last) cannot tell an arc from a non-arc and only the type's memorised
    behaviour can: Hewitt & Liang's question. With random unlinked pairs as negatives (as the gold
    task has) a probe passed the control from position and identity alone (MiniLM: control accuracy
    0.69-0.80, docs/evidence/syntax-controls.md). A dependent whose alternatives coincide with its
    control head (a sentence of one or two words) gets no negative (`negative_shortfall`).
    Deliberate difference: Hewitt & Liang's probe picks each word's head among all positions of its
    sentence (a softmax over positions); ours classifies pairs. A self-attachment is the pair (d, d);
    the gold task has none."""
    offsets = np.asarray(offsets, dtype=np.int64)
    ids = range(len(sentences)) if sentence_ids is None else [int(i) for i in sentence_ids]
    a_idx, b_idx, labels, types, sent = [], [], [], [], []
    counts: Counter = Counter()
    for j, i in enumerate(ids):
        s, base = sentences[i], int(offsets[i])
        control = edge_control_heads(s.words, seed)
        last = len(s.words) - 1
        rng = np.random.default_rng([seed, i])
        pos = [(control[d], d) for d, h in enumerate(s.heads) if h > 0]
        linked = set(pos) | {(d, h) for h, d in pos}
        neg = []
        for h, d in pos:
            other = sorted({d, 0, last} - {h})
            other = [a for a in other if (a, d) not in linked]
            if other:
                neg.append((other[int(rng.integers(len(other)))], d))
        counts["positive_pairs"] += len(pos)
        counts["self_attachments"] += sum(h == d for h, d in pos)
        counts["negative_pairs"] += len(neg)
        counts["negative_shortfall"] += len(pos) - len(neg)
        for (h, d), label in [(p, "arc") for p in pos] + [(p, "none") for p in neg]:
            a_idx.append(base + h)
            b_idx.append(base + d)
            labels.append(label)
            types.append(s.words[d])
            sent.append(j)
    cols = [np.asarray(a_idx, dtype=np.int64), np.asarray(b_idx, dtype=np.int64)]
    return Items(cols, labels, types, np.asarray(sent, dtype=np.int64), dict(counts))
