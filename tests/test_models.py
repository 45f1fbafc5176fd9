"""The model handle on tiny random BERT, GPT-2, T5 and BART with tokenizers trained on EWT."""

from __future__ import annotations

import json
import re
import shutil
import unicodedata

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tests.conftest import tiny_bert, tiny_gpt2
from workbench.errors import CheckpointError
from workbench.io import sha256_files
from workbench.running.models import ModelHandle
from workbench.running.word_alignment import plan_windows

FAMILIES = ["bert", "gpt", "t5", "bart"]
EXPECTED_STACKS = {"bert": ("encoder",), "gpt": ("decoder",), "t5": ("encoder", "decoder"),
                   "bart": ("encoder", "decoder")}


@pytest.fixture(scope="module")
def handles(tiny_models):
    return {name: ModelHandle(m, tok) for name, (m, tok) in tiny_models.items()}


@pytest.fixture(scope="module")
def tricky(ewt_train):
    """EWT train sentences with contractions, curly quotes, dashes, ellipses, accents, £ and the
    soft hyphen in "basic\\xadally", all short enough for the tiny models."""
    picked = [s for s in ewt_train if "n't" in s.words][:5]
    picked += [s for s in ewt_train if any(ord(c) > 127 for w in s.words for c in w) and len(s.words) <= 40][:40]
    soft = [s for s in ewt_train if "basic\u00adally" in s.words]
    assert len(soft) == 1
    return [s.words for s in picked + soft]


# ---------------------------------------------------------------------- shapes


@pytest.mark.parametrize("name", FAMILIES)
def test_hidden_states_every_layer_per_stack(handles, ewt_train, name):
    h = handles[name]
    assert h.stacks == EXPECTED_STACKS[name]
    assert h.num_layers == {s: 2 for s in h.stacks} and h.hidden_size == 32
    sents = [s.words for s in ewt_train[:3]]
    out = h.forward(sents, attentions=True)
    n_tok = out.batch.attention_mask.sum(1)
    T = out.batch.input_ids.shape[1]
    for stack in h.stacks:
        hs = out.hidden_states[stack]
        assert len(hs) == 3  # embeddings + 2 blocks
        assert all(t.shape == (3, T, 32) for t in hs)
        att = out.attentions[stack]
        assert len(att) == 2 and all(a.shape == (3, 2, T, T) for a in att)
        # every real query's attention is a distribution over the real keys only
        for b in range(3):
            n = int(n_tok[b])
            a = att[0][b, :, :n]
            torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)), atol=1e-5, rtol=0)
            assert float(att[0][b, :, :n, n:].abs().sum()) < 1e-6
        # each word owns at least one position
        for b, words in enumerate(sents):
            ids = set(out.word_ids[stack][b].tolist()) - {-1}
            assert ids == set(range(len(words)))
    if "decoder" in h.stacks and "encoder" in h.stacks:
        # documented decoder input: decoder_start + the encoder input shifted right
        start = h.model.config.decoder_start_token_id
        for b in range(3):
            n = int(n_tok[b])
            dec = out.decoder_input_ids[b, :n].tolist()
            assert dec == [start] + out.batch.input_ids[b, : n - 1].tolist()
        assert out.cross_attentions is not None and len(out.cross_attentions) == 2
    for stack in h.stacks:
        states = list(h.word_states(sents, stack=stack))
        assert [s.shape for s in states] == [(3, len(w), 32) for w in sents]
        assert all(s.dtype == np.float32 and np.isfinite(s).all() for s in states)
        # "first" pooling reads exactly the hidden state at the word's first position
        b = 1
        pos = [int((out.word_ids[stack][b] == w).nonzero()[0]) for w in range(len(sents[b]))]
        expected = torch.stack([hs_l[b, pos] for hs_l in out.hidden_states[stack]]).numpy()
        np.testing.assert_allclose(states[b], expected, atol=1e-5)


def test_causal_states_do_not_see_the_future(handles, ewt_train):
    h = handles["gpt"]
    words = ewt_train[1].words
    changed = words[:-1] + ["banana"]
    a, b = h.word_states([words, changed], pooling="mean")
    np.testing.assert_allclose(a[:, :-1], b[:, :-1], atol=1e-5)
    assert np.abs(a[1:, -1] - b[1:, -1]).max() > 1e-3


