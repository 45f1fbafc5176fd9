"""Architectures the real models bring (issue 29 part 5), on tiny configs built here through
transformers' config classes (never the real weights): Llama (rotary positions, grouped-query
attention, RMSNorm, an instruct bos that is not the pretraining separator) and MPNet (relative
attention buckets). Each check is against a direct forward of the same model."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from workbench.running.lm_scores import LMScorer
from workbench.running.models import causal_start_id
from workbench.running.models import ModelHandle


@pytest.fixture(scope="module")
def llama(tokenizers):
    """A 2-layer Llama whose tokenizer declares ChatML's <|im_start|> as bos (as SmolLM2-Instruct's
    does) while <|endoftext|> is in the vocabulary (the pretraining document separator)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = copy.deepcopy(tokenizers["gpt"])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.bos_token = "<|im_start|>"
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg).eval()
    return model, tok


def test_causal_start_is_the_pretraining_separator_not_the_chat_bos(llama, tokenizers):
    model, tok = llama
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.bos_token_id != eot
    assert causal_start_id(tok) == eot
    assert causal_start_id(tokenizers["gpt"]) == tokenizers["gpt"].eos_token_id  # GPT-2 style: unchanged
    scorer = LMScorer(ModelHandle(model, tok))
    enc = tok("the cat sat", return_special_tokens_mask=True)
    row = scorer.causal_row(np.asarray(enc["input_ids"]), np.asarray(enc["special_tokens_mask"], bool), "t")
    assert row[0] == eot and row[1:].tolist() == enc["input_ids"]


def test_llama_logit_lens_last_layer_is_the_model_output(llama):
    """The lens at the last layer must equal the model's own scores (no double RMSNorm), and every
    layer's lens equals a hand computation: final norm (except on the last, already normed) + tied
    unembedding, log-softmax, summed over the filled sentence's tokens."""
    from workbench.running import logit_lens

    model, tok = llama
    scorer = LMScorer(ModelHandle(model, tok))
    contexts = ["the cat sat on the <blank> .", "a dog <blank> here ."]
    cands = [["mat", "dog"], ["runs", "sat"]]
    lens = logit_lens.candidate_scores(scorer, contexts, cands)
    assert lens.shape == (3, 2, 2)
    zero_shot = np.asarray(scorer.score_candidates(contexts, cands).scores, dtype=np.float64)
    assert np.allclose(lens[-1], zero_shot, atol=1e-4)
    # layer 1 by hand
    text = "the cat sat on the mat ."
    ids = [causal_start_id(tok)] + tok(text)["input_ids"]
    with torch.no_grad():
        hs = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        logits = model.lm_head(model.model.norm(hs[1]))
        lp = torch.log_softmax(logits[0, :-1].float(), -1).gather(-1, torch.tensor(ids[1:])[:, None]).sum()
    assert lens[1, 0, 0] == pytest.approx(float(lp), abs=1e-4)


def test_llama_word_states_match_a_direct_forward(llama):
    """Rotary positions: the handle's word vectors (last subword, padded batches) equal a plain
    forward of each sentence alone behind the causal start token (`<|endoftext|>`, not the chat bos)."""
    model, tok = llama
    handle = ModelHandle(model, tok)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    assert handle.causal_start == eot
    sents = [["the", "cat", "sat"], ["a", "much", "longer", "sentence", "with", "more", "words"]]
    states = list(handle.word_states(sents, pooling="last", batch_size=2))
    for words, got in zip(sents, states):
        enc = tok(" " + " ".join(words), return_offsets_mapping=True)
        with torch.no_grad():
            hs = model.model(input_ids=torch.tensor([[eot] + enc["input_ids"]]), output_hidden_states=True).hidden_states
        last = [1 + max(i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < end)
                for end in np.cumsum([len(w) + 1 for w in words])]
        want = torch.stack(hs)[:, 0, last].numpy()
        assert got.shape == want.shape
        assert np.allclose(got, want, atol=1e-4)


