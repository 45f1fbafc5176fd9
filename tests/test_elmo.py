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

from workbench.families.elmo import (
    FAMILY,
    ElmoConfig,
    ElmoForBiLM,
    ElmoModel,
    ScalarMix,
    build_model,
    char_table,
    make_collator,
    sentence_examples,
    word_characters,
)
from workbench.models import ModelHandle
from workbench.paths import data_path
from workbench.tokenization import build_tokenizer
from workbench.train import run_tiny_training


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
    import workbench.families  # noqa: F401 - registers ELMo with the Auto classes, as the handle does
    from transformers import AutoConfig, AutoModel, AutoModelForPreTraining

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


def test_character_table_and_oov_limitation(model, tokenizer):
    cfg = model.config
    table = model.elmo.token_encoder.char_ids
    assert table.shape == (len(tokenizer), cfg.max_chars)
    the = tokenizer.convert_tokens_to_ids("the")
    assert table[the].tolist() == word_characters("the", cfg.max_chars)
    assert word_characters("the", 8) == [257, ord("t") + 1, ord("h") + 1, ord("e") + 1, 258, 0, 0, 0]
    # long words are truncated to max_chars like ELMo's; special tokens get their own marker characters
    assert word_characters("x" * 100, 20)[-1] == 258 and len(word_characters("x" * 100, 20)) == 20
    special_rows = {tuple(table[tokenizer.convert_tokens_to_ids(t)].tolist()) for t in FAMILY.special_tokens}
    assert len(special_rows) == len(FAMILY.special_tokens)
    # a vocabulary word spelled like a special token ("unk" from WikiText's "<unk>") keeps its own characters
    unk_word = tokenizer.convert_tokens_to_ids("unk")
    assert unk_word != tokenizer.unk_token_id
    assert table[unk_word].tolist() == word_characters("unk", cfg.max_chars) != table[tokenizer.unk_token_id].tolist()
    # the documented simplification: an out-of-vocabulary word becomes [UNK] with [UNK]'s characters
    oov = tokenizer("zyzzogeton", add_special_tokens=False).input_ids
    assert oov == [tokenizer.unk_token_id]
    with pytest.raises(Exception, match="num_special_chars"):
        char_table({"a": 0, "[A]": 1, "[B]": 2}, ["[A]", "[B]"], 10, num_special_chars=1)


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
    direct = _states(model.elmo, ids)[:, 0, 1:-1].numpy()
    np.testing.assert_allclose(states[0], direct, atol=1e-5)
    # ELMo has no attention weights: asking for them is a clear error, not a silent None
    with pytest.raises(Exception, match="no attention"):
        handle.forward(sentences[:1], attentions=True)
