"""ELMo family (Peters et al. 2018): shapes, padding, directionality, checkpoints, training, scalar mix.

Everything runs a `tiny` model with a word-level tokenizer trained on real WikiText-2 text.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from safetensors import safe_open

from tests.training_helpers import run_tiny_training
from workbench.families.elmo import (
    FAMILY,
    ElmoConfig,
    ElmoForBiLM,
    ElmoModel,
    ScalarMix,
    batch_characters,
    build_model,
    char_table,
    make_collator,
    sentence_examples,
    word_characters,
)
from workbench.families.elmo_modules import fit_char_width
from workbench.running.models import ModelHandle
from workbench.paths import data_path
from workbench.tokenization import build_tokenizer


def _wikitext_sentences(split: str, limit: int) -> list[str]:
    """WikiText-2 paragraphs split at " . " into sentences (headings and blank lines skipped)."""
    out = []
    for line in data_path("wikitext-2", f"{split}.txt").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("="):
            continue
        for sent in re.split(r"(?<= \.) ", line):
            if len(sent.split()) >= 4:
                out.append(sent)
                if len(out) >= limit:
                    return out
    return out


@pytest.fixture(scope="module")
def corpus():
    return {"train": _wikitext_sentences("valid", 3000), "heldout": _wikitext_sentences("test", 64)}


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return build_tokenizer(
        "word", FAMILY.special_tokens, corpus["train"], 3000,
        special_roles=FAMILY.special_roles, template=FAMILY.template,
    )


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    return build_model(FAMILY.model_config("tiny"), tokenizer).eval()


def _encode(tokenizer, texts):
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def _states(elmo, ids, mask=None):
    with torch.no_grad():
        return torch.stack(elmo(ids, attention_mask=mask, output_hidden_states=True).hidden_states)


def test_tokenizer_adds_sentence_boundaries(tokenizer):
    ids = tokenizer("the game was released").input_ids
    assert ids[0] == tokenizer.convert_tokens_to_ids("<S>") and ids[-1] == tokenizer.convert_tokens_to_ids("</S>")
    assert len(ids) == 6


def test_hidden_states_shapes_and_layer0_is_duplicated_token_representation(model, tokenizer, corpus):
    cfg = model.config
    assert cfg.model_type == "elmo" and cfg.hidden_size == 2 * cfg.projection_dim == 64
    ids, mask = _encode(tokenizer, corpus["heldout"][:4])
    out = model.elmo(ids, attention_mask=mask, output_hidden_states=True)
    B, T = ids.shape
    assert len(out.hidden_states) == cfg.num_hidden_layers + 1 == 3
    assert all(h.shape == (B, T, 64) for h in out.hidden_states)
    assert torch.equal(out.last_hidden_state, out.hidden_states[-1])
    h0 = out.hidden_states[0]
    assert torch.equal(h0[..., :32], h0[..., 32:])
    x = model.elmo.token_encoder(ids)
    valid = mask.bool()
    torch.testing.assert_close(h0[..., :32][valid], x[valid])
    # padding positions are zero in every layer; real positions are not
    for h in out.hidden_states:
        assert h[~valid].abs().max() == 0
        assert h[valid].abs().sum(-1).min() > 0
    # a plain tuple when asked, like any HF model
    tup = model.elmo(ids, attention_mask=mask, output_hidden_states=True, return_dict=False)
    assert len(tup) == 2 and len(tup[1]) == 3


def test_padding_invariance_both_directions(model, tokenizer, corpus):
    short, long = corpus["heldout"][0], corpus["heldout"][1] + " " + corpus["heldout"][2]
    ids_alone, _ = _encode(tokenizer, [short])
    ids, mask = _encode(tokenizer, [short, long])
    n = ids_alone.shape[1]
    assert ids.shape[1] > n + 5  # the batch really pads the short sentence
    alone = _states(model.elmo, ids_alone)[:, 0]
    batched = _states(model.elmo, ids, mask)[:, 0, :n]
    torch.testing.assert_close(batched, alone, atol=1e-6, rtol=1e-5)
    # left padding (the same sentence shifted right) gives the same states at its positions
    pad = tokenizer.pad_token_id
    left = torch.cat([torch.full((1, 7), pad), ids_alone], dim=1)
    left_mask = torch.cat([torch.zeros(1, 7, dtype=torch.long), torch.ones_like(ids_alone)], dim=1)
    shifted = _states(model.elmo, left, left_mask)[:, 0]
    torch.testing.assert_close(shifted[:, 7:], alone, atol=1e-6, rtol=1e-5)
    assert shifted[:, :7].abs().max() == 0


def test_forward_sees_no_future_and_backward_no_past(model, tokenizer, corpus):
    ids, _ = _encode(tokenizer, [corpus["heldout"][3]])
    T, p, H = ids.shape[1], 6, model.config.projection_dim
    changed = ids.clone()
    changed[0, p] = tokenizer.convert_tokens_to_ids("the") if ids[0, p] != tokenizer.convert_tokens_to_ids("the") else 5
    a, b = _states(model.elmo, ids)[:, 0], _states(model.elmo, changed)[:, 0]  # [L+1, T, 2H]
    diff_f = (a[1:, :, :H] - b[1:, :, :H]).abs().amax(dim=(0, 2))  # per position, over LSTM layers
    diff_b = (a[1:, :, H:] - b[1:, :, H:]).abs().amax(dim=(0, 2))
    assert diff_f[:p].max() == 0 and diff_b[p + 1 :].max() == 0
    # ...and each direction does see the change at and beyond (before) the perturbed position
    assert diff_f[p:].min() > 1e-7 and diff_b[: p + 1].min() > 1e-7
    diff_x = (a[0] - b[0]).abs().amax(dim=1)
    assert diff_x[p] > 0 and diff_x[torch.arange(T) != p].max() == 0


def test_save_pretrained_and_automodel_roundtrip(model, tokenizer, corpus, tmp_path):
    from transformers import AutoConfig, AutoModel, AutoModelForPreTraining

    import workbench.families  # noqa: F401 - registers ELMo with the Auto classes, as the handle does

    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "elmo"
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved_chars = f.get_tensor("elmo.token_encoder.char_ids")
    assert torch.equal(saved_chars, model.elmo.token_encoder.char_ids)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), ElmoConfig)
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    assert type(loaded) is ElmoModel
    ids, mask = _encode(tokenizer, corpus["heldout"][:3])
    torch.testing.assert_close(_states(loaded, ids, mask), _states(model.elmo, ids, mask), atol=1e-6, rtol=0)
    full = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert type(full) is ElmoForBiLM
    batch = make_collator({}, tokenizer)([tokenizer(s, add_special_tokens=False).input_ids for s in corpus["heldout"][:3]])
    with torch.no_grad():
        torch.testing.assert_close(full(**batch).loss, model(**batch).loss)


def test_character_table_and_spelling_rules(model, tokenizer):
    cfg = model.config
    table = model.elmo.token_encoder.char_ids
    assert table.shape == (len(tokenizer), cfg.max_chars)
    the = tokenizer.convert_tokens_to_ids("the")
    assert table[the].tolist() == word_characters("the", cfg.max_chars)
    assert word_characters("the", 8) == [257, ord("t") + 1, ord("h") + 1, ord("e") + 1, 258, 0, 0, 0]
    # any Unicode word is spelled by its UTF-8 bytes; the empty word is [BOW, EOW]
    assert word_characters("é", 6) == [257, 0xC3 + 1, 0xA9 + 1, 258, 0, 0]
    assert word_characters("", 5) == [257, 258, 0, 0, 0]
    with pytest.raises(Exception, match="max_chars"):
        word_characters("a", 2)
    # long words are truncated to max_chars like ELMo's; special tokens get their own marker characters
    assert word_characters("x" * 100, 20)[-1] == 258 and len(word_characters("x" * 100, 20)) == 20
    special_rows = {tuple(table[tokenizer.convert_tokens_to_ids(t)].tolist()) for t in FAMILY.special_tokens}
    assert len(special_rows) == len(FAMILY.special_tokens)
    # a vocabulary word spelled like a special token ("unk" from WikiText's "<unk>") keeps its own characters
    unk_word = tokenizer.convert_tokens_to_ids("unk")
    assert unk_word != tokenizer.unk_token_id
    assert table[unk_word].tolist() == word_characters("unk", cfg.max_chars) != table[tokenizer.unk_token_id].tolist()
    with pytest.raises(Exception, match="num_special_chars"):
        char_table({"a": 0, "[A]": 1, "[B]": 2}, ["[A]", "[B]"], 10, num_special_chars=1)


@pytest.mark.parametrize("word", ["", "a", "cat", "Zürich", "x" * 60, "東京タワー" * 3])
@pytest.mark.parametrize("width", [3, 5, 8, 20])
def test_wide_character_input_is_truncated_like_word_characters(word, width):
    wide = batch_characters([[word]], 1)  # untruncated: as wide as the word needs
    assert wide.shape[-1] == max(3, len(word.encode("utf-8")) + 2)
    assert fit_char_width(wide, width)[0, 0].tolist() == word_characters(word, width)


def _oov_states(model, tokenizer, words: list[str]) -> torch.Tensor:
    """All layers [L+1, n, 2H] of one sentence, unknown words read from their spelling (char_ids)."""
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(["<S>", *words, "</S>"])])
    vocab = tokenizer.get_vocab()
    spell = [[None, *(w if w not in vocab else None for w in words), None]]
    with torch.no_grad():
        out = model.elmo(ids, output_hidden_states=True, char_ids=batch_characters(spell, ids.shape[1]))
    return torch.stack(out.hidden_states)[:, 0, 1:-1]


def test_unknown_words_are_read_from_their_own_characters(model, tokenizer):
    """Open-vocabulary input (Peters et al. 2018): two different unknown words differ from each
    other and from [UNK]; the same word in the same context is the same; vocabulary words are read
    exactly as from their ids; a 60-character word and non-ASCII words work."""
    vocab = tokenizer.get_vocab()
    oov = ["zyzzogeton", "quokkas", "Zürich", "東京", "x" * 60, "x" * 59 + "y"]
    assert not any(w in vocab for w in oov)
    assert all(tokenizer(w, add_special_tokens=False).input_ids == [tokenizer.unk_token_id] for w in oov[:4])
    states = {w: _oov_states(model, tokenizer, ["the", w, "was", "released"]) for w in oov}
    ids_only = model.elmo(torch.tensor([tokenizer.convert_tokens_to_ids(["<S>", "the", "[UNK]", "was", "released", "</S>"])]),
                          output_hidden_states=True).hidden_states
    unk_states = torch.stack(ids_only)[:, 0, 1:-1]
    for a in oov[:5]:
        assert not torch.allclose(states[a][:, 1], unk_states[:, 1], atol=1e-4), a
        for b in oov[:5]:
            if a != b:
                assert (states[a][0, 1] - states[b][0, 1]).abs().max() > 1e-4, (a, b)
    # the same word in the same context: identical, and the context words before it too
    torch.testing.assert_close(_oov_states(model, tokenizer, ["the", "quokkas", "was", "released"]), states["quokkas"])
    # left of the unknown word, the forward half cannot see it; the words are vocabulary words,
    # read identically with and without char_ids
    torch.testing.assert_close(states["quokkas"][:, 0, :32], unk_states[:, 0, :32])
    # max_chars = 20 in `tiny`: two 60-character words that differ only past the cut are read alike
    torch.testing.assert_close(states["x" * 60], states["x" * 59 + "y"])
    with pytest.raises(ValueError, match="char_ids"):
        model.elmo(torch.tensor([[1, 2]]), char_ids=torch.zeros(1, 3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="char_ids"):
        model.elmo(torch.tensor([[1, 2]]), char_ids=torch.full((1, 2, 5), 10_000))


def test_collator_targets_and_loss_terms(model, tokenizer, corpus):
    examples = [tokenizer(s, add_special_tokens=False).input_ids for s in corpus["heldout"][:2]]
    batch = make_collator({}, tokenizer)(examples, torch.Generator().manual_seed(0))
    ids, fl, bl = batch["input_ids"], batch["forward_labels"], batch["backward_labels"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    n0 = len(examples[0]) + 2
    assert ids[0, :n0].tolist() == [bos, *examples[0], eos]
    assert fl[0, : n0 - 1].tolist() == ids[0, 1:n0].tolist() and fl[0, n0 - 1 :].eq(-100).all()
    assert bl[0, 1:n0].tolist() == ids[0, : n0 - 1].tolist() and bl[0, 0] == -100 and bl[0, n0:].eq(-100).all()
    with torch.no_grad():
        out = model(**batch)
    terms = out.loss_terms
    assert set(terms) == {"forward", "backward"}
    torch.testing.assert_close(out.loss, (terms["forward"] + terms["backward"]) / 2)
    # an untrained model is close to uniform over the vocabulary
    assert abs(float(out.loss) - np.log(len(tokenizer))) < 0.5


def test_scalar_mix_weights_and_value(model, tokenizer, corpus):
    mix = model.elmo.scalar_mix()
    with torch.no_grad():
        mix.scalar_parameters.copy_(torch.tensor([0.3, -1.0, 2.0]))
        mix.gamma.fill_(0.7)
    w = mix.weights()
    torch.testing.assert_close(w.sum(), torch.tensor(1.0))
    ids, mask = _encode(tokenizer, corpus["heldout"][:2])
    with torch.no_grad():
        vectors = model.elmo.elmo_vectors(ids, mask, mix)
        hs = model.elmo(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    e = np.exp([0.3, -1.0, 2.0])
    s = e / e.sum()
    expected = 0.7 * (s[0] * hs[0] + s[1] * hs[1] + s[2] * hs[2])
    torch.testing.assert_close(vectors, expected.float())
    with pytest.raises(ValueError):
        ScalarMix(2)(hs)


def test_attentions_refused_and_embedding_variant(model, tokenizer, corpus):
    ids, mask = _encode(tokenizer, corpus["heldout"][:2])
    with pytest.raises(ValueError, match="no attention"):
        model.elmo(ids, attention_mask=mask, output_attentions=True)
    torch.manual_seed(0)
    plain = build_model({**FAMILY.model_config("tiny"), "token_encoder": "embedding"}, tokenizer).eval()
    hs = _states(plain.elmo, ids, mask)
    assert hs.shape == (3, *ids.shape, 64)
    assert torch.equal(hs[0, ..., :32], hs[0, ..., 32:])


class _SentenceCorpus:
    """The part of `TokenizedCorpus` that `sentence_examples` reads (offsets + sentence(i))."""

    def __init__(self, sentences: list[list[int]]):
        self.ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in sentences])
        self.sentence_offsets = np.concatenate([[0], np.cumsum([len(s) for s in sentences])])

    def sentence(self, i):
        return self.ids[self.sentence_offsets[i] : self.sentence_offsets[i + 1]]


def test_sentence_examples_cover_every_word_in_shuffled_order():
    sents = [[1, 2, 3], [], [4, 5, 6, 7, 8, 9, 10], [11]]
    corpus = _SentenceCorpus(sents)
    a = list(sentence_examples(corpus, 5, np.random.default_rng(0)))
    assert all(1 <= len(ex) <= 3 for ex in a)
    assert sorted(w for ex in a for w in ex) == list(range(1, 12))
    assert [4, 5, 6] in a and [7, 8, 9] in a and [10] in a
    orders = {tuple(map(tuple, sentence_examples(corpus, 5, np.random.default_rng(s)))) for s in range(6)}
    assert len(orders) > 1  # the order depends on the seed


@pytest.mark.slow
def test_workbench_loop_trains_tiny_elmo_and_checkpoint_opens(tmp_path, monkeypatch):
    """30 steps of the workbench's own loop (real inaugural + State of the Union documents, word
    tokenizer, sentence examples, this collator) lower the fixed held-out loss; the checkpoint opens
    with `AutoModel` as a bare ElmoModel and with the model handle."""
    from transformers import AutoModel

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    run = run_tiny_training("elmo", 30, tmp_path / "out", checkpoints={"log_spaced": False})
    before, after = run.heldout_before, run.heldout_after
    print(f"workbench loop, tiny ELMo, 30 steps: held-out {before} -> {after}")
    assert abs(before["loss"] - np.log(1000)) < 0.3  # untrained: ~uniform over the 1000-word vocabulary
    assert after["loss"] < before["loss"] - 1.0
    assert after["forward"] < before["forward"] - 1.0 and after["backward"] < before["backward"] - 1.0
    assert json.loads((run.checkpoint / "manifest.json").read_text())["family"] == "elmo"
    body = AutoModel.from_pretrained(run.checkpoint).eval()
    assert type(body) is ElmoModel and body.config.vocab_size == 1000
    handle = ModelHandle.load(run.checkpoint)
    words = ["We", "shall", "not", "fail", "."]
    (states,) = list(handle.word_states([words]))
    assert states.shape == (3, 5, 64) and np.isfinite(states).all()


def _unigram_cross_entropy(train_batch: dict, heldout_batch: dict, key: str, vocab_size: int) -> float:
    """Held-out cross-entropy (nats) of add-one-smoothed training target frequencies: a context-free LM."""
    train = train_batch[key][train_batch[key] != -100]
    counts = torch.bincount(train, minlength=vocab_size).double() + 1
    logp = (counts / counts.sum()).log()
    held = heldout_batch[key][heldout_batch[key] != -100]
    return float(-logp[held].mean())


@pytest.mark.slow
def test_tiny_training_lowers_heldout_loss_below_unigram(tokenizer, corpus):
    """100 steps of biLM training on real WikiText-2 sentences lower the held-out loss from ~ln V to
    below a context-free unigram model's cross-entropy, in both directions (so context is used)."""
    torch.manual_seed(0)
    model = build_model(FAMILY.model_config("tiny"), tokenizer)
    collate = make_collator(FAMILY.objective, tokenizer)
    encode = lambda texts: [tokenizer(t, add_special_tokens=False).input_ids for t in texts]  # noqa: E731
    train_ids = encode(corpus["train"])
    train = _SentenceCorpus(train_ids)
    heldout = collate(encode(corpus["heldout"][:32]))
    everything = collate(train_ids)
    unigram = {d: _unigram_cross_entropy(everything, heldout, f"{d}_labels", len(tokenizer)) for d in ("forward", "backward")}

    def heldout_loss():
        model.eval()
        with torch.no_grad():
            out = model(**heldout)
        model.train()
        return float(out.loss), {k: float(v) for k, v in out.loss_terms.items()}

    before, before_terms = heldout_loss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    step, epoch = 0, 0
    while step < 100:
        examples = sentence_examples(train, 40, np.random.default_rng(epoch))
        while step < 100 and (batch := [ex for _, ex in zip(range(32), examples)]):
            loss = model(**collate(batch, gen)).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
        epoch += 1
    after, after_terms = heldout_loss()
    print(f"held-out biLM loss {before:.3f} -> {after:.3f}; terms {before_terms} -> {after_terms}; unigram {unigram}")
    assert abs(before - np.log(len(tokenizer))) < 0.5
    for d in ("forward", "backward"):
        assert after_terms[d] < unigram[d] - 0.2, (d, after_terms[d], unigram[d])