# ---------------------------------------------------------------------- alignment


def _pieces(h: ModelHandle, words):
    batch = h.tokenize_words([words])
    ids, wid = batch.input_ids[0].tolist(), batch.word_ids[0].tolist()
    return [[i for i, w in zip(ids, wid) if w == k] for k in range(len(words))], batch


@pytest.mark.parametrize("name", FAMILIES)
def test_alignment_matches_hf_word_ids(handles, tricky, name):
    """Same ids and word alignment as the tokenizer's own is_split_into_words + word_ids() (these
    tokenizers prefix every word, so both conventions agree), special tokens included."""
    h = handles[name]
    tok = h.tokenizer
    for words in tricky:
        batch = h.tokenize_words([words])
        ref = tok(words, is_split_into_words=True)
        assert batch.input_ids[0].tolist() == ref["input_ids"]
        assert batch.word_ids[0].tolist() == [-1 if w is None else w for w in ref.word_ids()]


@pytest.mark.parametrize("name", ["gpt", "bart"])
def test_bytelevel_words_decode_exactly_with_prefix_space(handles, tricky, name):
    """Byte-level BPE is lossless: a word's pieces decode to a space + the word, byte for byte
    (multi-byte characters such as ’ or é split over several pieces come back whole), and are
    the pieces the word has in running text (" word" on its own)."""
    h = handles[name]
    tok = h.tokenizer
    for words in tricky:
        pieces, _ = _pieces(h, words)
        for word, p in zip(words, pieces):
            assert tok.decode(p) == " " + word
            assert p == tok.backend_tokenizer.encode(" " + word, add_special_tokens=False).ids


