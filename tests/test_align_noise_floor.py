"""The diachronic task's split-half noise floor (probes/align/tasks.py::split_half_mask) splits the old
corpus by document, the independent unit, not by sentence.

A planted null: two corpora drawn from one process (nothing moved), whose word vectors carry a strong
per-document usage of each word (a speech's pet phrase) on top of the word's own vector. Halves of
sentences share every document's usage, so their split-half displacement sees token noise only and
every word of an old-vs-new comparison (different documents) looks "moved"; halves of documents see the
document effect too, and the share of words above the floor sits at chance.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from probes.align import reps


def _words(n: int) -> list[str]:
    return [f"w{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(n)]  # alphabetic: the task keeps isalpha()


def _null_corpora(seed=0, n_docs=16, sents_per_doc=12, vocab=80, H=16, layers=2, doc_sd=1.0, token_sd=0.3):
    """old and new: documents of the same process; an occurrence's vector = the word's base vector +
    its document's usage of it (sd `doc_sd`) + token noise (sd `token_sd`), per layer."""
    rng = np.random.default_rng(seed)
    words = _words(vocab)
    base = rng.standard_normal((layers, vocab, H)) * 3
    corpora, acts = [], []
    for side in ("old", "new"):
        sents, docs, vecs = [], [], []
        for d in range(n_docs):
            usage = rng.standard_normal((layers, vocab, H)) * doc_sd
            for _ in range(sents_per_doc):
                ids = rng.integers(0, vocab, 25)
                sents.append([words[i] for i in ids])
                docs.append(f"{side}/{d}.txt")
                vecs.append(base[:, ids] + usage[:, ids] + rng.standard_normal((layers, len(ids), H)) * token_sd)
        corpora.append(reps.Corpus(side, sents, [], docs=docs))
        acts.append(SimpleNamespace(layers=np.concatenate(vecs, axis=1).astype(np.float32)))
    return corpora, acts


class _Unit:
    """What `diachronic_task` asks of a runner unit: cached activations by key, rows, a log."""

    def __init__(self, acts):
        self.acts = acts
        self.messages = []

    def activations(self, sentences, key):
        return self.acts[key.rsplit(":", 1)[-1]]

    def rows(self, task, metrics, *, split, layers=None, n=None, ci=None, extra=None):
        from probes.core.rows import layer_rows

        return layer_rows(metrics, probe="align", task=task, split=split, layers=layers, n=n, ci=ci, extra=extra,
                          model="planted", family="bert", seed=0, step=None, stack="body")

    def log(self, message):
        self.messages.append(message)


def _diachronic(corpora, acts, monkeypatch=None, **overrides):
    from probes.align import Settings
    from probes.align.tasks import diachronic_task
    from probes.core.runner import make_settings

    settings = make_settings(Settings, {"tasks": ["diachronic"], "old_corpus": "raw:old", "new_corpus": "raw:new",
                                        "vocab_size": 80, "anchors": 40, "min_count": 3, "top_moved": 5,
                                        "baselines": "", "progress": False, **overrides})
    prepared = SimpleNamespace(data={"corpora": {"raw:old": corpora[0], "raw:new": corpora[1]}})
    unit = _Unit({"old": acts[0], "new": acts[1]})
    rows = pd.concat(diachronic_task(unit, prepared, settings), ignore_index=True)
    return rows, unit


def _per_layer(rows, metric):
    return rows[rows["metric"] == metric].sort_values("layer")["value"].to_numpy()


def test_the_halves_never_share_a_document(monkeypatch):
    """Every mask `diachronic_task` hands to `reps.type_vectors` for the old corpus puts each document's
    words on one side only (before: each sentence drew its side, so every document sat on both)."""
    corpora, acts = _null_corpora()
    old = corpora[0]
    masks = []
    real = reps.type_vectors

    def spy(layers, sentences, vocab, lowercase=True, layer_ids=None, mask=None):
        if mask is not None and sentences is old.sentences:
            masks.append(np.asarray(mask, dtype=bool))
        return real(layers, sentences, vocab, lowercase, layer_ids, mask)

    monkeypatch.setattr(reps, "type_vectors", spy)
    rows, _ = _diachronic(corpora, acts)
    assert len(masks) == 2 and np.array_equal(masks[0], ~masks[1])
    word_doc = np.repeat(np.asarray(old.docs), [len(s) for s in old.sentences])
    for mask in masks:
        assert not set(word_doc[mask]) & set(word_doc[~mask])  # no document on both sides
        assert len(set(word_doc[mask])) == 8  # half of the 16 documents
    extra = json.loads(rows[rows["metric"] == "displacement"]["extra"].iloc[0])
    assert extra["split_half_unit"] == "document" and extra["split_half_sizes"] == [8, 8]