def test_model_handle_loads_elmo_checkpoint(model, tokenizer, corpus, tmp_path):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    handle = ModelHandle.load(tmp_path)
    assert handle.family == "elmo" and handle.stacks == ("encoder",)
    assert handle.num_layers == {"encoder": 2} and handle.hidden_size == 64
    # words that are one token each, so word states can be checked against a direct forward pass
    single = lambda w: len(tokenizer(w, add_special_tokens=False).input_ids) == 1  # noqa: E731
    sentences = [[w for w in s.split() if single(w)] for s in corpus["heldout"][:3]]
    states = list(handle.word_states(sentences))
    assert len(states) == 3
    for words, arr in zip(sentences, states):
        assert arr.shape == (3, len(words), 64) and arr.dtype == np.float32
    ids, _ = _encode(tokenizer, [" ".join(sentences[0])])
    assert ids.shape[1] == len(sentences[0]) + 2  # <S> words </S>
    # the direct pass reads unknown words from their spelling too (they are in these sentences)
    assert tokenizer.unk_token_id in ids[0].tolist()
    direct = _oov_states(model, tokenizer, sentences[0]).numpy()
    np.testing.assert_allclose(states[0], direct, atol=1e-5)
    assert np.abs(states[0] - _states(model.elmo, ids)[:, 0, 1:-1].numpy()).max() > 1e-3  # not [UNK]'s characters
    # ELMo has no attention weights: asking for them is a clear error, not a silent None
    with pytest.raises(Exception, match="no attention"):
        handle.forward(sentences[:1], attentions=True)


