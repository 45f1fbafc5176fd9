"""`distilbert` as a trainable family (workbench/families/distilbert.py): a DistilBertForMaskedLM built
from a preset learns a fixed batch, trains from a config through the one loop, saves a checkpoint
that plain transformers opens with the same logits, and costs what a hand count says."""

from __future__ import annotations

import pytest
import torch

from tests.training_helpers import run_tiny_training
from tests.tolerances import assert_same_outputs, assert_same_state
from workbench.cost import flops_per_token
from workbench.errors import ConfigError
from workbench.families import FAMILIES, get_family
from workbench.families.distilbert import build_model, distilbert_model_config, load_pretrainer


class _Tok:
    """What `build_model` reads of a tokenizer: its length and pad id."""

    pad_token_id = 0

    def __len__(self):
        return 120


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))


def test_the_family_is_registered_with_a_masked_lm_and_presets():
    spec = get_family("distilbert")
    assert "distilbert" in FAMILIES and spec.auto_class == "AutoModelForMaskedLM"
    assert spec.objective["objective"] == "mlm" and "nsp" not in spec.objective
    model = build_model(spec.model_config("tiny"), _Tok())
    assert type(model.model).__name__ == "DistilBertForMaskedLM"
    c = model.model.config
    assert (c.n_layers, c.dim, c.n_heads, c.hidden_dim) == (2, 64, 2, 128)
    assert not any("token_type" in k or "pooler" in k for k in model.model.state_dict())
    small = get_family("distilbert").model_config("small")
    assert (small["num_hidden_layers"], small["hidden_size"]) == (4, 256)


def test_a_model_setting_distilbert_lacks_is_refused():
    with pytest.raises(ConfigError, match=r"model: setting\(s\) \['num_layers'\] do not exist in DistilBERT"):
        distilbert_model_config({"num_layers": 3})
    with pytest.raises(ConfigError, match="layer_norm_eps"):
        distilbert_model_config({"layer_norm_eps": 1e-5})
    assert distilbert_model_config({"hidden_size": 32, "dim": 32, "type_vocab_size": 2, "hidden_act": "relu"}) == \
        {"dim": 32, "activation": "relu"}


def test_the_mlm_loss_falls_on_a_fixed_batch():
    torch.manual_seed(0)
    model = build_model(get_family("distilbert").model_config("tiny"), _Tok()).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 120, (4, 12), generator=g)
    labels = torch.full_like(ids, -100)
    labels[:, 3:6] = ids[:, 3:6]
    masked = ids.clone()
    masked[:, 3:6] = 4
    batch = {"input_ids": masked, "attention_mask": torch.ones_like(ids), "labels": labels}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        out = model(**batch)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(out.loss.detach()))
    assert losses[-1] < 0.2 * losses[0], losses
    # the loss is the cross-entropy of transformers' own logits at the masked positions
    model.eval()
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(model.model(input_ids=masked).logits[labels != -100],
                                                 labels[labels != -100])
        assert float(model(**batch).loss) == pytest.approx(float(want), rel=1e-5)


@pytest.mark.slow
def test_a_tiny_config_trains_saves_and_opens_in_plain_transformers(env, tmp_path):
    from transformers import AutoModelForMaskedLM

    run = run_tiny_training("distilbert", 24, tmp_path / "out")
    assert run.heldout_after["loss"] < run.heldout_before["loss"] - 0.3, (run.heldout_before, run.heldout_after)
    plain = AutoModelForMaskedLM.from_pretrained(run.checkpoint).eval()
    assert type(plain).__name__ == "DistilBertForMaskedLM"
    ours = load_pretrainer(run.checkpoint).model.eval()
    ids = torch.tensor([[2, 40, 41, 4, 43, 3], [2, 50, 4, 52, 3, 0]])
    mask = (ids != 0).long()
    assert_same_state(plain, ours)
    with torch.no_grad():
        assert_same_outputs(plain(input_ids=ids, attention_mask=mask).logits,
                            ours(input_ids=ids, attention_mask=mask).logits, plain.config)
    import json

    manifest = json.loads((run.checkpoint / "manifest.json").read_text())
    assert manifest["family"] == "distilbert" and manifest["model_config"]["num_hidden_layers"] == 2


def test_flops_per_token_equal_a_hand_count():
    """The tiny preset (2 layers, d 64, FFN 128), span 64, vocabulary 1000: per layer Q,K,V,O 8d^2,
    scores and values 4sd, FFN 4df; the head (d -> d transform, d -> V) on the 15% masked tokens;
    no pooler, no NSP head. Training = 3 x forward."""
    layers = 2 * (8 * 64 * 64 + 4 * 64 * 64 + 4 * 64 * 128)        # 163,840
    head = 0.15 * (2 * 64 * 64 + 2 * 64 * 1000)                    # 20,428.8
    assert layers + head == pytest.approx(184_268.8)
    spec = get_family("distilbert")
    got = flops_per_token("distilbert", spec.model_config("tiny"), 1000, 64, spec.objective)
    assert got["total"] == pytest.approx(3 * (layers + head), rel=1e-12)
