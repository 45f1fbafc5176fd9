"""CoNLL-U reader: exact counts on the real UD treebanks, a cross-check against the `conllu`
package, and a clear file:line error for each kind of malformed input."""

from pathlib import Path

import conllu as conllu_pkg
import pytest

from workbench.data.conllu import TREEBANKS, load_treebank, read_conllu, treebank_path
from workbench.errors import DataFormatError

FIX = Path(__file__).parent / "fixtures" / "data"


@pytest.fixture(scope="module")
def ewt_train():
    return load_treebank("en_ewt", "train")


def test_ewt_train_counts_match_the_readme(ewt_train):
    # README: "train 12,544 sentences / 204,577 tokens". The 204,577 are SYNTACTIC words (integer
    # ids): multiword tokens such as "don't" count as their two words "do" + "n't".
    sents = ewt_train
    assert len(sents) == 12_544
    assert sum(len(s.words) for s in sents) == 204_577
    # Independent count straight from the file: integer-id lines.
    path = treebank_path("en_ewt", "train")
    lines = path.read_text(encoding="utf-8").split("\n")
    int_ids = sum(1 for ln in lines if ln[:1].isdigit() and ln.split("\t", 1)[0].isdigit())
    ranges = [ln.split("\t", 1)[0] for ln in lines if ln[:1].isdigit() and "-" in ln.split("\t", 1)[0]]
    assert int_ids == 204_577
    # Surface tokens are fewer: each range a-b replaces b-a+1 words by one token.
    words_in_ranges = sum(int(r.split("-")[1]) - int(r.split("-")[0]) + 1 for r in ranges)
    assert (len(ranges), words_in_ranges) == (2_614, 5_229)
    assert int_ids - words_in_ranges + len(ranges) == 201_962


def test_ewt_documents_and_first_sentence(ewt_train):
    sents = ewt_train
    first = sents[0]
    assert first.doc_id == "weblog-juancole.com_juancole_20051126063000_ENG_20051126_063000"
    assert first.sent_id == first.doc_id + "-0001"
    assert first.words[:4] == ["Al", "-", "Zaman", ":"]
    assert first.heads[:4] == [0, 3, 1, 7]
    assert first.deprels[0] == "root" and first.upos[2] == "PROPN" and first.xpos[1] == "HYPH"
    assert first.text.startswith("Al-Zaman : American forces killed")
    assert len({s.doc_id for s in sents}) == 540
    assert all(s.doc_id is not None for s in sents)
    for s in sents:  # every tree has exactly one root and heads in range (validated on read)
        assert s.heads.count(0) == 1 and max(s.heads) <= len(s)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,split,n_sents,n_words",
    [
        ("en_ewt", "dev", 2_001, 25_147),
        ("en_ewt", "test", 2_077, 25_094),
        ("en_gum", "train", 9_933, 172_374),
        ("en_gum", "dev", 1_341, 23_909),
        ("en_gum", "test", 1_285, 23_991),
        ("en_pud", "test", 1_000, 21_180),
        ("es_pud", "test", 1_000, 23_283),
        ("es_gsd", "dev", 1_400, 37_154),
        ("es_gsd", "test", 427, 12_002),
    ],
)
def test_every_treebank_split_loads(name, split, n_sents, n_words):
    sents = load_treebank(name, split)
    assert (len(sents), sum(len(s) for s in sents)) == (n_sents, n_words)
    # the README figures (dev 2,001 / test 2,077 for EWT; GUM 9,933 / 1,341 / 1,285; PUD 1,000)
    for s in sents:
        assert len(s.words) == len(s.heads) == len(s.upos) == len(s.deprels) == len(s.misc) == len(s.word_lines)


def test_pud_is_parallel():
    en, es = load_treebank("en_pud", "test"), load_treebank("es_pud", "test")
    assert [s.sent_id for s in en] == [s.sent_id for s in es]


def test_words_and_heads_agree_with_the_conllu_package():
    path = treebank_path("en_pud", "test")
    ours = read_conllu(path)
    with open(path, encoding="utf-8") as f:
        theirs = list(conllu_pkg.parse_incr(f))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        words = [t for t in b if isinstance(t["id"], int)]
        assert a.words == [t["form"] for t in words]
        assert a.heads == [t["head"] for t in words]
        assert a.deprels == [t["deprel"] for t in words]
        assert a.text == b.metadata["text"]


def test_unknown_treebank_or_split():
    with pytest.raises(ValueError):
        load_treebank("en_foo", "train")
    with pytest.raises(ValueError):
        load_treebank("en_pud", "train")
    assert set(TREEBANKS) == {"en_ewt", "en_gum", "en_pud", "es_pud", "es_gsd"}


def test_multiword_tokens_and_empty_nodes():
    (s1, s2) = read_conllu(FIX / "valid_mwt.conllu")
    assert s1.doc_id == s2.doc_id == "d1"
    assert s2.words == ["do", "n't", "go", "!"]  # the range and the empty node 3.1 are not words
    assert s2.heads == [3, 3, 0, 3]
    assert s2.text == "don't go!"  # no `# text`: rebuilt from surface tokens and SpaceAfter=No
    assert s2.sent_id == "s2" and s2.line == 9 and s2.word_lines == [11, 12, 13, 15]


@pytest.mark.parametrize(
    "fixture,line,words",
    [
        ("bad_columns.conllu", 12, "10 tab-separated columns"),
        ("bad_head.conllu", 12, "not an integer"),
        ("head_range.conllu", 14, "outside 0..4"),
        ("cycle.conllu", 12, "cycle"),
        ("two_roots.conllu", 13, "2 words attach to the root"),
        ("bad_id.conllu", 12, "out of sequence"),
    ],
)
def test_malformed_input_names_file_and_line(fixture, line, words):
    path = FIX / fixture
    with pytest.raises(DataFormatError) as err:
        read_conllu(path)
    assert err.value.path == str(path)
    assert err.value.line == line
    assert words in str(err.value)
    assert str(err.value).startswith(f"{path}:{line}: ")