def test_model_handle_reads_unknown_words_from_their_spelling(model, tokenizer, tmp_path):
    """Probing time: the handle gives each out-of-vocabulary word its own characters, whatever the
    batch or window it lands in; the empty string has the handle's defined no-subword behaviour."""
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    handle = ModelHandle.load(tmp_path)
    assert handle.reads_characters
    ctx = ["the", "{}", "was", "released", "in", "1990", "."]
    words = ["zyzzogeton", "quokkas", "Zürich", "東京", "x" * 60]
    sents = [[w.format(x) if w == "{}" else w for w in ctx] for x in words] + [ctx[:1] + ["quokkas"] + ctx[2:]]
    states = list(handle.word_states(sents, batch_size=2))
    for i, w in enumerate(words):
        np.testing.assert_allclose(states[i], _oov_states(model, tokenizer, sents[i]).numpy(), atol=1e-5, err_msg=w)
        for j in range(i):
            assert np.abs(states[i][:, 1] - states[j][:, 1]).max() > 1e-4, (w, words[j])
    np.testing.assert_array_equal(states[1], states[-1])  # same word, same context, other batch
    # the same unknown word in a sliding window (max_length 5: <S> + 3 words + </S>) is still spelled
    small = ModelHandle(model, tokenizer, max_length=5)
    (windowed,) = list(small.word_states([sents[1]]))
    assert small.stats["windowed_sentences"] == 1
    (direct,) = list(small.word_states([sents[1][:3]]))
    np.testing.assert_allclose(windowed[:, 1, :32], direct[:, 1, :32], atol=1e-5)  # forward half: same left context
    # tokenize_words / forward expose ids of the closed vocabulary ([UNK]), never internal ones
    out = handle.forward(sents[:2])
    assert int(out.batch.input_ids.max()) < len(tokenizer)
    assert (out.batch.input_ids == tokenizer.unk_token_id).sum() == 2
    # the empty string yields no token: it borrows the previous word's state and is counted
    before = handle.stats["no_subword_words"]
    (empty,) = list(handle.word_states([["the", "", "quokkas"]]))
    assert handle.stats["no_subword_words"] == before + 1
    np.testing.assert_array_equal(empty[:, 1], empty[:, 0])


