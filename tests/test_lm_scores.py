"""LM scores with a model's own head (workbench.running.lm_scores) on tiny models, real EWT text.

Every score is checked against a hand computation straight on the model: one masked forward per
position for PLL, log-softmax at the right positions for causal, seq2seq and ELMo; planted
sentences for candidate scoring; ELMo and ELECTRA through checkpoints saved and loaded.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tests.conftest import tiny_bart, tiny_bert, tiny_gpt2, tiny_t5
from workbench.errors import CheckpointError, ConfigError
from workbench.running.lm_scores import LMScorer, lm_kind, lm_scorer
from workbench.running.models import ModelHandle

FAMILIES = ["bert", "gpt", "t5", "bart"]


@pytest.fixture(scope="module")
def handles(tiny_models):
    return {name: ModelHandle(m, tok) for name, (m, tok) in tiny_models.items()}


@pytest.fixture(scope="module")
def texts(ewt_train):
    """Eight real EWT sentences of 5-25 words, two of them with non-ASCII characters."""
    short = [s.text for s in ewt_train if 5 <= len(s.words) <= 25]
    odd = [t for t in short if any(ord(c) > 127 for c in t)][:2]
    return short[:6] + odd


def _save(tmp_path, model, tok, name="ckpt"):
    folder = tmp_path / name
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _logp(logits):
    return torch.log_softmax(logits.float(), -1)


# ---------------------------------------------------------------------- text log-probabilities


def test_pll_equals_one_masked_forward_per_token(handles, texts):
    """PLL (Salazar et al. 2020) against the direct computation: for every content token, one
    forward with that token masked, the log-softmax of the full logits at its position."""
    h = handles["bert"]
    tok, model = h.tokenizer, h.model
    scores = LMScorer(h).pseudo_log_likelihood(texts, moments=True)
    for text, sc in zip(texts, scores):
        enc = tok(text, return_special_tokens_mask=True)  # [CLS]/[SEP] only: [UNK] is content, scored
        ids = torch.tensor(enc["input_ids"])
        content = [t for t, m in enumerate(enc["special_tokens_mask"]) if not m]
        hand, mu = [], []
        for p in content:
            x = ids.clone()
            x[p] = tok.mask_token_id
            with torch.no_grad():
                lp = _logp(model(input_ids=x[None]).logits[0, p])
            hand.append(float(lp[ids[p]]))
            mu.append(float((lp.exp() * lp).sum()))
        assert sc.ids.tolist() == ids[content].tolist()
        np.testing.assert_allclose(sc.logprobs, hand, atol=1e-5, rtol=0)
        np.testing.assert_allclose(sc.mu, mu, atol=1e-5, rtol=0)
        assert sc.total == pytest.approx(sum(hand), abs=1e-4) and sc.method == "pll"
    assert h.stats["mlm_forward_rows"] >= sum(len(s.ids) for s in scores)


def test_pll_batched_equals_unbatched(handles, texts):
    """All sentences' masked copies packed into shared batches (padding, several sentences per
    forward) give the same PLL as each sentence alone."""
    scorer = LMScorer(handles["bert"])
    together = scorer.pseudo_log_likelihood(texts, batch_size=512)
    small = scorer.pseudo_log_likelihood(texts, batch_size=1)  # one sentence per batch
    for a, b, text in zip(together, small, texts):
        (alone,) = scorer.pseudo_log_likelihood([text])
        np.testing.assert_allclose(a.logprobs, alone.logprobs, atol=1e-5, rtol=0)
        np.testing.assert_allclose(b.logprobs, alone.logprobs, atol=1e-5, rtol=0)


def test_pll_head_at_masked_positions_equals_full_logits(handles, texts, monkeypatch):
    """The shortcut (MLM head on the masked positions only) gives what the full logits give."""
    import workbench.running.lm_scores as lm

    fast = LMScorer(handles["bert"]).pseudo_log_likelihood(texts[:3])
    monkeypatch.setattr(lm, "MLM_HEADS", {})
    slow = LMScorer(handles["bert"]).pseudo_log_likelihood(texts[:3])
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "roberta", "spanbert", "albert"])
def test_every_masked_lm_family_checkpoint_gives_pll(name, tokenizers, ewt_train, texts, tmp_path):
    """Each family's tiny model, saved as its training loop saves it and opened by the handle:
    the PLL equals one masked forward per token of the same folder opened by AutoModelForMaskedLM."""
    from transformers import AutoModelForMaskedLM

    from workbench.families import get_family
    from workbench.tokenization import build_tokenizer

    family = get_family(name)
    if name == "albert":
        tok = build_tokenizer("unigram", family.special_tokens, [s.text for s in ewt_train[:2000]], vocab_size=1000)
    else:
        tok = tokenizers["bart" if name == "roberta" else "bert"]
    torch.manual_seed(0)
    folder = _save(tmp_path, family.build_model(family.model_config("tiny"), tok), tok)
    h = ModelHandle.load(folder)
    scorer = LMScorer(h)
    assert scorer.kind == "mlm"
    ref = AutoModelForMaskedLM.from_pretrained(folder).eval()
    for text, sc in zip(texts[:2], scorer.pseudo_log_likelihood(texts[:2])):
        ids = torch.tensor(tok(text)["input_ids"])
        hand = []
        for p in range(1, len(ids) - 1):
            x = ids.clone()
            x[p] = tok.mask_token_id
            with torch.no_grad():
                hand.append(float(_logp(ref(input_ids=x[None]).logits[0, p])[ids[p]]))
        np.testing.assert_allclose(sc.logprobs, hand, atol=1e-5, rtol=0)


def test_causal_logprobs_equal_hand_computation(handles, texts):
    h = handles["gpt"]
    tok, model = h.tokenizer, h.model
    scores = lm_scorer(h).text_logprobs(texts, batch_size=3, moments=True)
    for text, sc in zip(texts, scores):
        ids = torch.tensor([tok.eos_token_id] + tok(text)["input_ids"])
        with torch.no_grad():
            lp = _logp(model(input_ids=ids[None]).logits[0])
        hand = [float(lp[t - 1, ids[t]]) for t in range(1, len(ids))]
        np.testing.assert_allclose(sc.logprobs, hand, atol=1e-5, rtol=0)
        lp64 = lp.double()
        mu = (lp64.exp() * lp64).sum(-1, keepdim=True)
        sd = (lp64.exp() * (lp64 - mu) ** 2).sum(-1).sqrt()[:-1]
        np.testing.assert_allclose(sc.sigma, sd, atol=1e-5, rtol=0)
        assert sc.ids.tolist() == ids[1:].tolist() and sc.method == "causal"
        # HF's own loss over the same tokens
        with torch.no_grad():
            nll = float(model(input_ids=ids[None], labels=ids[None]).loss) * (len(ids) - 1)
        assert sc.total == pytest.approx(-nll, abs=1e-3)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_seq2seq_logprobs_equal_hand_computation(handles, texts, name):
    h = handles[name]
    tok, model = h.tokenizer, h.model
    sources, targets = texts[:4], texts[4:8]
    scores = lm_scorer(h).seq2seq_logprobs(sources, targets, batch_size=3)
    start = model.config.decoder_start_token_id
    for src, tgt, sc in zip(sources, targets, scores):
        x, y = torch.tensor([tok(src)["input_ids"]]), tok(tgt)["input_ids"]
        dec = torch.tensor([[start] + y[:-1]])
        with torch.no_grad():
            lp = _logp(model(input_ids=x, decoder_input_ids=dec).logits[0])
        hand = [float(lp[t, y[t]]) for t in range(len(y))]
        np.testing.assert_allclose(sc.logprobs, hand, atol=1e-5, rtol=0)
        assert sc.ids.tolist() == y
    with pytest.raises(ConfigError, match="source"):
        lm_scorer(h).text_logprobs(texts[:1])


# ---------------------------------------------------------------------- ELMo and ELECTRA checkpoints


@pytest.fixture(scope="module")
def elmo_folder(ewt_train, tmp_path_factory):
    """A tiny ELMo biLM (random weights) with a word tokenizer trained on EWT, saved and reloaded."""
    from workbench.families.elmo import FAMILY, build_model
    from workbench.tokenization import build_tokenizer

    tok = build_tokenizer("word", FAMILY.special_tokens, [s.text for s in ewt_train], 2000,
                          special_roles=FAMILY.special_roles, template=FAMILY.template)
    torch.manual_seed(0)
    model = build_model(FAMILY.model_config("tiny"), tok).eval()
    return _save(tmp_path_factory.mktemp("elmo"), model, tok), model, tok


def _elmo_hand(model, tok, text):
    """Forward log p(w_t | w_<t) for t >= 1 and backward log p(w_t | w_>t) for t <= n-2 of <S> text </S>."""
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        out = model(input_ids=ids, return_logits=True)
    f, b = _logp(out.forward_logits[0]), _logp(out.backward_logits[0])
    n = ids.shape[1]
    fwd = [0.0] + [float(f[t - 1, ids[0, t]]) for t in range(1, n)]
    bwd = [float(b[t + 1, ids[0, t]]) for t in range(n - 1)] + [0.0]
    return ids[0].tolist(), np.array(fwd), np.array(bwd)


def test_elmo_checkpoint_scores_texts_and_candidates(elmo_folder, texts):
    folder, model, tok = elmo_folder
    h = ModelHandle.load(folder)
    assert lm_kind(h.model) == "base"  # the handle opens the bare ElmoModel ...
    scorer = LMScorer(h)
    assert scorer.kind == "bilm" and scorer.model.elmo is h.model  # ... the softmax goes on top of it
    scores = scorer.text_logprobs(texts, batch_size=3)
    for text, sc in zip(texts, scores):
        ids, fwd, bwd = _elmo_hand(model, tok, text)
        assert sc.ids.tolist() == ids
        np.testing.assert_allclose(sc.directions["forward"], fwd, atol=1e-5, rtol=0)
        np.testing.assert_allclose(sc.directions["backward"], bwd, atol=1e-5, rtol=0)
        assert sc.total == pytest.approx(fwd.sum() + bwd.sum(), abs=1e-4)
    ctx = ["The <blank> is here .", "I ate a <blank> yesterday ."]
    cands = [["dog", "idea", "house"], ["sandwich", "car"]]
    cs = scorer.score_candidates(ctx, cands)
    for c, row, meth in zip(ctx, cands, cs.scores):
        for cand, score in zip(row, meth):
            _, fwd, bwd = _elmo_hand(model, tok, c.replace("<blank>", cand))
            assert score == pytest.approx(fwd.sum() + bwd.sum(), abs=1e-4)
    assert cs.method == [["bilm"] * 3, ["bilm"] * 2]


def test_elmo_saved_without_softmax_is_refused(elmo_folder, tmp_path):
    _, model, tok = elmo_folder
    folder = _save(tmp_path, model.elmo, tok, "body")
    with pytest.raises(CheckpointError, match=re.escape(str(folder)) + ".*without its LM softmax"):
        LMScorer(ModelHandle.load(folder))


def test_electra_scores_through_its_generator(tiny_electra, texts):
    folder, pretrainer, tok = tiny_electra
    h = ModelHandle.load(folder)
    assert not h.head_trained  # the discriminator folder has no MLM head ...
    scorer = LMScorer(h)  # ... so the generator scores
    assert scorer.kind == "mlm" and scorer.model.config.hidden_size == 16
    gen = pretrainer.generator
    ctx = ["The cat sat on <blank> mat .", "She said it <blank> good ."]
    cands = [["the", "a"], ["is", "was"]]  # one piece each in the 1,000-piece EWT vocabulary
    cs = scorer.score_candidates(ctx, cands)
    for c, row, got, n in zip(ctx, cands, cs.scores, cs.n_pieces):
        assert n == [1, 1]
        ids = torch.tensor([tok(c.replace("<blank>", tok.mask_token))["input_ids"]])
        p = int((ids[0] == tok.mask_token_id).nonzero())
        with torch.no_grad():
            lp = _logp(gen(input_ids=ids).logits[0, p])
        assert got == pytest.approx([float(lp[tok.convert_tokens_to_ids(x)]) for x in row], abs=1e-5)
    assert cs.method == [["mask", "mask"], ["mask", "mask"]]
    # PLL through the generator too
    (sc,) = scorer.pseudo_log_likelihood(texts[:1])
    ids = torch.tensor(tok(texts[0])["input_ids"])
    x = ids.clone()
    x[1] = tok.mask_token_id
    with torch.no_grad():
        assert sc.logprobs[0] == pytest.approx(float(_logp(gen(input_ids=x[None]).logits[0, 1])[ids[1]]), abs=1e-5)


def test_electra_without_generator_is_refused(tiny_electra, tmp_path):
    _, pretrainer, tok = tiny_electra
    folder = _save(tmp_path, pretrainer.model, tok, "disc_only")
    with pytest.raises(CheckpointError, match="without its generator"):
        LMScorer(ModelHandle.load(folder))


# ---------------------------------------------------------------------- candidates


def test_mlm_candidates_one_piece_read_the_mask_distribution(handles):
    h = handles["bert"]
    tok, model = h.tokenizer, h.model
    ctx = "The cat sat on the <blank> ."
    cands = ["the", "was", "is", "a", "of"]
    assert all(len(tok.tokenize(c)) == 1 for c in cands)
    before = h.stats["mlm_forward_rows"]
    cs = LMScorer(h).score_candidates([ctx], [cands])
    assert h.stats["mlm_forward_rows"] - before == 1  # one masked copy serves every candidate
    ids = torch.tensor([tok(ctx.replace("<blank>", tok.mask_token))["input_ids"]])
    p = int((ids[0] == tok.mask_token_id).nonzero())
    with torch.no_grad():
        lp = _logp(model(input_ids=ids).logits[0, p])
    assert cs.scores[0] == pytest.approx([float(lp[tok.convert_tokens_to_ids(c)]) for c in cands], abs=1e-5)
    assert cs.method == [["mask"] * len(cands)] and cs.n_pieces == [[1] * len(cands)]
    # ranking = argmax of the distribution restricted to the candidates
    restricted = torch.softmax(lp[tok.convert_tokens_to_ids(cands)], 0)
    assert cs.best() == [int(restricted.argmax())]


def test_mlm_multi_piece_candidate_makes_its_context_pll_and_is_flagged(handles):
    h = handles["bert"]
    tok = h.tokenizer
    ctx = ["The cat sat on <blank> mat .", "It <blank> good ."]
    cands = [["the", "extraordinary"], ["is", "was"]]
    assert len(tok.tokenize("extraordinary")) >= 2 and len(tok.tokenize("the")) == 1
    scorer = LMScorer(h)
    before = h.stats["candidates_by_pll"]
    cs = scorer.score_candidates(ctx, cands)
    assert cs.method == [["pll", "pll"], ["mask", "mask"]]
    assert cs.n_pieces[0] == [1, len(tok.tokenize("extraordinary"))]
    assert h.stats["candidates_by_pll"] - before == 2
    pll = scorer.pseudo_log_likelihood([ctx[0].replace("<blank>", c) for c in cands[0]])
    assert cs.scores[0] == pytest.approx([p.total for p in pll], abs=1e-5)


PLANTED = [("the cat is red .", "the cat is <blank> .", "red"), ("the dog is blue .", "the dog is <blank> .", "blue"),
           ("a sun is hot .", "a sun is <blank> .", "hot"), ("a moon is cold .", "a moon is <blank> .", "cold")]
WRONG = {"red": "blue", "blue": "red", "hot": "cold", "cold": "hot"}


def _train(model, make_batch, steps=150, lr=1e-2, seed=0):
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = model(**make_batch()).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


def _check_planted(h):
    ctxs = [c for _, c, _ in PLANTED]
    cands = [[right, WRONG[right]] for _, _, right in PLANTED]
    scores = LMScorer(h).score_candidates(ctxs, cands).scores
    for (right_score, wrong_score) in scores:
        assert right_score > wrong_score + 1.0
    return scores


def test_causal_scoring_planted(tokenizers):
    tok = tokenizers["gpt"]
    model = tiny_gpt2(tok)
    eos = tok.eos_token_id
    seqs = [[eos] + tok(" " + s)["input_ids"] for s, _, _ in PLANTED]
    T = max(map(len, seqs))
    ids = torch.tensor([s + [eos] * (T - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (T - len(s)) for s in seqs])
    labels = ids.masked_fill(mask == 0, -100)
    loss = _train(model, lambda: dict(input_ids=ids, attention_mask=mask, labels=labels))
    assert loss < 0.5
    h = ModelHandle(model, tok)
    scores = _check_planted(h)
    # the score is log p(whole sentence) behind <|endoftext|>: HF's own loss over it
    text = PLANTED[0][1].replace("<blank>", "red")
    x = torch.tensor([[eos] + tok(text)["input_ids"]])
    with torch.no_grad():
        nll = float(model(input_ids=x, labels=x).loss) * (x.shape[1] - 1)
    assert scores[0][0] == pytest.approx(-nll, abs=1e-3)


def _pad(rows, value):
    """Right-pad lists of ids into one tensor."""
    width = max(map(len, rows))
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


def _train_seq2seq(model, tok, src, tgt) -> ModelHandle:
    """Fit a seq2seq model on the planted (source, target) id lists; its handle."""
    src_ids, tgt_ids = _pad(src, tok.pad_token_id), _pad(tgt, -100)
    _train(model, lambda: dict(input_ids=src_ids, attention_mask=(src_ids != tok.pad_token_id).long(),
                               labels=tgt_ids))
    return ModelHandle(model, tok)


def test_t5_scoring_planted(tokenizers):
    tok = tokenizers["t5"]
    model = tiny_t5(tok)
    s0, s1 = tok.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_1>"])
    src = [tok(c.replace("<blank>", "<extra_id_0>"))["input_ids"] for _, c, _ in PLANTED]
    tgt = [[s0] + tok(" " + r, add_special_tokens=False)["input_ids"] + [s1] for _, _, r in PLANTED]

    h = _train_seq2seq(model, tok, src, tgt)
    scores = _check_planted(h)
    # hand: HF's loss over the target, minus the (unscored) prediction of sentinel 0
    x, y = torch.tensor([src[0]]), torch.tensor([tgt[0]])
    with torch.no_grad():
        out = model(input_ids=x, labels=y)
        first = float(torch.log_softmax(out.logits[0, 0], -1)[s0])
    assert scores[0][0] == pytest.approx(-float(out.loss) * y.shape[1] - first, abs=1e-3)
    assert LMScorer(h).score_candidates([PLANTED[0][1]], [["red"]]).method == [["seq2seq-sentinel"]]


def test_bart_scoring_planted(tokenizers):
    tok = tokenizers["bart"]
    model = tiny_bart(tok)
    src = [tok(c.replace("<blank>", "<mask>"))["input_ids"] for _, c, _ in PLANTED]
    tgt = [tok(s)["input_ids"] for s, _, _ in PLANTED]

    h = _train_seq2seq(model, tok, src, tgt)
    scores = _check_planted(h)
    x, y = torch.tensor([src[0]]), torch.tensor([tgt[0]])
    with torch.no_grad():
        nll = float(model(input_ids=x, labels=y).loss) * y.shape[1]
    assert scores[0][0] == pytest.approx(-nll, abs=1e-3)
    assert LMScorer(h).score_candidates([PLANTED[0][1]], [["red"]]).method == [["seq2seq-infill"]]


@pytest.mark.parametrize("name", FAMILIES)
def test_save_load_round_trip_scores(tmp_path, tiny_models, handles, name):
    model, tok = tiny_models[name]
    h = ModelHandle.load(_save(tmp_path, model, tok))
    ctx, cands = ["The <blank> is here ."], [["dog", "idea"]]
    np.testing.assert_allclose(LMScorer(h).score_candidates(ctx, cands).scores,
                               LMScorer(handles[name]).score_candidates(ctx, cands).scores, atol=1e-4)


# ---------------------------------------------------------------------- errors


def test_bad_contexts_and_long_inputs_name_the_input(handles, tokenizers, ewt_train):
    scorer = LMScorer(handles["bert"])
    with pytest.raises(ConfigError, match="context 1 must hold exactly one"):
        scorer.score_candidates(["a <blank> b", "no blank here"], [["x"], ["x"]])
    with pytest.raises(ConfigError, match="2 contexts but 1 candidate"):
        scorer.score_candidates(["a <blank> b", "c <blank>"], [["x"]])
    tok = tokenizers["bert"]
    short = ModelHandle(tiny_bert(tok, max_positions=24), tok)
    long_text = next(s.text for s in ewt_train if len(tok(s.text)["input_ids"]) > 30)
    with pytest.raises(ConfigError, match=r"text 1 \('" + re.escape(long_text[:10]) + r".*exceed max_length=24"):
        LMScorer(short).pseudo_log_likelihood(["a short one .", long_text])
    with pytest.raises(ConfigError, match=r"context 0 filled with 'x'.*exceed max_length"):
        LMScorer(short).score_candidates([long_text + " <blank>"], [["x"]])
    gpt = tokenizers["gpt"]
    with pytest.raises(ConfigError, match="text 0"):
        LMScorer(ModelHandle(tiny_gpt2(gpt, max_positions=24), gpt)).causal_logprobs([long_text])
    with pytest.raises(ConfigError, match="need a causal head"):
        scorer.causal_logprobs(["a b"])


def test_models_without_a_trained_head_are_refused(tmp_path, tiny_models, ewt_train):
    model, tok = tiny_models["bert"]
    with pytest.raises(CheckpointError, match="in-memory model: no trained LM head.*BertModel"):
        LMScorer(ModelHandle(model.bert, tok))
    # saved from the bare body (as sentence-transformers/all-MiniLM-L6-v2 is): states yes, scores no
    folder = _save(tmp_path, model.bert, tok, "body_only")
    h = ModelHandle.load(folder)
    assert not h.head_trained
    np.testing.assert_allclose(next(h.word_states([ewt_train[5].words])),
                               next(ModelHandle(model, tok).word_states([ewt_train[5].words])), atol=1e-6)
    with pytest.raises(CheckpointError, match=re.escape(str(folder)) + ".*saved as BertModel, without LM head weights.*MiniLM"):
        LMScorer(h)


@pytest.mark.parametrize("legacy", [True, False])
def test_deberta_mlm_head_on_hidden_states_equals_full_logits(legacy):
    """DeBERTa's MLM head read off the hidden states alone, for both heads transformers has: the
    legacy BERT-style `cls` and (config legacy=False) `lm_predictions` with the word embeddings."""
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM

    from workbench.running.lm_scores import mlm_head

    torch.manual_seed(0)
    model = DebertaV2ForMaskedLM(DebertaV2Config(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=32, legacy=legacy)).eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        hidden = model.base_model(input_ids=ids).last_hidden_state
        torch.testing.assert_close(mlm_head(model)(model, hidden[:, 3]), full[:, 3])
