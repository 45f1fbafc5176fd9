"""Coreference examples: GUM documents with their mentions, mention pairs, baselines, GAP heuristics.

Pure data code for `probes.coref` (no model): what an example is and what the rule-based
baselines predict, each testable by hand.

GUM (Zeldes 2017) gold mentions and chains come from `workbench.data.conllu.read_gum_coref`.
A mention's HEAD WORD is the word of its span whose syntactic head lies outside the span (the
first such word when a span has several); its TYPE follows Clark et al. (2019): pronoun (head
UPOS PRON, or DET standing alone as a one-word mention, e.g. "This"), proper (PROPN), else nominal.

Mention pairs (the edge-probing formulation of Tenney et al. 2019, with the candidate window of
mention-pair coreference models): every mention i is paired with each of the K mentions before it
in its document (fewer at the start), label 1 when both belong to the same chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from workbench.errors import ConfigError

MENTION_TYPES = ("pronoun", "proper", "nominal")


@dataclass
class DocMention:
    """A mention with document-level word positions (inclusive span, 0-based)."""

    start: int
    end: int
    head: int
    entity: str
    etype: str
    text: str
    head_text: str
    mtype: str
    sentence: int  # index of the sentence within the document


@dataclass
class Document:
    doc_id: str
    words: list[str]
    sentence_starts: list[int]  # document position of each sentence's first word (+ total at the end)
    mentions: list[DocMention] = field(default_factory=list)

    @property
    def antecedents(self) -> list[list[int]]:
        """For each mention, the indices of the earlier mentions of its chain."""
        seen: dict[str, list[int]] = {}
        out = []
        for i, m in enumerate(self.mentions):
            out.append(list(seen.get(m.entity, [])))
            seen.setdefault(m.entity, []).append(i)
        return out


def span_head(heads: Sequence[int], start: int, end: int) -> int:
    """Sentence index (0-based) of the head word of words start..end; `heads` are CoNLL-U HEADs (1-based, 0 = root)."""
    for w in range(start, end + 1):
        h = heads[w] - 1
        if h < start or h > end:
            return w
    return start  # unreachable for a tree (some word of a span has its head outside it); kept safe


def mention_type(upos: str, one_word: bool) -> str:
    if upos == "PRON" or (upos == "DET" and one_word):
        return "pronoun"
    if upos == "PROPN":
        return "proper"
    return "nominal"


def gum_documents(sentences, mentions) -> list[Document]:
    """Group sentences into documents (in file order) and place each mention in its document."""
    docs: list[Document] = []
    where: dict[int, tuple[int, int, int]] = {}  # sentence index -> (doc index, doc offset, sentence-in-doc)
    for si, s in enumerate(sentences):
        doc_id = s.doc_id or s.path
        if not docs or docs[-1].doc_id != doc_id:
            docs.append(Document(doc_id, [], []))
        d = docs[-1]
        where[si] = (len(docs) - 1, len(d.words), len(d.sentence_starts))
        d.sentence_starts.append(len(d.words))
        d.words.extend(s.words)
    for d in docs:
        d.sentence_starts.append(len(d.words))
    for m in mentions:
        di, off, sj = where[m.sent_index]
        s = sentences[m.sent_index]
        h = span_head(s.heads, m.start, m.end)
        docs[di].mentions.append(DocMention(
            start=off + m.start, end=off + m.end, head=off + h, entity=m.entity_id, etype=m.entity_type,
            text=m.text, head_text=s.words[h], mtype=mention_type(s.upos[h], m.start == m.end), sentence=sj,
        ))  # fmt: skip
    for d in docs:  # the reader's order: (sentence, start, longer first)
        d.mentions.sort(key=lambda x: (x.start, -x.end))
    return docs


@dataclass
class Pairs:
    """Mention pairs of a list of documents: `anaphor[p]` is paired with the earlier `candidate[p]`
    (global mention indices: documents' mentions concatenated in order)."""

    anaphor: np.ndarray
    candidate: np.ndarray
    label: np.ndarray  # int64 0/1
    doc: np.ndarray  # document index of each pair
    distance: np.ndarray  # anaphor - candidate, in mentions (1 = the previous mention)


def mention_pairs(docs: Sequence[Document], k: int = 20) -> Pairs:
    """Every mention paired with each of the (up to) `k` mentions before it in its document."""
    if k < 1:
        raise ConfigError(f"mention-pair window k must be >= 1, got {k}")
    a, c, y, dd, dist = [], [], [], [], []
    base = 0
    for di, d in enumerate(docs):
        ents = [m.entity for m in d.mentions]
        for i in range(len(ents)):
            for j in range(max(0, i - k), i):
                a.append(base + i)
                c.append(base + j)
                y.append(int(ents[i] == ents[j]))
                dd.append(di)
                dist.append(i - j)
        base += len(ents)
    arr = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return Pairs(arr(a), arr(c), arr(y), arr(dd), arr(dist))


def all_mentions(docs: Sequence[Document]) -> list[DocMention]:
    return [m for d in docs for m in d.mentions]


# --------------------------------------------------------------------------- pair baselines


def baseline_pair_predictions(docs: Sequence[Document], pairs: Pairs) -> dict[str, np.ndarray]:
    """0/1 predictions of the rule baselines for every pair:
    string_match (same lower-cased text), head_match (same lower-cased head word),
    nearest_mention (the candidate is the mention right before), majority (never coreferent)."""
    ms = all_mentions(docs)
    text = np.array([m.text.lower() for m in ms], dtype=object)
    head = np.array([m.head_text.lower() for m in ms], dtype=object)
    return {
        "string_match": (text[pairs.anaphor] == text[pairs.candidate]).astype(np.int64),
        "head_match": (head[pairs.anaphor] == head[pairs.candidate]).astype(np.int64),
        "nearest_mention": (pairs.distance == 1).astype(np.int64),
        "majority": np.zeros(len(pairs.label), dtype=np.int64),
    }


def antecedent_correct(scores: np.ndarray, pairs: Pairs, require_positive: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Antecedent accuracy per anaphoric mention: is the best-scoring candidate in the mention's chain?

    scores: [..., P] pair scores. Only mentions with at least one coreferent candidate in their
    window count. Ties go to the nearer candidate. With `require_positive`, a mention whose best
    score is below it picks no antecedent (wrong): the rule baselines' "no match found".
    Returns (correct [..., A] bool, document index [A]) for the A anaphoric mentions.
    """
    scores = np.asarray(scores, dtype=np.float64)
    lead = scores.shape[:-1]
    flat = scores.reshape(-1, scores.shape[-1])
    order = np.lexsort((pairs.distance, pairs.anaphor))  # by anaphor, nearest candidate first
    an = pairs.anaphor[order]
    bounds = np.flatnonzero(np.r_[True, an[1:] != an[:-1], True])
    starts, ends = bounds[:-1], bounds[1:]
    lab = pairs.label[order]
    has_pos = np.add.reduceat(lab, starts) > 0 if len(lab) else np.zeros(0, dtype=bool)
    keep = np.flatnonzero(has_pos)
    out = np.zeros((flat.shape[0], len(keep)), dtype=bool)
    for r in range(flat.shape[0]):
        s = flat[r, order]
        for o, g in enumerate(keep):
            seg = s[starts[g]:ends[g]]
            best = int(np.argmax(seg))  # first max = nearest candidate
            ok = lab[starts[g] + best] == 1
            if require_positive is not None and seg[best] < require_positive:
                ok = False
            out[r, o] = ok
    return out.reshape(*lead, len(keep)), pairs.doc[order][starts[keep]]


# --------------------------------------------------------------------------- attention baselines (Clark et al. 2019)


def anaphoric_mentions(doc: Document) -> list[int]:
    """Indices of the mentions that have at least one earlier mention in their chain."""
    return [i for i, ante in enumerate(doc.antecedents) if ante]


def rule_antecedents(doc: Document) -> dict[str, list[bool]]:
    """Clark et al.'s rule baselines for every anaphoric mention of `doc` (in `anaphoric_mentions` order):
    nearest_mention (the previous mention is in the chain) and head_match (the nearest earlier mention
    with the same lower-cased head word is in the chain; none found = wrong)."""
    ms = doc.mentions
    near, head = [], []
    for i in anaphoric_mentions(doc):
        near.append(ms[i - 1].entity == ms[i].entity)
        h = ms[i].head_text.lower()
        match = next((j for j in range(i - 1, -1, -1) if ms[j].head_text.lower() == h), None)
        head.append(match is not None and ms[match].entity == ms[i].entity)
    return {"nearest_mention": near, "head_match": head}


# --------------------------------------------------------------------------- GAP heuristics

_SENTENCE_END = {".", "!", "?"}


def sentence_index(words: Sequence[str]) -> np.ndarray:
    """Sentence number of each word: a new sentence starts after '.', '!' or '?'."""
    out = np.zeros(len(words), dtype=np.int64)
    s = 0
    for i, w in enumerate(words):
        out[i] = s
        if w in _SENTENCE_END:
            s += 1
    return out


def gap_nearest_name(row) -> str:
    """'A' or 'B': the candidate whose span is nearer (in words) to the pronoun ("token distance",
    Webster et al. 2018); ties go to the earlier candidate."""
    p = row.pronoun_start
    da = min(abs(p - row.a_start), abs(p - row.a_end))
    db = min(abs(p - row.b_start), abs(p - row.b_end))
    return "A" if da <= db else "B"


def gap_subject_name(row) -> str:
    """'A' or 'B' by a subject-position rule standing in for the paper's syntactic parallelism
    (we have no parser for GAP): English names that open a clause before the pronoun are usually
    its subject, so pick the candidate that comes FIRST in the pronoun's sentence before the
    pronoun; if neither is there, the first candidate of the nearest earlier sentence holding one;
    if both follow the pronoun (cataphora), the nearer one."""
    sent = sentence_index(row.words)
    ps = sent[row.pronoun_start]
    cands = [("A", row.a_start), ("B", row.b_start)]
    before = [(sent[s], s, name) for name, s in cands if s < row.pronoun_start]
    if not before:
        return gap_nearest_name(row)
    same = [(s, name) for si, s, name in before if si == ps]
    if same:
        return min(same)[1]
    last = max(si for si, _, _ in before)
    return min((s, name) for si, s, name in before if si == last)[1]


def gap_decisions(label: str) -> tuple[bool, bool]:
    """(A-coref, B-coref) of a predicted label 'A', 'B' or 'NEITHER'."""
    return label == "A", label == "B"