def test_mpnet_word_states_match_a_direct_forward(tokenizers):
    """MPNet's relative-position buckets and its RoBERTa-style padding-offset positions: the handle's
    word vectors (first subword) equal a forward of the sentence alone through the same model."""
    from transformers import MPNetConfig, MPNetModel

    tok = tokenizers["bert"]
    torch.manual_seed(0)
    cfg = MPNetConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=130, pad_token_id=tok.pad_token_id)
    model = MPNetModel(cfg).eval()
    handle = ModelHandle(model, tok)
    sents = [["the", "cat", "sat"], ["a", "much", "longer", "sentence", "with", "more", "words", "in", "it"]]
    states = list(handle.word_states(sents, pooling="first", batch_size=2))
    for words, got in zip(sents, states):
        enc = tok(" ".join(words), return_offsets_mapping=True)
        with torch.no_grad():
            hs = model(input_ids=torch.tensor([enc["input_ids"]]), output_hidden_states=True).hidden_states
        starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
        first = [next(i for i, (a, b) in enumerate(enc["offset_mapping"]) if a == s and b > a) for s in starts]
        want = torch.stack(hs)[:, 0, first].numpy()
        assert got.shape == want.shape
        assert np.allclose(got, want, atol=1e-4)


def test_standardised_structural_probe_ignores_per_dimension_scale():
    """Massive activations (a few dimensions thousands of times larger, Sun et al. 2024): with
    `standardize`, the structural probe fitted on features rescaled per dimension (and shifted) gives
    the same predictions as on the original features; on raw features it does not."""
    from probes.syntax import structural as st

    rng = np.random.default_rng(0)
    lengths = rng.integers(4, 9, 24)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    heads = [np.arange(n) for n in lengths]  # chains: word i's head is word i - 1 (the first is the root)
    pos = np.concatenate([np.arange(n) for n in lengths]).astype(np.float32)
    X = rng.standard_normal((2, offsets[-1], 6)).astype(np.float32)
    X[:, :, 0] += pos  # a planted position signal, so the distances are learnable
    scale = np.array([1e-2, 1.0, 3e3, 0.5, 1e2, 1.0], dtype=np.float32)
    X_big = X * scale + np.float32(50.0)
    upos = [["NOUN"] * n for n in lengths]

    def fit(features, standardize):
        data = st.TreeSet(features, offsets, heads, upos)
        f = st.fit_structural_probe(data, data, rank=4, epochs=4, batch_size=8, seed=0, progress=False,
                                    standardize=standardize)
        return np.concatenate([p.ravel() for p in st.predict(f, data)[1]])

    a, b = fit(X, True), fit(X_big, True)
    assert np.allclose(a, b, rtol=1e-3, atol=1e-3)
    raw_a, raw_b = fit(X, False), fit(X_big, False)
    assert not np.allclose(raw_a, raw_b, rtol=1e-2, atol=1e-2)


def test_causal_start_token_is_read_by_every_causal_path_and_keys_the_cache(llama, tokenizers):
    """The start token goes in front of a decoder-only model's text in `forward` (no word owns it)
    as in `word_states`, not in `tokenize_words` (fine-tuning's encoding, unchanged), changes the first word's vector (the reason it is there: without it the first
    word is the attention sink), and is part of the activation-cache fingerprint; encoders keep their
    own template ([CLS] ... [SEP]) and no start token."""
    from transformers import BertConfig, BertModel

    from workbench.activations import model_fingerprint

    model, tok = llama
    handle = ModelHandle(model, tok)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    out = handle.forward([["the", "cat", "sat"]])
    plain = tok(" the cat sat")["input_ids"]
    assert out.batch.input_ids[0].tolist() == [eot] + plain and int(out.batch.word_ids[0, 0]) == -1
    assert handle.tokenize_words([["the", "cat", "sat"]]).input_ids[0].tolist() == plain  # fine-tuning's encoding
    with_start = next(handle.word_states([["the", "cat", "sat"]], pooling="first"))
    bare = ModelHandle(model, tok)
    bare.causal_start = None  # the older reading, for comparison only
    without = next(bare.word_states([["the", "cat", "sat"]], pooling="first"))
    assert not np.allclose(with_start[1:, 0], without[1:, 0], atol=1e-3)  # the first word changes...
    assert np.allclose(with_start[0], without[0])  # ...but not its input embedding
    assert model_fingerprint(handle).endswith(f"+start{eot}") and "+start" not in model_fingerprint(bare)
    assert ModelHandle(model, tok, manifest={"kind": "finetune"}).causal_start is None  # read as it was tuned

    bert_tok = tokenizers["bert"]
    bert = BertModel(BertConfig(vocab_size=bert_tok.vocab_size, hidden_size=32, num_hidden_layers=1,
                                num_attention_heads=4, intermediate_size=64)).eval()
    enc_handle = ModelHandle(bert, bert_tok)
    assert enc_handle.causal_start is None and enc_handle._prefix == [bert_tok.cls_token_id]
