"""Tokenizers of the four kinds trained on a real corpus' TRAIN split, their special tokens and
post-processors, the on-disk caches, and the memory-mapped TokenizedCorpus."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from tokenizers import trainers

from workbench.data.corpus import build_corpus
from workbench.data_cache import TokenizedCorpus
from workbench.families.base import FamilySpec, add_special_tokens, contiguous_blocks, special_tokens_mask, t5_sentinels
from workbench.store.identity import tokenizer_hash
from workbench.tokenization import train_tokenizer

WORDS = ["Fellow", "citizens", "of", "the", "Senate", "preserve", "protect"]


def _spec(name, kind, specials, **kw) -> FamilySpec:
    presets = {p: {} for p in ("tiny", "small", "base")}
    return FamilySpec(name=name, tokenizer_kind=kind, special_tokens=specials, presets=presets,
                      build_model=None, make_collator=None, **kw)


BERT = _spec("bert", "wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
ROBERTA = _spec("roberta", "bytelevel_bpe", ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
T5 = _spec("t5", "unigram", ["<pad>", "</s>", "<unk>"] + t5_sentinels(100))
ELMO = _spec("elmo", "word", ["<pad>", "<UNK>", "<S>", "</S>"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(["inaugural", "state_union"], tmp_path_factory.mktemp("corpus"), heldout_fraction=0.2,
                        seed=0, max_documents=30)


@pytest.fixture(scope="module")
def tokdir(tmp_path_factory):
    return tmp_path_factory.mktemp("tok")


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec, first, last, n_special",
    [(BERT, "[CLS]", "[SEP]", 2), (ROBERTA, "<s>", "</s>", 2), (T5, None, "</s>", 1), (ELMO, "<S>", "</S>", 2)],
    ids=["wordpiece", "bytelevel_bpe", "unigram", "word"],
)
def test_each_kind_adds_its_family_specials_to_split_words(corpus, tokdir, spec, first, last, n_special):
    tok = train_tokenizer(spec, corpus, 1500, cache_dir=tokdir, show_progress=False)
    assert len(tok) == 1500
    enc = tok(WORDS, is_split_into_words=True)
    toks = tok.convert_ids_to_tokens(enc["input_ids"])
    if first:
        assert toks[0] == first
    assert toks[-1] == last
    word_ids = enc.word_ids()
    assert sorted({w for w in word_ids if w is not None}) == list(range(len(WORDS)))  # every word has a subword
    assert sum(w is None for w in word_ids) == n_special == tok.num_special_tokens_to_add()
    # Special tokens in their roles; the post-processor equals add_special_tokens on raw ids.
    assert tok.pad_token is not None and tok.unk_token is not None
    raw = tok("the people", add_special_tokens=False)["input_ids"]
    assert add_special_tokens(tok, raw) == tok("the people")["input_ids"]
    ids, types = add_special_tokens(tok, raw, raw, return_type_ids=True)
    assert ids == tok("the people", "the people")["input_ids"]
    mask = special_tokens_mask(torch.tensor(ids), tok)
    assert int(mask.sum()) == tok.num_special_tokens_to_add(pair=True)
    # Text round trip (word-level splits punctuation off, so compare words).
    assert tok.decode(tok("the Senate")["input_ids"], skip_special_tokens=True).split() == ["the", "Senate"]


def test_bert_pairs_get_segment_ids_and_t5_has_sentinels(corpus, tokdir):
    bert = train_tokenizer(BERT, corpus, 1500, cache_dir=tokdir, show_progress=False)
    enc = bert("the people", "of the union")
    n_a = len(bert("the people")["input_ids"])
    assert enc["token_type_ids"] == [0] * n_a + [1] * (len(enc["input_ids"]) - n_a)
    t5 = train_tokenizer(T5, corpus, 1500, cache_dir=tokdir, show_progress=False)
    ids = t5.convert_tokens_to_ids(t5_sentinels(100))
    assert len(set(ids)) == 100 and t5.unk_token_id not in ids
    assert t5.convert_ids_to_tokens(t5("<extra_id_7> people")["input_ids"])[0] == "<extra_id_7>"


def test_tokenizer_sees_train_split_only(corpus, tmp_path):
    """A word-level vocabulary large enough for every train word contains no held-out-only word."""
    tok = train_tokenizer(ELMO, corpus, 60_000, cache_dir=tmp_path, show_progress=False)
    pre = tok.backend_tokenizer.pre_tokenizer

    def words(split):
        return {w for d in corpus.documents(split) for line in d.text.split("\n")
                for w, _ in pre.pre_tokenize_str(line)}

    train, held = words("train"), words("heldout")
    held_only = held - train
    assert len(held_only) > 50  # the test has teeth
    vocab = tok.get_vocab()
    assert train <= set(vocab)
    assert not (held_only & set(vocab)), sorted(held_only & set(vocab))[:10]
    assert re.fullmatch(r"[0-9a-f]{64}", tokenizer_hash(tok))


def test_tokenizer_cache_is_reused_and_keyed_by_settings(corpus, tmp_path):
    a = train_tokenizer(BERT, corpus, 800, cache_dir=tmp_path, show_progress=False)
    assert len(list(tmp_path.iterdir())) == 1
    b = train_tokenizer(BERT, corpus, 800, cache_dir=tmp_path, show_progress=False)
    assert a.get_vocab() == b.get_vocab() and len(list(tmp_path.iterdir())) == 1
    train_tokenizer(BERT, corpus, 900, cache_dir=tmp_path, show_progress=False)
    assert len(list(tmp_path.iterdir())) == 2


def test_tokenized_corpus_matches_direct_encoding_and_is_cached(corpus, tokdir, tmp_path):
    tok = train_tokenizer(BERT, corpus, 1500, cache_dir=tokdir, show_progress=False)
    tc = TokenizedCorpus.build(tok, corpus, "train", cache_dir=tmp_path, show_progress=False)
    docs = corpus.documents("train")
    assert tc.num_documents == len(docs) and tc.doc_ids == [d.doc_id for d in docs]
    assert isinstance(tc.ids, np.memmap) and tc.ids.dtype == np.uint16
    lines = [ln for ln in docs[3].text.split("\n") if ln.strip()]
    sents = tc.document(3)
    assert len(sents) == len(lines)
    for line, ids in zip(lines[:20], sents):
        assert ids.tolist() == tok(line, add_special_tokens=False)["input_ids"]
    assert tc.num_tokens == int(tc.sentence_offsets[-1]) == len(tc.ids)
    assert tc.separator_id == tok.sep_token_id and tc.num_special == 2
    # Reused: a second build returns the same folder without rewriting it.
    mtime = (tc.path / "ids.npy").stat().st_mtime_ns
    again = TokenizedCorpus.build(tok, corpus, "train", cache_dir=tmp_path, show_progress=False)
    assert again.path == tc.path and (again.path / "ids.npy").stat().st_mtime_ns == mtime
    held = TokenizedCorpus.build(tok, corpus, "heldout", cache_dir=tmp_path, show_progress=False)
    assert held.path != tc.path and set(held.doc_ids).isdisjoint(tc.doc_ids)
    # Default packing leaves room for [CLS] ... [SEP].
    blocks = list(contiguous_blocks(tc, 32, np.random.default_rng(0)))
    assert blocks and all(len(b) == 30 for b in blocks)
    assert len(add_special_tokens(tok, blocks[0])) == 32


@pytest.mark.slow
def test_wordpiece_training_is_reproducible_and_matches_the_library_trainer():
    """tokenizers' WordPieceTrainer can give different vocabularies for the same text (ties broken
    in hash-map order, huggingface/tokenizers#1794); ours gives one, and nearly the same pieces."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from workbench.data.conllu import load_treebank
    from workbench.tokenization import build_tokenizer

    texts = [s.text for s in load_treebank("en_ewt", "train")]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    ours = [build_tokenizer("wordpiece", specials, texts, vocab_size=4000).get_vocab() for _ in range(3)]
    assert ours[0] == ours[1] == ours[2] and len(ours[0]) == 4000
    assert [p for p, i in sorted(ours[0].items(), key=lambda kv: kv[1])][:5] == specials

    library = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    library.normalizer = normalizers.BertNormalizer(strip_accents=False, lowercase=False)
    library.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    library.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=4000, special_tokens=specials,
                                                                 show_progress=False))
    assert len(set(ours[0]) & set(library.get_vocab())) >= 0.99 * 4000  # the same pieces but for count ties
    assert any(p.startswith("##") and len(p) > 3 for p in ours[0])


