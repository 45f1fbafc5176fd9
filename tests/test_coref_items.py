"""GUM mention pairs and the rule baselines, checked by hand on GUM_news_stampede (train); GAP heuristics
on hand-read rows."""

import numpy as np
import pytest

from probes.coref.items import (Pairs, antecedent_correct, anaphoric_mentions, baseline_pair_predictions,
                                gap_nearest_name, gap_subject_name, gum_documents, mention_pairs, rule_antecedents,
                                sentence_index)
from workbench.data.conllu import load_treebank, read_gum_coref
from workbench.data.gap import read_gap
from workbench.errors import ConfigError


@pytest.fixture(scope="module")
def stampede():
    sents = load_treebank("en_gum", "train")
    mentions, _ = read_gum_coref(sents)
    docs = gum_documents(sents, mentions)
    (doc,) = [d for d in docs if d.doc_id == "GUM_news_stampede"]
    return doc


# The first nine mentions, read off the file (document word positions: s1 = 0-4, s2 = 5-10, s3 = 11-19):
# m0 Hundreds (e1)  m1 Hajj stampede (e2)  m2 Hajj (e3)  m3 Thursday (e4)
# m4 January 12 , 2006 (e4, appositive)  m5 2006 (e5)  m6 The Plains of Arafat on the day of Hajj (e6)
# m7 the day of Hajj (e7)  m8 Hajj (e3)
HAND = [
    (0, 0, "Hundreds", "Hundreds", "1", "person", "nominal"),
    (3, 4, "Hajj stampede", "stampede", "2", "event", "nominal"),
    (3, 3, "Hajj", "Hajj", "3", "event", "proper"),
    (5, 5, "Thursday", "Thursday", "4", "time", "proper"),
    (7, 10, "January 12 , 2006", "12", "4", "time", "nominal"),  # "12" heads it: January -> 12 -> Thursday
    (10, 10, "2006", "2006", "5", "time", "nominal"),
    (11, 19, "The Plains of Arafat on the day of Hajj", "Plains", "6", "place", "proper"),
    (16, 19, "the day of Hajj", "day", "7", "time", "nominal"),
    (19, 19, "Hajj", "Hajj", "3", "event", "proper"),
]


def test_document_mentions_heads_and_types(stampede):
    got = [(m.start, m.end, m.text, m.head_text, m.entity.split("/")[-1], m.etype, m.mtype)
           for m in stampede.mentions[:9]]
    assert got == HAND
    assert stampede.words[:5] == ["Hundreds", "dead", "in", "Hajj", "stampede"]
    assert stampede.sentence_starts[:4] == [0, 5, 11, 20]


def test_pairs_window_positives_and_negatives(stampede):
    doc = type(stampede)(stampede.doc_id, stampede.words, stampede.sentence_starts, stampede.mentions[:9])
    p = mention_pairs([doc], k=3)
    pairs = {(int(a), int(c)): int(y) for a, c, y in zip(p.anaphor, p.candidate, p.label)}
    # mention i is paired with the 3 before it (fewer at the start): 0+1+2+3*6 = 21 pairs
    assert len(pairs) == 21
    assert {c for a, c in pairs if a == 4} == {1, 2, 3}
    assert [pairs[(4, c)] for c in (1, 2, 3)] == [0, 0, 1]  # the appositive and its anchor
    # m8 "Hajj" corefers with m2, 6 mentions back: outside K=3, so all its pairs are negative
    assert [pairs[(8, c)] for c in (5, 6, 7)] == [0, 0, 0] and (8, 2) not in pairs
    assert sum(pairs.values()) == 1
    p20 = mention_pairs([doc], k=20)
    assert len(p20.label) == 36 and p20.label.sum() == 2
    assert set(zip(p20.anaphor[p20.label == 1].tolist(), p20.candidate[p20.label == 1].tolist())) == {(4, 3), (8, 2)}
    assert p20.distance[(p20.anaphor == 8) & (p20.candidate == 2)].tolist() == [6]
    with pytest.raises(ConfigError):
        mention_pairs([doc], k=0)


def test_baselines_by_hand(stampede):
    doc = type(stampede)(stampede.doc_id, stampede.words, stampede.sentence_starts, stampede.mentions[:9])
    p = mention_pairs([doc], k=20)
    b = baseline_pair_predictions([doc], p)
    on = lambda name: set(zip(p.anaphor[b[name] == 1].tolist(), p.candidate[b[name] == 1].tolist()))  # noqa: E731
    assert on("string_match") == {(8, 2)}  # "Hajj" == "Hajj"
    assert on("head_match") == {(8, 2)}
    assert on("nearest_mention") == {(i, i - 1) for i in range(1, 9)}
    assert b["majority"].sum() == 0
    # antecedent accuracy over the two anaphoric mentions (m4, m8)
    correct, docs = antecedent_correct(b["nearest_mention"], p, require_positive=1)
    assert correct.tolist() == [True, False] and docs.tolist() == [0, 0]
    correct, _ = antecedent_correct(b["string_match"], p, require_positive=1)
    assert correct.tolist() == [False, True]
    # Clark et al.'s rules on the same mentions
    assert anaphoric_mentions(doc) == [4, 8]
    assert rule_antecedents(doc) == {"nearest_mention": [True, False], "head_match": [False, True]}


def test_antecedent_argmax_prefers_nearer_on_ties():
    # one anaphor (3) with candidates 0, 1, 2; only 0 is coreferent
    p = Pairs(np.array([3, 3, 3]), np.array([0, 1, 2]), np.array([1, 0, 0]), np.zeros(3, int), np.array([3, 2, 1]))
    scores = np.array([[0.9, 0.1, 0.2], [0.5, 0.1, 0.5], [0.5, 0.1, 0.4]])
    correct, _ = antecedent_correct(scores, p)
    assert correct[:, 0].tolist() == [True, False, True]


def test_gap_heuristics_on_hand_read_rows():
    df = read_gap("development")
    r = df.iloc[1]  # "... MacKenzie studied with Bernard Leach from 1949 to 1952. His simple, ..."
    assert (r.pronoun, r.a, r.b, r.label) == ("His", "MacKenzie", "Bernard Leach", "A")
    assert gap_nearest_name(r) == "B"  # Leach is nearer to "His"
    assert gap_subject_name(r) == "A"  # MacKenzie opens the sentence before the pronoun's
    assert sentence_index(["A", "b", ".", "C", "?", "d"]).tolist() == [0, 0, 0, 1, 1, 2]
