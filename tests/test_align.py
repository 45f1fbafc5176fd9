"""The alignment probe: representations against hand loops, and each setting end to end on tiny models
with a planted answer (a model against itself must align perfectly; a random rotation must not)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from probes.align import reps
from workbench.errors import ConfigError, DataFormatError


# --------------------------------------------------------------------------- representations
def test_type_and_sentence_vectors_match_hand_loops():
    rng = np.random.default_rng(0)
    sentences = [["The", "cat", "sat"], ["the", "dog"], ["a", "cat", "the"]]
    n = sum(map(len, sentences))
    layers = rng.standard_normal((3, n, 4)).astype(np.float32)
    vocab = ["the", "cat", "dog", "zebra"]
    T = reps.type_vectors(layers, sentences, vocab, lowercase=True)
    flat = [w.lower() for s in sentences for w in s]
    for v, word in enumerate(vocab):
        pos = [i for i, w in enumerate(flat) if w == word]
        expected = layers[:, pos].mean(axis=1) if pos else np.zeros((3, 4))
        assert np.allclose(T[:, v], expected, atol=1e-6)
    cased = reps.type_vectors(layers, sentences, ["the"], lowercase=False)
    assert np.allclose(cased[:, 0], layers[:, [3, 7]].mean(axis=1), atol=1e-6)  # "The" is not "the"
    mask = np.zeros(n, dtype=bool)
    mask[:5] = True
    half = reps.type_vectors(layers, sentences, ["the"], mask=mask)
    assert np.allclose(half[:, 0], layers[:, [0, 3]].mean(axis=1), atol=1e-6)
    offsets = np.array([0, 3, 5, 8])
    S = reps.sentence_vectors(layers, offsets, layer_ids=[2])
    assert np.allclose(S[0, 1], layers[2, 3:5].mean(axis=0), atol=1e-6)
    with pytest.raises(ConfigError):
        reps.type_vectors(layers[:, :-1], sentences, vocab)


def test_vocabulary_keeps_dictionary_words():
    sents = [["a", "b", "a", "c"], ["a", "b", "d", "d"]]
    words, counts = reps.build_vocabulary(sents, size=1, min_count=2, lowercase=True, keep=["d", "c"])
    assert words == ["a", "d"] and counts.tolist() == [3, 2]  # c occurs once: below min_count


def test_corpus_specs_and_dictionaries(tmp_path):
    ned = reps.load_corpus("columns:nltk/conll2002/ned.train")
    assert ned.sentences[0][:3] == ["De", "tekst", "van"]  # -DOCSTART- skipped
    pud = reps.load_corpus("ud:en_pud+ud:es_pud")
    assert len(pud.sentences) == 2000 and pud.sent_ids[0] == pud.sent_ids[1000]
    assert reps.tokenize("He didn't pay $3.50, did he?") == ["He", "didn't", "pay", "$", "3.50", ",", "did", "he", "?"]
    pairs, _ = reps.load_dictionary("swadesh:en-nl")
    assert ("i", "ik") in pairs and ("dog", "hond") in pairs and all(" " not in a for a, _ in pairs)
    for bad in ("raw:nope", "ud", "txt:foo", "ud:en_pud:train"):
        with pytest.raises(ConfigError):
            reps.load_corpus(bad)
    bad = tmp_path / "d.tsv"
    bad.write_text("cat\tgato\ndog perro\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"d\.tsv:2:"):
        reps.load_dictionary(f"tsv:{bad}")
    with pytest.raises(ConfigError):
        reps.load_dictionary("swadesh:en-xx")


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory, tokenizers):
    """Two checkpoint folders holding the SAME tiny BERT (a planted perfect alignment) and one other seed."""
    from tests.conftest import tiny_bert

    tok = tokenizers["bert"]
    root = tmp_path_factory.mktemp("align")
    out = {}
    for name, seed in (("a", 0), ("a-copy", 0), ("b", 1)):
        folder = root / name
        tiny_bert(tok, seed=seed, max_positions=128, hidden=32, layers=2).save_pretrained(folder)
        tok.save_pretrained(folder)
        (folder / "manifest.json").write_text(json.dumps({"family": "bert"}))
        out[name] = folder
    return out


def run_align(folders, settings, tmp_path):
    from probes.core.runner import run_probe
    from workbench.store.results import ResultsStore

    base = {"progress": False, "n_boot": 50, "cache_dir": str(tmp_path / "cache"), "threads": 1}
    return run_probe("align", [str(f) for f in folders], {**base, **settings}, store=ResultsStore(tmp_path / "runs"))[1]


def _values(rows, task, metric, model=None):
    sub = rows[(rows["task"] == task) & (rows["metric"] == metric)]
    if model is not None:
        sub = sub[sub["model"] == model]
    return sub.sort_values("layer")["value"].to_numpy()


@pytest.mark.slow
def test_model_pair_identical_models_align_perfectly(tiny_folders, tmp_path):
    rows = run_align([tiny_folders["a"], tiny_folders["a-copy"], tiny_folders["b"]],
                {"tasks": "model-pair", "pair_words": 400, "baselines": "random_rotation", "retrieval": "cosine",
                 "pair_cka": "linear,standardized"},
                tmp_path)  # (CSLS need not retrieve an identical point: an anti-hub neighbour can outscore it)
    extra = rows["extra"].map(lambda e: json.loads(e) if e else {})
    pair = rows[extra.map(lambda e: e.get("other_model") == "a-copy") & (rows["model"] == "a")]
    j = extra[pair.index].map(lambda e: e["other_layer"])
    for metric in ("cka", "cka_standardized", "retrieval"):
        diag = pair[(pair["metric"] == metric) & (pair["layer"] == j)]["value"]
        assert len(diag) == 3 and np.allclose(diag, 1.0)
    share = _values(rows, "model-pair", "top_dim_variance_share", "a")
    assert len(share) == 3 and np.all((share > 0) & (share < 1))
    rot = pair[pair["metric"] == "retrieval_rotation"]["value"]
    assert rot.max() < 0.2
    other = rows[extra.map(lambda e: e.get("other_model") == "b") & (rows["model"] == "a") & (rows["metric"] == "cka")]
    assert len(other) == 9 and other["value"].max() < 0.999  # a different seed is not the same space
    assert np.isclose(_values(rows, "model-pair", "cka_to_layer0", "a")[0], 1.0)
    from probes.align import summary

    text = summary(rows)
    assert "cka: a (rows) x a-copy" in text and "retrieval_rotation: a (rows) x b" in text


@pytest.mark.slow
def test_fake_language_against_itself_and_parallel_and_dutch_pair(tiny_folders, tmp_path):
    a = str(tiny_folders["a"])
    same = tmp_path / "en-en.tsv"  # an English-English dictionary: word alignment on the same sentences
    same.write_text("".join(f"{w}\t{w}\n" for w in ("the", "be", "of", "and", "a", "in", "have", "say", "year")))
    rows = run_align([a], {"tasks": "fake-language,parallel", "target_checkpoint": str(tiny_folders["a-copy"]),
                      "dictionary": f"tsv:{same}",
                      "shift_target": False, "fake_corpus": "ud:en_ewt:dev", "max_sentences": 300,
                      "vocab_size": 150, "parallel_src": "ud:en_pud", "parallel_tgt": "ud:en_pud",
                      "baselines": "random_rotation,random_init"}, tmp_path)
    # the target side is the same weights reading the same text: Procrustes must find the identity
    p1 = _values(rows, "fake-language", "p_at_1", "a")
    assert len(p1) == 3 and np.all(p1 == 1.0)
    assert np.all(_values(rows, "fake-language", "p_at_1_rotation", "a") < 0.2)
    assert np.all(_values(rows, "parallel", "accuracy", "a") > 0.98)
    assert np.all(_values(rows, "parallel", "accuracy_rotation", "a") < 0.1)
    assert np.all(_values(rows, "parallel", "word_alignment", "a") == 1.0)
    assert np.all(_values(rows, "parallel", "word_alignment_chance", "a") < 0.3)
    twin = rows[rows["model"].str.endswith("(random init)")]
    assert set(twin["task"]) == {"fake-language", "parallel"}

    # a language pair the code was not written for runs from config alone: English <-> Dutch
    nl = run_align([a], {"tasks": "bli", "src_corpus": "ud:en_ewt:dev", "tgt_corpus": "columns:nltk/conll2002/ned.testa",
                    "dictionary": "swadesh:en-nl", "max_sentences": 600, "vocab_size": 300, "min_count": 2,
                    "baselines": ""}, tmp_path / "nl")
    p = _values(nl, "bli", "p_at_10")
    assert len(p) == 3 and np.all((p >= 0) & (p <= 1))
    assert nl[nl["metric"] == "p_at_1"]["n"].iloc[0] >= 4
    assert len(_values(nl, "bli", "static_p_at_1")) == 1


@pytest.mark.slow
def test_diachronic_same_corpus_does_not_move(tiny_folders, tmp_path):
    rows = run_align([str(tiny_folders["a"])], {"tasks": "diachronic", "old_corpus": "ud:en_ewt:dev",
                                           "new_corpus": "ud:en_ewt:dev", "max_sentences": 0, "vocab_size": 200,
                                           "anchors": 100, "baselines": ""}, tmp_path)
    disp = _values(rows, "diachronic", "displacement")
    split = _values(rows, "diachronic", "split_half_displacement")
    assert np.all(disp < 1e-6)  # the same vectors on both sides
    assert np.all(split > 1e-3)  # two halves of a corpus do differ: the noise floor is real
    extra = json.loads(rows[(rows["metric"] == "top_moved_excess") & (rows["layer"] == 2)]["extra"].iloc[0])
    assert len(extra["top_moved"]) == 20
    from probes.align import summary

    assert "most moved, a layer 2" in summary(rows)


def test_bad_settings_fail_before_loading(tiny_folders, tmp_path):
    for bad in ({"retrieval": "euclid"}, {"test_fraction": 1.5}, {"src_corpus": "brown"}, {"csls_k": 0},
                {"baselines": "majority"}, {"seed_dictionary": "words"}, {"pair_cka": "rbf"}, {"pair_cka": ""}):
        with pytest.raises(ConfigError):
            run_align([tiny_folders["a"]], {"tasks": "bli", **bad}, tmp_path)
