"""Generation (`workbench.running.generate`): the decoding loop against a cache-free hand loop per family,
seeded reproducibility, batching, and the allowed sets of top-k and nucleus sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.errors import ConfigError
from workbench.running.generate import Sampling, allowed_logits, generate, pick
from workbench.running.models import ModelHandle

PROMPTS = ["The city is", "We went to the", "I like"]


@pytest.fixture(scope="module")
def handles(tiny_models):
    return {name: ModelHandle(m, tok) for name, (m, tok) in tiny_models.items()}


def _greedy_causal_by_hand(model, ids, n):
    ids = torch.tensor([list(ids)])
    with torch.no_grad():
        for _ in range(n):  # no cache: the whole sequence every step
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[0, -n:].numpy()


def _greedy_seq2seq_by_hand(model, src, start, n):
    src = torch.tensor([list(src)])
    dec = torch.tensor([[start]])
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=src, decoder_input_ids=dec).logits
            dec = torch.cat([dec, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return dec[0, 1:].numpy()


def test_greedy_causal_matches_a_loop_without_cache(handles):
    h = handles["gpt"]
    g = generate(h, PROMPTS, Sampling(max_new_tokens=12))
    assert g.kind == "causal"
    for p, new in zip(g.prompt_ids, g.new_ids):
        assert p[0] == h.tokenizer.eos_token_id  # the document separator the model trained behind
        np.testing.assert_array_equal(new, _greedy_causal_by_hand(h.model, p, 12))


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_greedy_seq2seq_matches_a_loop_without_cache(handles, family):
    h = handles[family]
    g = generate(h, PROMPTS, Sampling(max_new_tokens=8))
    assert g.kind == "seq2seq"
    start = h.model.config.decoder_start_token_id
    for p, new in zip(g.prompt_ids, g.new_ids):
        np.testing.assert_array_equal(new, _greedy_seq2seq_by_hand(h.model, p, start, 8))


def test_elmo_generates_with_its_forward_lm(ewt_train):
    from workbench.families.elmo import FAMILY, build_model
    from workbench.tokenization import build_tokenizer

    tok = build_tokenizer("word", FAMILY.special_tokens, [s.text for s in ewt_train[:2000]], 500,
                          special_roles=FAMILY.special_roles, template=FAMILY.template)
    torch.manual_seed(0)
    model = build_model(FAMILY.model_config("tiny"), tok).eval()
    h = ModelHandle(model, tok)
    g = generate(h, ["the city is"], Sampling(max_new_tokens=5))
    assert g.kind == "bilm"
    ids = torch.tensor([list(g.prompt_ids[0])])
    assert ids[0, 0] == tok.convert_tokens_to_ids("<S>") and ids[0, -1] != tok.convert_tokens_to_ids("</S>")
    with torch.no_grad():
        for _ in range(5):
            f = model(input_ids=ids, return_logits=True).forward_logits
            ids = torch.cat([ids, f[:, -1].argmax(-1, keepdim=True)], 1)
    np.testing.assert_array_equal(g.new_ids[0], ids[0, -5:].numpy())


def test_same_seed_same_text_other_seed_other_text(handles):
    h = handles["gpt"]
    s = Sampling(strategy="sample", temperature=1.5, max_new_tokens=20, seed=3)
    a, b = generate(h, PROMPTS * 2, s), generate(h, PROMPTS * 2, s)
    c = generate(h, PROMPTS * 2, Sampling(strategy="sample", temperature=1.5, max_new_tokens=20, seed=4))
    assert a.texts == b.texts
    assert all(np.array_equal(x, y) for x, y in zip(a.new_ids, b.new_ids))
    assert not all(np.array_equal(x, y) for x, y in zip(a.new_ids, c.new_ids))


def test_batched_greedy_equals_one_prompt_at_a_time(handles):
    h = handles["gpt"]
    prompts = ["one two three", "four five six", "seven eight nine", "The city is"]
    together = generate(h, prompts, Sampling(max_new_tokens=10, batch_size=8))
    for p, new in zip(prompts, together.new_ids):
        np.testing.assert_array_equal(generate(h, [p], Sampling(max_new_tokens=10)).new_ids[0], new)


def test_top_k_and_top_p_never_leave_their_allowed_sets():
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 2
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(logits, -1).numpy()
    for top_k, top_p in ((5, None), (None, 0.6), (8, 0.5)):
        allowed = []
        for row in probs:  # by hand: k most likely, then the smallest prefix of the sorted probs reaching p
            order = np.argsort(-row)
            keep = order[:top_k] if top_k else order
            if top_p is not None:
                q = row[keep] / row[keep].sum()
                n = int(np.searchsorted(np.cumsum(q), top_p) + 1)
                keep = keep[:n]
            allowed.append(set(keep.tolist()))
        z = allowed_logits(logits, 1.0, top_k, top_p)
        assert [set(torch.nonzero(torch.isfinite(r)).flatten().tolist()) for r in z] == allowed
        s = Sampling(strategy="sample", top_k=top_k, top_p=top_p)
        drawn = torch.stack([pick(logits, s, gen) for _ in range(400)], 1).numpy()
        for row, ok in zip(drawn, allowed):
            assert set(row.tolist()) <= ok
            assert len(set(row.tolist())) > 1 or len(ok) == 1  # it does sample, not argmax


def test_temperature_sampling_follows_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    gen = torch.Generator().manual_seed(1)
    s = Sampling(strategy="sample", temperature=2.0)
    drawn = torch.cat([pick(logits.expand(1000, -1), s, gen) for _ in range(20)]).numpy()
    freq = np.bincount(drawn, minlength=4) / len(drawn)
    np.testing.assert_allclose(freq, torch.softmax(logits[0] / 2.0, -1).numpy(), atol=0.015)


def test_an_encoder_cannot_generate(handles):
    with pytest.raises(ConfigError, match="cannot generate: its LM head is 'mlm'"):
        generate(handles["bert"], PROMPTS)


def test_bad_sampling_and_too_long_requests_are_refused(handles):
    with pytest.raises(ConfigError, match="top_p"):
        generate(handles["gpt"], PROMPTS, Sampling(strategy="sample", top_p=1.5))
    with pytest.raises(ConfigError, match="strategy"):
        generate(handles["gpt"], PROMPTS, Sampling(strategy="beam"))
    with pytest.raises(ConfigError, match="max_length"):
        generate(handles["gpt"], PROMPTS, Sampling(max_new_tokens=500))