def test_wordpiece_private_use_characters_never_reach_training():
    """Continuations are spelled in Unicode's private use area while training; the BERT normalizer
    removes such characters from the text, so they cannot collide with the corpus' own."""
    from workbench.tokenization import build_tokenizer

    tok = build_tokenizer("wordpiece", ["[PAD]", "[UNK]"], ["plain words", "odd \U000F0001x here"] * 5, vocab_size=60)
    assert not any(0xF0000 <= ord(c) <= 0xFFFFD for piece in tok.get_vocab() for c in piece)
    assert tok.convert_ids_to_tokens(tok("odd words", add_special_tokens=False)["input_ids"])[0] == "odd"


@pytest.mark.slow
def test_unigram_training_is_reproducible_and_as_good_as_the_library_scores(tmp_path):
    """tokenizers' UnigramTrainer sums in hash-map order, so two trainings give other scores and
    ids; ours re-estimates the scores deterministically: identical tokenizer files, and held-out
    text cut into as many pieces as with the library's scores (within 1%)."""
    from tokenizers import Tokenizer

    from workbench.data.conllu import load_treebank
    from workbench.tokenization import build_tokenizer

    texts = [s.text for s in load_treebank("en_ewt", "train")][:2000]
    held = [s.text for s in load_treebank("en_ewt", "dev")][:500]
    specials = ["<pad>", "</s>", "<unk>"]
    files = []
    for i in range(2):
        build_tokenizer("unigram", specials, texts, vocab_size=1000).save_pretrained(tmp_path / str(i))
        files.append((tmp_path / str(i) / "tokenizer.json").read_bytes())
    assert files[0] == files[1]
    ours = Tokenizer.from_file(str(tmp_path / "0" / "tokenizer.json"))
    vocab = json.loads(files[0])["model"]["vocab"]
    assert [p for p, _ in vocab[:3]] == specials and len(vocab) == 1000
    scores = [s for _, s in vocab[3:]]
    assert scores == sorted(scores, reverse=True)  # canonical ids: by score
    assert abs(math.fsum(math.exp(s) for s in scores) - 1) < 1e-9  # a probability distribution

    library = Tokenizer.from_str(ours.to_str())
    library.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=1000, special_tokens=specials,
                                                               unk_token="<unk>", show_progress=False))
    assert len(set(library.get_vocab()) & set(ours.get_vocab())) >= 0.98 * 1000
    n_ours = sum(len(ours.encode(t).ids) for t in held)
    n_library = sum(len(library.encode(t).ids) for t in held)
    print(f"EWT dev pieces: rescored {n_ours}, library scores {n_library}")
    assert abs(n_ours - n_library) <= 0.01 * n_library


def test_tokenization_does_not_import_the_families():
    """No import circle data_cache -> tokenization -> families/base -> data_cache: tokenisation takes
    any object with the recipe's fields (a FamilySpec is one) and imports nothing from the families,
    not even for type checking; at run time neither module pulls them in."""
    import ast
    import inspect
    import subprocess
    import sys

    import workbench.tokenization

    tree = ast.parse(inspect.getsource(workbench.tokenization))
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [m for m in imported if m.startswith("workbench.families")]
    code = ("import sys, workbench.data_cache, workbench.tokenization; "
            "print(sorted(m for m in sys.modules if m.startswith('workbench.families')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