def test_collator_and_corpus_cache_carry_unknown_spellings(model, tokenizer, tmp_path):
    """Training time: the tokenised corpus keeps the spelling behind each [UNK], sentence examples
    carry it and the collator turns it into char_ids, so the loss reads the word itself."""
    from types import SimpleNamespace

    from workbench.data_cache import TokenizedCorpus

    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    (corpus_dir / "manifest.json").write_text("{}")
    texts = ["the quokkas was released .\nZürich , 東京 and the game", "the game was released"]
    docs = [SimpleNamespace(doc_id=f"d{i}", text=t) for i, t in enumerate(texts)]
    corpus = SimpleNamespace(dir=corpus_dir, documents=lambda split: docs)
    tokenizer(["a", "the game was released"], padding=True)  # leaves padding on the backend: must not leak
    cached = TokenizedCorpus.build(tokenizer, corpus, "train", cache_dir=tmp_path / "cache", show_progress=False)
    assert cached.has_unknown_words
    assert cached.unknown_words(0) == [None, "quokkas", None, None, None]
    assert cached.unknown_words(1) == ["Zürich", None, "東京", None, None, None]
    assert cached.unknown_words(2) == [None] * 4
    reopened = TokenizedCorpus(cached.path)
    assert reopened.unknown_words(1) == cached.unknown_words(1)
    examples = sorted(sentence_examples(cached, 5, np.random.default_rng(0)), key=lambda e: e["input_ids"])
    assert {tuple(e["unknown"]) for e in examples} >= {("Zürich", None, "東京"), (None, "quokkas", None)}
    batch = make_collator({}, tokenizer)(examples)
    for b, ex in enumerate(examples):
        for t, w in enumerate(ex["unknown"]):
            row = fit_char_width(batch["char_ids"][b, t + 1], model.config.max_chars).tolist()
            assert row == (word_characters(w, model.config.max_chars) if w else [0] * model.config.max_chars)
    with torch.no_grad():
        spelled = model(**batch).loss
        closed = model(**{k: v for k, v in batch.items() if k != "char_ids"}).loss
    assert abs(float(spelled) - float(closed)) > 1e-6  # the unknown words' characters reach the loss
