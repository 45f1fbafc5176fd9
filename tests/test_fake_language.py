"""Fake-English (K et al. 2020): a disjoint, structure-preserving copy of the text, as a corpus source."""

from __future__ import annotations

from tokenizers import normalizers, pre_tokenizers

from workbench.data.corpus import build_corpus
from workbench.data.fake_language import base_source, shift_text


def test_shift_is_disjoint_and_keeps_segmentation():
    text = 'The cat, aged 3.5, said "don\'t" (naïve).'
    fake = shift_text(text)
    letters = {c for c in text if not c.isspace()}
    assert not letters & set(fake)  # no shared character at all
    assert len({shift_text(c) for c in letters}) == len(letters)  # one-to-one
    norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False)
    assert norm.normalize_str(fake) == fake and normalizers.NFKC().normalize_str(fake) == fake
    pre = pre_tokenizers.BertPreTokenizer()
    words = [w for w, _ in pre.pre_tokenize_str(text)]
    assert [shift_text(w) for w in words] == [w for w, _ in pre.pre_tokenize_str(fake)]
    assert base_source("shifted:wikitext2") == "wikitext2" and base_source("brown") == "brown"


def test_shifted_source_in_the_corpus_builder(tmp_path):
    corpus = build_corpus(["inaugural", "shifted:inaugural"], tmp_path / "c", heldout_fraction=0.2, seed=0,
                          max_documents=5)
    manifest = corpus.manifest
    langs = {s: v["language"] for s, v in manifest["counts"]["by_source"].items()}
    assert langs == {"inaugural": "en", "shifted:inaugural": "en-shifted"}
    ids = manifest["doc_ids"]["train"] + manifest["doc_ids"]["heldout"]
    shifted = [i for i in ids if i.startswith("shifted:")]
    assert len(shifted) == 5 and len(ids) == 10
    by = manifest["counts"]["by_source"]
    assert by["inaugural"]["train"]["documents"] + by["inaugural"]["heldout"]["documents"] == 5