def test_on_a_null_the_floor_matches_the_displacement_and_the_moved_share_sits_at_chance():
    """Nothing moved: the noise floor is the displacement's own level and about half of the words are
    above it (0.86-1.08 and 0.45-0.59 over seeds 0-2). With sentence halves (before) the floor was a
    quarter of the displacement (0.24-0.29: a word occurs ~4 times per document, so both halves mostly
    hold the same documents' usage) and 98-100% of the words read as moved."""
    corpora, acts = _null_corpora()
    rows, _ = _diachronic(corpora, acts)
    disp, floor = _per_layer(rows, "displacement"), _per_layer(rows, "noise_floor")
    moved = _per_layer(rows, "moved_fraction")
    assert len(disp) == 2
    assert np.all((floor / disp > 0.6) & (floor / disp < 1.6)), (floor, disp)
    # 80 words: a share's sd at chance is ~0.06; 0.25-0.75 is 4 sd from 0.5, and far from the 1.0 of before
    assert np.all((moved > 0.25) & (moved < 0.75)), moved


def test_a_planted_move_still_clears_the_document_floor():
    """The floor is not so high that a real move hides under it: every word moved on the new side is above it."""
    corpora, acts = _null_corpora(seed=1)
    new_words = [w for s in corpora[1].sentences for w in s]
    moved_ids = {w for w in _words(80)[60:]}  # 20 words moved, the anchors (the 40 most frequent) mostly not
    shift = np.random.default_rng(9).standard_normal((2, 1, 16)) * 6
    hit = np.array([w in moved_ids for w in new_words])
    acts[1].layers[:, hit] += shift.astype(np.float32)
    rows, _ = _diachronic(corpora, acts, top_moved=20)
    listed = json.loads(rows[rows["metric"] == "top_moved_excess"]["extra"].iloc[0])["top_moved"]
    assert len({w["word"] for w in listed} & moved_ids) >= 15


def test_a_corpus_without_documents_falls_back_to_sentences_and_says_so():
    from probes.align import split_half_mask

    c = reps.Corpus("ud:x", [["a", "b"], ["c"], ["d", "e", "f"], ["g"]] * 5, [])
    mask, unit, sizes = split_half_mask(c, seed=0)
    assert unit == "sentence" and sum(sizes) == 20 and mask.shape == (35,)
    one = reps.Corpus("raw:x", c.sentences, [], docs=["only"] * 20)
    assert split_half_mask(one, seed=0)[1] == "sentence"  # one document cannot be halved
    two = reps.Corpus("raw:x", c.sentences, [], docs=[f"d{i % 4}" for i in range(20)])
    mask, unit, sizes = split_half_mask(two, seed=0)
    per_sentence = np.add.reduceat(mask, np.r_[0, np.cumsum([len(s) for s in two.sentences])[:-1]])
    side = {}
    for d, k, s in zip(two.docs, per_sentence, two.sentences):
        assert k in (0, len(s))  # a sentence is whole on one side
        side.setdefault(d, set()).add(bool(k))
    assert unit == "document" and sizes == [2, 2] and all(len(v) == 1 for v in side.values())


@pytest.mark.parametrize("spec,docs", [("ud:en_ewt:dev", 318), ("columns:nltk/conll2002/ned.testa", 74)])
def test_treebanks_and_column_files_record_their_documents(spec, docs):
    c = reps.load_corpus(spec)
    assert c.docs is not None and len(c.docs) == len(c.sentences) and len(set(c.docs)) == docs
    assert reps.sample_corpus(c, 500, 0).docs is not None  # kept through sampling
