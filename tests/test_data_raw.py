"""Raw corpora, WordNet and Swadesh on the real data root: document counts, word counts checked
against published figures or an independent count over the files, and real entries."""

import functools
import os
import re

import pytest

from workbench.data import wordnet as wn
from workbench.data.raw import LABELS, RAW_CORPORA, count_words, decode, load_labelled, source_files
from workbench.data.raw import load_documents as _load_documents
from workbench.data.swadesh import bilingual_dictionary, load_swadesh, swadesh_languages
from workbench.paths import data_path


@functools.lru_cache(maxsize=None)
def _cached(name):
    return _load_documents(name)


def load_documents(name):
    """Each corpus is read once per test session (the tests only read the documents)."""
    return _cached(name)


def _words(docs):
    return sum(count_words(d.text) for d in docs)


def _lines(docs):
    return sum(d.text.count("\n") + 1 for d in docs)


@pytest.mark.slow
def test_all_corpora_load_with_unique_ids_and_no_empty_lines():
    for name in RAW_CORPORA:
        docs = load_documents(name)
        ids = [d.doc_id for d in docs]
        assert len(ids) == len(set(ids)), name
        prefix = {"ewt_raw": "en_ewt/", "gum_raw": "en_gum/"}.get(name, name + "/")
        assert all(d.source == name and d.doc_id.startswith(prefix) for d in docs), name
        assert all(d.text and "" not in d.text.split("\n") for d in docs), name


def test_brown_matches_the_nltk_figures():
    docs = load_documents("brown")
    # 500 samples; NLTK's brown.words() and brown.sents() give 1,161,192 words and 57,340 sentences
    assert len(docs) == 500 and docs[0].doc_id == "brown/ca01" and docs[-1].doc_id == "brown/cr09"
    assert _words(docs) == 1_161_192
    assert _lines(docs) == 57_340
    first = docs[0].text.split("\n")[0]
    assert first.startswith('The Fulton County Grand Jury said Friday an investigation of Atlanta\'s recent primary election produced " no evidence "')
    assert "/at" not in docs[0].text and "/nn" not in docs[0].text


def test_wikitext2_matches_the_published_token_counts():
    docs = load_documents("wikitext2")
    # Merity et al. (2016): valid 217,646 and test 245,569 tokens, counting one <eos> per line
    # (3,760 and 4,358 lines); without the <eos> that is 213,886 + 241,211 words.
    assert _words(docs) == (217_646 - 3_760) + (245_569 - 4_358) == 455_097
    assert len(docs) == 122  # 60 + 62 ` = Title = ` headings
    assert sum(d.doc_id.startswith("wikitext2/valid/") for d in docs) == 60
    test_first = next(d for d in docs if d.doc_id == "wikitext2/test/0001")
    assert test_first.text.split("\n")[0] == "= Robert <unk> ="
    assert all(d.text.startswith("= ") and not d.text.startswith("= =") for d in docs)


@pytest.mark.parametrize(
    "name,n_docs",
    [("abc", 3_189), ("webtext", 6), ("state_union", 65), ("inaugural", 59), ("sentence_polarity", 10_662),
     ("movie_reviews", 2_000), ("subjectivity", 10_000)],
)
def test_plain_text_corpora_keep_every_word_of_their_files(name, n_docs):
    docs = load_documents(name)
    assert len(docs) == n_docs
    expected = sum(len(decode(p).split()) for p in source_files(name))
    assert _words(docs) == expected


def test_abc_documents_are_blank_line_blocks():
    docs = load_documents("abc")
    assert docs[0].doc_id == "abc/rural/0001"
    assert docs[0].text.split("\n")[0] == "PM denies knowledge of AWB kickbacks"
    assert docs[1].text.split("\n")[0] == "Email questions"
    n_rural = sum(d.doc_id.startswith("abc/rural/") for d in docs)
    blocks = re.split(r"\n\s*\n", decode(data_path("nltk", "abc", "rural.txt")).replace("\r", "").strip())
    assert n_rural == len(blocks)


def test_treebank_raw_text_is_grouped_by_document():
    ewt = load_documents("ewt_raw")
    assert len(ewt) == 540 + 318 + 316 and _lines(ewt) == 12_544 + 2_001 + 2_077
    assert ewt[0].doc_id == "en_ewt/train/weblog-juancole.com_juancole_20051126063000_ENG_20051126_063000"
    assert ewt[0].text.startswith("Al-Zaman : American forces killed Shaikh Abdullah al-Ani")
    gum = load_documents("gum_raw")
    assert len(gum) == 225 and _lines(gum) == 9_933 + 1_341 + 1_285
    assert gum[0].text.split("\n")[:2] == ["Aesthetic Appreciation and Spanish Art:", "Insights from Eye-Tracking"]