def test_bytelevel_without_prefix_space_gets_running_text_pieces(handles, tricky):
    """A GPT-2-style tokenizer saved with add_prefix_space=False: is_split_into_words would give
    each word its sentence-initial pieces ("do" instead of "Ġdo"); the handle still gives the
    running-text pieces, identical to the prefix-space tokenizer's."""
    h = handles["gpt"]
    backend = Tokenizer.from_str(h.tokenizer.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    plain = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    h2 = ModelHandle(h.model, plain)
    words = tricky[0]
    assert h2.tokenize_words([words]).input_ids.tolist() == h.tokenize_words([words]).input_ids.tolist()
    naive = plain(words, is_split_into_words=True)["input_ids"]
    assert naive != h.tokenize_words([words]).input_ids[0].tolist()


def _bert_clean(word: str) -> str:
    """BertNormalizer(clean_text=True, lowercase=False, strip_accents=False): drop control and
    format characters (Unicode C*: the soft hyphen, zero-width space), whitespace -> space."""
    out = []
    for ch in word:
        if ch in "\t\n\r" or unicodedata.category(ch) == "Zs":
            out.append(" ")
        elif ch == "\0" or ch == "\ufffd" or unicodedata.category(ch).startswith("C"):
            continue
        else:
            out.append(ch)
    return "".join(out)


def _is_punct(ch: str) -> bool:
    o = ord(ch)
    return (33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126
            or unicodedata.category(ch).startswith("P"))


def _wordpiece(word: str, vocab: dict, unk="[UNK]", max_chars=100) -> list[str]:
    """Reference: BERT pre-tokenisation (whitespace, then each punctuation mark alone) and greedy
    longest-match-first WordPiece (Wu et al. 2016) with ## continuations."""
    pre, cur = [], ""
    for ch in _bert_clean(word):
        if ch == " " or _is_punct(ch):
            if cur:
                pre.append(cur)
            cur = ""
            if ch != " ":
                pre.append(ch)
        else:
            cur += ch
    if cur:
        pre.append(cur)
    pieces = []
    for w in pre:
        out, start = [], 0
        while start < len(w):
            end = len(w)
            while end > start:
                sub = ("##" if start else "") + w[start:end]
                if sub in vocab:
                    out.append(sub)
                    break
                end -= 1
            if end == start:
                out = [unk]
                break
            start = end
        pieces.extend(out if len(w) <= max_chars else [unk])
    return pieces


def test_wordpiece_alignment_against_reference(handles, tricky):
    h = handles["bert"]
    tok = h.tokenizer
    vocab = tok.get_vocab()
    n_words = n_unk = 0
    for words in tricky:
        pieces, _ = _pieces(h, words)
        for word, p in zip(words, pieces):
            toks = tok.convert_ids_to_tokens(p)
            assert toks == _wordpiece(word, vocab), word
            n_words += 1
            if "[UNK]" not in toks:  # decoding gives the cleaned word back, spaces removed
                assert "".join(t[2:] if t.startswith("##") else t for t in toks) == _bert_clean(word).replace(" ", "")
            else:
                n_unk += 1
    assert n_words > 500 and n_unk < 0.1 * n_words
    # the worked examples: a contraction and the soft hyphen the normaliser deletes
    pieces, _ = _pieces(h, ["you", "ca", "n't", "say", "basic\u00adally"])
    assert tok.convert_ids_to_tokens(pieces[2]) == ["n", "'", "t"]
    assert "".join(t.lstrip("#") for t in tok.convert_ids_to_tokens(pieces[4])) == "basically"


def test_unigram_alignment_round_trip(handles, tricky):
    """Unigram + NFKC + Metaspace("always"): a word's pieces read back as "▁" + NFKC(word)
    ("…" -> "...", the soft hyphen kept); an <unk> piece stands for characters the vocabulary
    lacks (one <unk> per run of them)."""
    h = handles["t5"]
    tok = h.tokenizer
    vocab = tok.get_vocab()
    unk = tok.unk_token_id
    checked = 0
    for words in tricky:
        pieces, _ = _pieces(h, words)
        for word, p in zip(words, pieces):
            target = "▁" + unicodedata.normalize("NFKC", word)
            pattern = "".join("(.+?)" if i == unk else re.escape(tok.convert_ids_to_tokens(i)) for i in p)
            m = re.fullmatch(pattern, target)
            assert m, (word, tok.convert_ids_to_tokens(p))
            for g in m.groups():
                assert all(c not in vocab and "▁" + c not in vocab for c in g)
            checked += 1
    assert checked > 500
    pieces, _ = _pieces(h, ["Wait", "…"])
    assert "".join(tok.convert_ids_to_tokens(pieces[1])) == "▁..."


def test_word_without_subword_takes_nearest_preceding_piece(handles):
    h = handles["bert"]
    h.stats.clear()
    s1 = ["Hello", "\u200b", "world", "!"]  # zero-width space: deleted by BertNormalizer
    s2 = ["\u00ad", "world", "!"]  # soft hyphen opening the sentence
    pieces, batch = _pieces(h, s1)
    assert pieces[1] == [] and pieces[0] and pieces[2]
    first = list(h.word_states([s1, s2], pooling="first"))
    last = list(h.word_states([s1, s2], pooling="last"))
    assert h.stats["no_subword_words"] == 4  # two per call
    np.testing.assert_array_equal(first[0][:, 1], last[0][:, 0])  # last piece of "Hello"
    np.testing.assert_array_equal(first[1][:, 0], first[1][:, 1])  # first piece of "world"
    assert first[0].shape == (3, 4, 32)


# ---------------------------------------------------------------------- batching


@pytest.mark.parametrize("name", FAMILIES)
def test_batched_equals_one_at_a_time_and_order_free(handles, ewt_train, name):
    h = handles[name]
    sents = [s.words for s in ewt_train[10:24] if len(s.words) <= 30] + [[]]
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(sents))
    for stack in h.stacks:
        for pooling in ("first", "mean", "last"):
            batched = list(h.word_states(sents, pooling=pooling, stack=stack, batch_size=4, chunk_size=8))
            single = [next(h.word_states([s], pooling=pooling, stack=stack, batch_size=1)) for s in sents]
            shuffled = list(h.word_states([sents[i] for i in perm], pooling=pooling, stack=stack, batch_size=5))
            assert len(batched) == len(sents)
            for i, (a, b) in enumerate(zip(batched, single)):
                assert a.shape == (3, len(sents[i]), 32)
                np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
            for j, i in enumerate(perm):
                np.testing.assert_allclose(shuffled[j], batched[i], atol=2e-5, rtol=1e-4)
    assert batched[-1].shape == (3, 0, 32)


