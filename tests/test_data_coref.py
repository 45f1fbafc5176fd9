"""GUM coreference from the MISC `Entity=` brackets: exact counts on GUM train, cross-checked by
an independent count over the raw file, and one chain checked by hand."""

import re
from pathlib import Path

import pytest

from workbench.data.conllu import load_treebank, read_conllu, read_gum_coref, treebank_path
from workbench.errors import DataFormatError

FIX = Path(__file__).parent / "fixtures" / "data"


@pytest.fixture(scope="module")
def gum_train():
    sents = load_treebank("en_gum", "train")
    mentions, chains = read_gum_coref(sents)
    return sents, mentions, chains


def _raw_counts():
    """Independent count: every '(' in an Entity= value opens one mention; entities are
    distinct (document, id) pairs of those openings."""
    openings = 0
    entities = set()
    doc = None
    for line in treebank_path("en_gum", "train").read_text(encoding="utf-8").split("\n"):
        if line.startswith("# newdoc id = "):
            doc = line[len("# newdoc id = "):]
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            continue
        for attr in cols[9].split("|"):
            if attr.startswith("Entity="):
                ids = re.findall(r"\(([^-()]+)-", attr)
                openings += len(ids)
                entities.update((doc, i) for i in ids)
    return openings, len(entities)


@pytest.mark.slow
def test_gum_train_mention_and_chain_counts(gum_train):
    _, mentions, chains = gum_train
    assert len(mentions) == 48_348
    assert len(chains) == 25_104
    assert _raw_counts() == (48_348, 25_104)
    assert sum(len(c) for c in chains.values()) == len(mentions)
    # 173 documents; singletons are chains of one mention
    assert len({m.doc_id for m in mentions}) == 173
    sizes = [len(c) for c in chains.values()]
    assert sizes.count(1) > 0 and max(sizes) > 50


def test_every_mention_closes_inside_its_sentence(gum_train):
    sents, mentions, chains = gum_train
    for m in mentions:
        s = sents[m.sent_index]
        assert 0 <= m.start <= m.end < len(s.words)
        assert m.doc_id == s.doc_id
        assert m.entity_id.startswith(m.doc_id + "/")
        assert m.text == " ".join(s.words[m.start : m.end + 1])
    for eid, chain in chains.items():
        assert all(m.entity_id == eid for m in chain)
        assert [(m.sent_index, m.start) for m in chain] == sorted((m.sent_index, m.start) for m in chain)
    # entity ids restart in each document: id "1" exists in many documents, as separate chains
    assert sum(1 for eid in chains if eid.endswith("/1")) > 100


def test_one_chain_checked_by_hand(gum_train):
    """GUM_news_stampede, entity 2 ("the stampede"), read off the file (word numbers 1-based):
    s1  4 `Entity=(2-event-new-...(3-...)`  5 `Entity=2)`          -> "Hajj stampede"
    s4 15 `Entity=(2-event-giv:inact-...`  16 `Entity=2)`          -> "a stampede"
    s5  1 `Entity=(2-event-giv:act-...`     8 `Entity=12)2)`       -> "The stampede at Islam 's most holy site"
    s6  1 `Entity=(2-event-giv:act-...`     2 `Entity=2)`          -> "The stampede"
    s10 1 `Entity=(2-event-giv:inact-sssss-cf1-1-ana)`             -> "This"
    """
    sents, _, chains = gum_train
    chain = chains["GUM_news_stampede/2"]
    got = [(sents[m.sent_index].sent_id, m.start + 1, m.end + 1, m.text, m.entity_type) for m in chain]
    assert got == [
        ("GUM_news_stampede-1", 4, 5, "Hajj stampede", "event"),
        ("GUM_news_stampede-4", 15, 16, "a stampede", "event"),
        ("GUM_news_stampede-5", 1, 8, "The stampede at Islam 's most holy site", "event"),
        ("GUM_news_stampede-6", 1, 2, "The stampede", "event"),
        ("GUM_news_stampede-10", 1, 1, "This", "event"),
    ]
    # nested mention inside s4's "the annual Hajj pilgrimage near Mecca , Saudi Arabia" (entity 3),
    # closed by `Entity=11)10)3)` on "Arabia"
    hajj = [(sents[m.sent_index].sent_id, m.text) for m in chains["GUM_news_stampede/3"]]
    assert ("GUM_news_stampede-4", "the annual Hajj pilgrimage near Mecca , Saudi Arabia") in hajj
    assert hajj[0] == ("GUM_news_stampede-1", "Hajj")


@pytest.mark.slow
def test_dev_and_test_parse():
    for split, (n_mentions, n_chains) in {"dev": (6_688, 3_296), "test": (6_773, 3_766)}.items():
        mentions, chains = read_gum_coref(load_treebank("en_gum", split))
        assert (len(mentions), len(chains)) == (n_mentions, n_chains)


@pytest.mark.parametrize(
    "fixture,line,words",
    [("entity_unclosed.conllu", 5, "never closes"), ("entity_stray_close.conllu", 7, "closes but is not open")],
)
def test_malformed_entities_name_file_and_line(fixture, line, words):
    path = FIX / fixture
    with pytest.raises(DataFormatError) as err:
        read_gum_coref(read_conllu(path))
    assert (err.value.path, err.value.line) == (str(path), line)
    assert words in str(err.value)


def test_field_order_comes_from_the_global_entity_header():
    sents = read_conllu(FIX / "entity_stray_close.conllu")
    assert sents[0].entity_fields == ("GRP", "etype", "infstat")
    sents[0].misc[2] = "_"  # drop the stray close: now well-formed
    mentions, chains = read_gum_coref(sents)
    assert [(m.start, m.end, m.entity_type, m.entity_id) for m in mentions] == [(0, 1, "animal", "d1/1")]