def test_spanish_corpora():
    with pytest.warns(UserWarning, match="3 trees with unbalanced brackets"):
        cess = _load_documents("cess_esp")
    assert len(cess) == 609 and _lines(cess) == 6_016  # 6,016 trees, each starting with a lone "("
    assert cess[0].text.split("\n")[0].startswith(
        "El grupo estatal Electricité de France ( EDF ) anunció hoy , jueves , la compra del 51 por ciento"
    )
    assert "*0*" not in "".join(d.text for d in cess) and "_" not in cess[0].text
    conll = load_documents("conll2002_esp")
    # every token line of esp.train/testa/testb is a word; blank lines separate 11,755 sentences
    token_lines = sum(1 for p in source_files("conll2002_esp") for ln in decode(p).split("\n") if ln.strip())
    assert _words(conll) == token_lines == 369_171
    assert _lines(conll) == 8_323 + 1_915 + 1_517
    assert conll[1].text.split("\n")[0] == "Santander , 25 may ( EFE ) ."


def test_sentiment_sets_are_labelled_in_document_order():
    for name, counts in {
        "sentence_polarity": {"pos": 5_331, "neg": 5_331},
        "movie_reviews": {"pos": 1_000, "neg": 1_000},
        "subjectivity": {"subj": 5_000, "obj": 5_000},
    }.items():
        examples = load_labelled(name)
        docs = load_documents(name)
        assert [e.text for e in examples] == [d.text for d in docs]
        assert {lab: sum(e.label == lab for e in examples) for lab in LABELS[name]} == counts
        assert all(d.doc_id.split("/")[1] == e.label for d, e in zip(docs, examples))
    pos = load_labelled("sentence_polarity")[0]
    assert pos == ("the rock is destined to be the 21st century's new \" conan \" and that he's going to make a "
                   "splash even greater than arnold schwarzenegger , jean-claud van damme or steven segal .", "pos")
    with pytest.raises(ValueError):
        load_labelled("brown")


# --------------------------------------------------------------------------- WordNet

@pytest.fixture(scope="module")
def wordnet_reader(tmp_path_factory):
    """WordNet with its cache in a temporary folder (nothing is written into the data root)."""
    old = os.environ.get("BERTOLOGY_CACHE")
    os.environ["BERTOLOGY_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    wn.wordnet.cache_clear()
    try:
        yield wn.wordnet()
    finally:
        wn.wordnet.cache_clear()
        if old is None:
            os.environ.pop("BERTOLOGY_CACHE", None)
        else:
            os.environ["BERTOLOGY_CACHE"] = old


@pytest.mark.slow
def test_wordnet_relations(wordnet_reader):
    assert wn.antonyms("hot") == ["cold"]
    assert "bad" in wn.antonyms("good") and "small" in wn.antonyms("big")
    assert wn.hypernyms("dog", "n")[:3] == ["canine", "canid", "domestic animal"]  # canine.n.02 < domestic_animal.n.01
    assert "automobile" in wn.synonyms("car", "n") and "car" not in wn.synonyms("car", "n")
    dog = wordnet_reader.synset("dog.n.01")
    assert dog.lexname() == "noun.animal" and wordnet_reader.synset("run.v.01").lexname() == "verb.motion"
    assert [s.name() for s, _ in wn.hypernym_synsets("dog", "n")][0] == "dog.n.01"
    assert (wn.wordnet_dir() / "lexnames").is_file()
    assert not (data_path("wordnet-3.0") / "lexnames").exists()


def test_lexnames_agree_with_every_synset_in_the_data_files():
    """The 45 names are the fixed WordNet 3.0 list: each synset's lex_filenum must name a file of
    its own part of speech, and all 45 numbers are used."""
    prefix = {"n": "noun.", "v": "verb.", "a": "adj.", "s": "adj.", "r": "adv."}
    used = set()
    n_synsets = 0
    for suffix in ("noun", "verb", "adj", "adv"):
        for line in data_path("wordnet-3.0", f"data.{suffix}").read_text(encoding="utf-8").split("\n"):
            if not line or line.startswith("  "):
                continue
            _, lex_filenum, ss_type = line.split(" ", 3)[:3]
            num, name, _ = wn.LEXNAMES[int(lex_filenum)]
            assert num == int(lex_filenum) and name.startswith(prefix[ss_type]), line[:40]
            used.add(int(lex_filenum))
            n_synsets += 1
    assert n_synsets == 117_659  # WordNet 3.0
    assert used == set(range(45))


# --------------------------------------------------------------------------- Swadesh

def test_swadesh_lists_and_dictionary():
    assert len(swadesh_languages()) == 24 and {"en", "es", "de", "fr"} <= set(swadesh_languages())
    en, es = load_swadesh("en"), load_swadesh("es")
    assert len(en) == len(es) == 207
    assert en[1] == ["you", "thou"] and es[1] == ["tú", "usted"]  # gloss "(singular)" removed
    pairs = bilingual_dictionary("en", "es")
    assert len(pairs) == 207
    d = dict(pairs)
    assert (d["dog"], d["water"], d["two"], d["mother"], d["eat"]) == ("perro", "agua", "dos", "madre", "comer")
    assert pairs[0] == ("I", "yo")
    assert ("you", "usted") in bilingual_dictionary("en", "es", all_variants=True)
    # Old Church Slavonic lacks 33 concepts: those give no pair
    assert len(bilingual_dictionary("en", "cu")) == 207 - 33