def test_mean_pooling_is_the_mean_of_the_pieces(handles, tricky):
    h = handles["bart"]
    words = tricky[1]
    out = h.forward([words], stack="encoder")
    mean = next(h.word_states([words], pooling="mean", stack="encoder"))
    wid = out.word_ids["encoder"][0]
    for k in range(len(words)):
        expected = torch.stack([hs[0, wid == k].mean(0) for hs in out.hidden_states["encoder"]])
        np.testing.assert_allclose(mean[:, k], expected.numpy(), atol=1e-5)


# ---------------------------------------------------------------------- windows


def _long_sentence(ewt_train, n_words=70):
    words = []
    for s in ewt_train[:40]:
        words += s.words
        if len(words) >= n_words:
            return words


@pytest.mark.parametrize("name,builder", [("bert", tiny_bert), ("gpt", tiny_gpt2)])
def test_overlong_sentence_is_windowed(tokenizers, ewt_train, name, builder):
    tok = tokenizers[name]
    model = builder(tok, max_positions=32)
    h = ModelHandle(model, tok)
    assert h.max_length == 32
    C = h.capacity
    words = _long_sentence(ewt_train)
    batch = h.tokenize_words([words])
    ids, wid = batch.input_ids[0], batch.word_ids[0]
    P = len(h._prefix)
    content = ids[wid >= 0] if name == "gpt" else ids[P: int(batch.attention_mask[0].sum()) - len(h._suffix)]
    n = len(content)
    assert n > 2 * C
    with pytest.raises(ValueError, match="max_length"):
        h.forward([words])

    h.stats.clear()
    states = list(h.word_states([words, [], ["A", "short", "one", "."]], pooling="first"))
    st = states[0]
    assert st.shape == (3, len(words), 32) and np.isfinite(st).all()
    starts = plan_windows(n, C, C // 2)
    assert len(starts) >= 3 and starts[-1] + C == n
    assert h.stats["windowed_sentences"] == 1 and h.stats["windows"] == len(starts)
    assert h.stats["empty_sentences"] == 1 and states[1].shape == (3, 0, 32)

    # reference: a bare forward of each window (with the tokenizer's special tokens; a causal LM
    # behind its start token, `ModelHandle.causal_start`)
    spans = [((wid == k).nonzero().flatten() - P).tolist() for k in range(len(words))]
    windows = []
    with torch.no_grad():
        for s in starts:
            win = torch.tensor([h._read_prefix + content[s: s + C].tolist() + h._suffix])
            windows.append(torch.stack(model.base_model(input_ids=win, output_hidden_states=True).hidden_states)[:, 0])
    checked = 0
    for k, span in enumerate(spans):
        t, u = span[0], span[-1]
        inside = [j for j, s in enumerate(starts) if s <= t and u < s + C]
        if name == "bert":  # a word far (>= C/4) from the edges of exactly one window comes from it
            central = [j for j in inside if min(t - starts[j], starts[j] + C - 1 - u) >= C // 4]
            if len(central) != 1:
                continue
            j = central[0]
        else:  # causal: the window with most left context
            j = max(inside, key=lambda j: t - starts[j])
        np.testing.assert_allclose(st[:, k], windows[j][:, len(h._read_prefix) + t - starts[j]].numpy(), atol=1e-5)
        checked += 1
    assert checked >= len(words) // 2

    h.stats.clear()
    out = h.forward([words], truncate=True)
    assert out.hidden_states[h.stacks[0]][0].shape[1] == 32
    assert h.stats["truncated_tokens"] == n + len(h._read_prefix) + len(h._suffix) - 32


# ---------------------------------------------------------------------- loading


def _save(tmp_path, model, tok, name="ckpt"):
    folder = tmp_path / name
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("name", FAMILIES)
def test_save_load_round_trip(tmp_path, tiny_models, handles, ewt_train, name):
    model, tok = tiny_models[name]
    folder = _save(tmp_path, model, tok)
    h = ModelHandle.load(folder)
    assert h.family == name and h.stacks == EXPECTED_STACKS[name] and h.num_layers == handles[name].num_layers
    sents = [s.words for s in ewt_train[:6]]
    for stack in h.stacks:
        for a, b in zip(h.word_states(sents, stack=stack, pooling="mean"),
                        handles[name].word_states(sents, stack=stack, pooling="mean")):
            np.testing.assert_allclose(a, b, atol=1e-5)
    assert h.checkpoint_hash == sha256_files([folder / "model.safetensors"], root=folder)
    # eager attentions on request
    ha = ModelHandle.load(folder, attentions=True)
    assert ha.forward(sents[:2], attentions=True).attentions[ha.stacks[0]][0].shape[0] == 2



def test_pretraining_heads_load_quietly(tmp_path, tokenizers):
    """A BertForPreTraining checkpoint (NSP head, pooler) opens as a masked LM without transformers'
    per-load report (the handle checks the loading info itself) and leaves its logging as it was."""
    import logging

    from transformers import BertConfig, BertForPreTraining
    from transformers.utils import logging as hf_logging

    tok = tokenizers["bert"]
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, pad_token_id=tok.pad_token_id)
    folder = _save(tmp_path, BertForPreTraining(cfg), tok)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    root = logging.getLogger("transformers")
    root.addHandler(handler)
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()  # the level the report is logged at (other tests may lower it)
    try:
        verbosity = hf_logging.get_verbosity()
        h = ModelHandle.load(folder)
        assert not any("LOAD REPORT" in m for m in seen)
        assert h.head_trained and hf_logging.get_verbosity() == verbosity
        from transformers import AutoModelForMaskedLM  # the same load straight through transformers reports

        AutoModelForMaskedLM.from_pretrained(folder)
        assert any("LOAD REPORT" in m for m in seen)
    finally:
        root.removeHandler(handler)
        hf_logging.set_verbosity(before)

def test_manifest_family_and_hashes(tmp_path, tiny_models, tokenizers):
    model, tok = tiny_models["bert"]
    folder = _save(tmp_path, model, tok)
    (folder / "manifest.json").write_text(json.dumps({"family": "spanbert", "step": 10}))
    assert ModelHandle.load(folder).family == "spanbert"
    other = _save(tmp_path, tiny_bert(tok, seed=1), tok, "other")
    assert ModelHandle.load(other).checkpoint_hash != ModelHandle.load(folder).checkpoint_hash
    # in-memory hash: stable, and it sees a changed weight
    h1 = ModelHandle(model, tok).checkpoint_hash
    assert ModelHandle(model, tok).checkpoint_hash == h1
    m2 = tiny_bert(tok)
    with torch.no_grad():
        m2.bert.encoder.layer[0].output.dense.bias[0] += 1
    assert ModelHandle(m2, tok).checkpoint_hash != h1


def test_checkpoint_errors_name_the_path(tmp_path, tiny_models, tokenizers):
    model, tok = tiny_models["bert"]

    def expect(folder, what):
        with pytest.raises(CheckpointError, match=re.escape(str(folder))) as e:
            ModelHandle.load(folder)
        assert re.search(what, str(e.value)), str(e.value)

    expect(tmp_path / "nowhere", "does not exist")
    good = _save(tmp_path, model, tok, "good")

    no_weights = tmp_path / "no_weights"
    shutil.copytree(good, no_weights)
    (no_weights / "model.safetensors").unlink()
    expect(no_weights, "no weight files")

    garbage = tmp_path / "garbage"
    shutil.copytree(good, garbage)
    (garbage / "model.safetensors").write_bytes(b"\x00not a safetensors file" * 10)
    expect(garbage, "cannot load weights")

    truncated = tmp_path / "truncated"
    shutil.copytree(good, truncated)
    data = (good / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    expect(truncated, "cannot load weights")

    no_tok = tmp_path / "no_tok"
    shutil.copytree(good, no_tok)
    for f in no_tok.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            f.unlink()
    expect(no_tok, "no tokenizer")

    small = tiny_bert(tok)
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(**{**small.config.to_dict(), "vocab_size": 500})
    too_big = _save(tmp_path, BertForMaskedLM(cfg), tok, "vocab_mismatch")
    expect(too_big, "1000 tokens but the model's embedding matrix only 500")
