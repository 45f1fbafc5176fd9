"""ELECTRA's discriminator as a membership score (issue 12): log P(original) = log sigmoid(-z_t) of
every content token of the unmodified text, against a hand computation from the discriminator's
logits, and on real text with a tiny ELECTRA trained by the backend for many passes over its half."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from probes import membership as mem
from workbench.errors import ConfigError
from workbench.running.lm_scores import LMScorer, lm_scorer
from workbench.running.models import ModelHandle

TEXTS = ["the cat sat on the mat .", "a dog barked at the postman all morning .", "yes ."]


def test_discriminator_score_equals_hand_computation(tiny_electra):
    folder, pretrainer, tok = tiny_electra
    h = ModelHandle.load(folder)
    disc = LMScorer(h, electra_head="discriminator")
    assert disc.kind == "rtd" and disc.model.electra is h.model.base_model  # the RTD head on the handle's body
    assert LMScorer(h).kind == "mlm"  # the default stays the generator
    got = disc.text_logprobs(TEXTS, batch_size=2, moments=True)  # padding across lengths
    for text, sc in zip(TEXTS, got):
        enc = tok(text)
        ids = torch.tensor([enc["input_ids"]])
        with torch.no_grad():
            z = pretrainer.model(input_ids=ids).logits[0].double()  # "replaced" logits of the saved model
        content = [t for t, sp in enumerate(tok.get_special_tokens_mask(enc["input_ids"], already_has_special_tokens=True))
                   if not sp]
        p_orig = 1.0 / (1.0 + np.exp(z[content].numpy()))  # sigmoid(-z)
        assert sc.method == "rtd" and sc.ids.tolist() == [enc["input_ids"][t] for t in content]
        np.testing.assert_allclose(sc.logprobs, np.log(p_orig), atol=1e-5, rtol=0)
        q = 1 - p_orig
        np.testing.assert_allclose(sc.mu, p_orig * np.log(p_orig) + q * np.log(q), atol=1e-5, rtol=0)
        sd = np.sqrt(p_orig * (np.log(p_orig) - sc.mu) ** 2 + q * (np.log(q) - sc.mu) ** 2)
        np.testing.assert_allclose(sc.sigma, sd, atol=1e-5, rtol=0)
    # the membership statistics: NLL = -mean log P(original), so LOSS = mean log P(original)
    st = mem.lm_stats(h, TEXTS, batch_size=4, moments=False, electra_head="discriminator")
    assert st.nll == pytest.approx([-g.logprobs.mean() for g in got], rel=1e-9)
    assert mem.scored_by(h, "discriminator") == "rtd (discriminator)" and mem.scored_by(h) == "mlm (generator)"
    assert lm_scorer(h, "discriminator") is lm_scorer(h, "discriminator") is not lm_scorer(h)
    with pytest.raises(ConfigError, match="whole texts"):
        disc.score_candidates(["a <blank> ."], [["cat"]])


def test_discriminator_refused_where_there_is_none(tiny_electra, tiny_models, tmp_path):
    from workbench.errors import CheckpointError

    model, tok = tiny_models["bert"]
    with pytest.raises(ConfigError, match="only ELECTRA"):
        LMScorer(ModelHandle(model, tok), electra_head="discriminator")
    _, pretrainer, tok = tiny_electra
    pretrainer.generator.save_pretrained(tmp_path / "gen")  # an ELECTRA masked LM, no RTD head
    tok.save_pretrained(tmp_path / "gen")
    with pytest.raises(CheckpointError, match="no trained discriminator head"):
        LMScorer(ModelHandle.load(tmp_path / "gen"), electra_head="discriminator")
    from probes import get_probe

    spec = get_probe("membership")
    with pytest.raises(ConfigError, match="electra_head"):
        spec.settings(tasks=("attacks",), electra_head="disc").validate(spec)


# a tiny ELECTRA, no dropout, 300 steps of 16 x 32 tokens: ~100 passes over its ~1,500-token half.
# Measured with pool seeds 0-4 (AUC of LOSS): discriminator 0.98-1.0, generator 0.905-0.98. At lr 5e-3
# the discriminator collapsed to the replaced-token base rate (P(replaced) ~ 0.14 on every token of
# members and non-members alike) in 4 of 6 runs (pool seeds 1 and 2, 120 and 300 steps); its mean score then read 0.29-0.74.
TINY_ELECTRA = {"name": "mia-electra-test", "family": "electra", "preset": "tiny", "tokenizer": {"vocab_size": 1000},
                "max_len": 32, "batch_size": 16, "lr": 2e-3, "warmup": 0.05, "weight_decay": 0.0, "steps": 300,
                "eval": {"batches": 0}, "model": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
                "checkpoints": {"log_spaced": False}, "progress": False}


@pytest.fixture(scope="module")
def trained_electra(tmp_path_factory):
    """Two tiny ELECTRAs on balanced halves of 96 sentence_polarity sentences (one pool tokenizer);
    model 0 is the target, its held-out half the non-members."""
    from workbench.drivers.shadows import train_shadow_set

    root = tmp_path_factory.mktemp("electra-mia")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BERTOLOGY_RUNS", str(root / "runs"))
        s = train_shadow_set(TINY_ELECTRA, {"sources": ["sentence_polarity"], "max_documents": 96, "seed": 0}, 2,
                             root / "set", seed=0, progress=False)
    return s.checkpoints[0]


@pytest.mark.slow
def test_discriminator_separates_members_on_real_text(trained_electra, tmp_path):
    from probes.core import runner
    from workbench.store.results import ResultsStore

    aucs, ci_low = {}, {}
    for head in ("discriminator", "generator"):
        # 16-word passages: the model trained on 32-token blocks scores only passages that fit them
        settings = {"tasks": ["attacks"], "attacks": ["loss", "mink", "minkpp"], "electra_head": head, "min_words": 1,
                    "passage_words": 16,
                    "length_bin": 4, "n_boot": 200, "baselines": [], "progress": False, "mink_ratios": [0.2]}
        _, rows = runner.run_probe("membership", [trained_electra], settings, store=ResultsStore(tmp_path / head))
        auc = rows[rows["metric"] == "auc"].set_index("task")
        extra = auc.loc["loss", "extra"]
        extra = json.loads(extra) if isinstance(extra, str) else extra
        assert extra["scored_by"] == ("rtd (discriminator)" if head == "discriminator" else "mlm (generator)")
        assert auc.loc["loss", "n"] >= 40
        aucs[head] = auc["value"].round(3).to_dict()
        ci_low[head] = auc.loc["loss", "ci_low"]
        from app.page_modules.membership import attack_table

        table = attack_table(rows)
        assert set(table["scored_by"]) == {extra["scored_by"]} and len(table) == 3  # the page says which head
    print("tiny ELECTRA membership AUCs:", aucs)
    # both heads detect membership: LOSS's own 95% bootstrap CI lies above chance (how well an attack
    # recovers a signal of known size is tests/test_membership.py's planted-signal test)
    assert ci_low["discriminator"] > 0.5 and ci_low["generator"] > 0.5, ci_low
    # the score by hand from the target's discriminator: mean log P(original) over content tokens
    h = ModelHandle.load(trained_electra)
    s = mem.pretrain_sample(trained_electra, passage_words=16, min_words=1, n_examples=1000, seed=0, length_bin=4,
                            fits=lambda texts: mem.fits_window(h, texts))
    st = mem.lm_stats(h, s.texts[:5], batch_size=8, moments=False, electra_head="discriminator")
    disc = lm_scorer(h, "discriminator").model
    for text, nll in zip(s.texts[:5], st.nll):
        enc = h.tokenizer(text, return_special_tokens_mask=True)
        with torch.no_grad():
            z = disc(input_ids=torch.tensor([enc["input_ids"]])).logits[0].double()
        keep = ~np.asarray(enc["special_tokens_mask"], bool)
        assert -nll == pytest.approx(float(torch.nn.functional.logsigmoid(-z).numpy()[keep].mean()), abs=1e-6)
