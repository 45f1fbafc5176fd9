"""workbench/dropout.py: dropout's semantics with the 16-bit PCG64 mask (keep rate, scaling,
independence, gradient, reproducibility) and the module swap reaching every dropout of a model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.dropout import FastDropout, dropout, keep_mask, keep_threshold, use_fast_dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.37])
def test_keep_rate_matches_the_quantised_probability(p):
    """Over 2^22 elements the kept share is within 5 binomial standard errors of threshold / 65536,
    which is within 2^-17 of 1 - p."""
    torch.manual_seed(0)
    n = 1 << 22
    rate = keep_mask((n,), p).float().mean().item()
    expected = keep_threshold(p) / 65536
    assert abs(expected - (1 - p)) <= 2**-17
    assert abs(rate - expected) < 5 * (expected * (1 - expected) / n) ** 0.5


def test_masks_are_independent_between_calls_and_between_neighbours():
    """Two calls draw different masks (no reuse across layers); the correlation between two calls'
    masks, and between neighbouring elements of one mask (lanes of one 64-bit word), is ~0."""
    torch.manual_seed(0)
    a, b = keep_mask((1 << 20,), 0.5).float(), keep_mask((1 << 20,), 0.5).float()
    assert not torch.equal(a, b)
    corr = lambda x, y: torch.corrcoef(torch.stack([x, y]))[0, 1].item()  # noqa: E731
    bound = 5 / (1 << 10)  # 5 standard errors of a correlation over 2^20 pairs
    assert abs(corr(a, b)) < bound
    for lag in (1, 2, 3, 4):
        assert abs(corr(a[:-lag], a[lag:])) < bound


def test_kept_elements_are_scaled_and_the_rest_zeroed():
    torch.manual_seed(0)
    x = torch.randn(64, 128, 32)
    y = dropout(x, 0.2)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / 0.8, rtol=0, atol=1e-6)
    assert 0.78 < kept.float().mean().item() < 0.82



@pytest.mark.parametrize("dtype,bits", [(torch.float32, torch.int32), (torch.bfloat16, torch.int16)])
def test_keep_and_scale_gives_the_bits_of_where_then_scale(dtype, bits):
    """The one-pass keep-and-scale equals `where(mask, x, 0) * scale` bit for bit (signs of zeros
    included) except where an exactly -0.0 input is kept: +0.0 there, the same number."""
    from workbench.dropout import keep_and_scale

    torch.manual_seed(0)
    x = (torch.randn(4096) * 10).to(dtype)
    x[:8], x[8:16] = -0.0, 0.0
    mask = torch.rand(4096) < 0.8
    mask[:4], mask[4:8] = True, False
    for p in (0.1, 0.2, 0.3, 0.5):
        scale = 1.0 / (1.0 - p)
        want = torch.where(mask, x, 0).mul_(scale)
        got = keep_and_scale(x, mask, scale)
        assert got.dtype == dtype
        differ = want.view(bits) != got.view(bits)
        assert differ.nonzero().flatten().tolist() == [0, 1, 2, 3]  # the kept -0.0 inputs
        assert torch.equal(want, got)

def test_gradient_is_the_mask_over_keep():
    torch.manual_seed(0)
    x = torch.randn(32, 64, requires_grad=True)
    y = dropout(x, 0.3)
    g = torch.randn_like(y)
    y.backward(g)
    expected = torch.where(y != 0, g / 0.7, torch.zeros_like(g))
    torch.testing.assert_close(x.grad, expected, rtol=1e-6, atol=1e-6)


def test_reproducible_from_torch_seed_and_rng_state():
    """torch.manual_seed fixes the masks, and restoring torch's RNG state (what a training checkpoint
    saves) replays them: an exact resume stays exact."""
    x = torch.randn(1000)
    torch.manual_seed(7)
    first = dropout(x, 0.1)
    state = torch.get_rng_state()
    second = dropout(x, 0.1)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.1), first)
    torch.set_rng_state(state)
    assert torch.equal(dropout(x, 0.1), second)


def test_eval_mode_and_p_zero_are_the_identity_and_p_one_zeroes():
    x = torch.randn(10, 10)
    assert torch.equal(dropout(x, 0.5, training=False), x)
    assert torch.equal(dropout(x, 0.0), x)
    assert torch.count_nonzero(dropout(x, 1.0)) == 0
    module = FastDropout(0.5).eval()
    assert torch.equal(module(x), x) and isinstance(module, nn.Dropout) and module.p == 0.5


def test_swap_reaches_every_dropout_of_a_deberta_training_step(monkeypatch):
    """A tiny DeBERTa-style pretrainer (the main job's family): every nn.Dropout becomes a FastDropout,
    and one training forward draws exactly one mask per dropout module it runs (counted through
    keep_mask), none through torch's bernoulli."""
    import workbench.dropout as wd
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM

    config = DebertaV2Config(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=64, relative_attention=True,
                             position_buckets=16, pos_att_type=["c2p", "p2c"], position_biased_input=False)
    torch.manual_seed(0)
    model = DebertaV2ForMaskedLM(config)
    n_dropout = sum(type(m) is nn.Dropout for m in model.modules())
    assert use_fast_dropout(model) == n_dropout > 0
    assert not any(type(m) is nn.Dropout for m in model.modules())
    calls = []
    real = wd.keep_mask
    monkeypatch.setattr(wd, "keep_mask", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    bernoulli = []
    monkeypatch.setattr(torch.Tensor, "bernoulli_", lambda *a, **k: bernoulli.append(1))
    model.train()
    ids = torch.randint(0, 100, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    # embeddings (1) + per layer: relative position embeddings, attention probs, attention output,
    # FFN output (4)
    assert len(calls) == 1 + 4 * config.num_hidden_layers
    assert bernoulli == []
    model.eval()
    calls.clear()
    model(input_ids=ids)
    assert calls == []



def test_the_training_loop_builds_its_model_with_the_masks_the_config_names():
    """`dropout_masks: pcg16` (the default) swaps every nn.Dropout of the training module (nested ones
    too, p kept), `bernoulli` none; the two hash differently, `bernoulli` as configs before the key
    did; a bad value is a ConfigError naming the key."""
    from types import SimpleNamespace

    from workbench.config import load_train_config
    from workbench.errors import ConfigError
    from workbench.drivers.train import build_model

    family = SimpleNamespace(model_config=lambda preset, model: {},
                             build_model=lambda cfg, tok: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1),
                                                                        nn.Sequential(nn.Dropout(0.2))))
    base = {"family": "deberta", "preset": "tiny", "steps": 3}
    fast, plain = load_train_config(base), load_train_config({**base, "dropout_masks": "bernoulli"})
    model = build_model(fast, family, None, 0, torch.device("cpu"))
    assert [(type(m), m.p) for m in model.modules() if isinstance(m, nn.Dropout)] == [(FastDropout, 0.1), (FastDropout, 0.2)]
    model = build_model(plain, family, None, 0, torch.device("cpu"))
    assert [type(m) for m in model.modules() if isinstance(m, nn.Dropout)] == [nn.Dropout, nn.Dropout]
    assert fast.dropout_masks == "pcg16" and fast.training_hash() != plain.training_hash()
    with pytest.raises(ConfigError, match="dropout_masks: must be one of pcg16, pcg16_modules, bernoulli, got 'philox'"):
        load_train_config({**base, "dropout_masks": "philox"})


def test_a_run_folder_of_the_old_masks_is_refused_with_the_way_to_reuse_it(tmp_path):
    """A folder trained before `dropout_masks` existed (its run.json hash = today's `bernoulli` hash)
    is not resumed with pcg16 masks: the error names the key that reuses it; with the key it is
    claimed as before."""
    import json

    from workbench.config import load_train_config
    from workbench.errors import ConfigError
    from workbench.loop import NO_HOOKS
    from workbench.drivers.train import Dist, claim_run_folder

    base = {"family": "gpt", "steps": 3}
    old = load_train_config({**base, "dropout_masks": "bernoulli"})
    (tmp_path / "run.json").write_text(json.dumps({"training_hash": old.training_hash("cpu"), "seed": 0}))
    with pytest.raises(ConfigError, match="bernoulli dropout masks.*add `dropout_masks: bernoulli`"):
        claim_run_folder(load_train_config(base), 0, tmp_path, Dist(), NO_HOOKS, torch.device("cpu"))
    claim_run_folder(old, 0, tmp_path, Dist(), NO_HOOKS, torch.device("cpu"))  # no error
    other = load_train_config({**base, "lr": 1e-2})
    with pytest.raises(ConfigError, match="holds a run of a different config"):
        claim_run_folder(other, 0, tmp_path, Dist(), NO_HOOKS, torch.device("cpu"))


# ---- attention-probability dropout inside HF's attention functions ---------------------------------

TEXTS = ["the committee met on tuesday to discuss the budget .", "a small dog ran across the old bridge .",
         "she said that the results were not what anyone expected ."] * 20


def family_model(name: str):
    """The family's tiny training module (workbench/families), seed 0, with a tokenizer trained here."""
    from workbench.families import get_family
    from workbench.tokenization import build_tokenizer

    family = get_family(name)
    tok = build_tokenizer(family.tokenizer_kind, family.special_tokens, TEXTS, vocab_size=120,
                          special_roles=family.special_roles, template=family.template)
    torch.manual_seed(0)
    return family.build_model(family.model_config("tiny"), tok), tok


def test_the_family_lists_say_how_each_family_applies_attention_dropout():
    """FUNCTIONAL_ATTENTION_DROPOUT_FAMILIES (which the training hash reads) are exactly the families
    whose models switch to the pcg16 attention function; DeBERTa's attention dropout is a module
    (swapped by use_fast_dropout); ELMo has neither. Every family of the registry is in one case."""
    from transformers import PreTrainedModel

    from workbench.dropout import (ATTENTION_FUNCTION, FUNCTIONAL_ATTENTION_DROPOUT_FAMILIES,
                                   MODULE_ATTENTION_DROPOUT_FAMILIES, use_fast_attention_dropout)
    from workbench.families import FAMILIES

    for name in FAMILIES:
        model, _ = family_model(name)
        hf = [m for m in model.modules() if isinstance(m, PreTrainedModel)]
        switched = use_fast_attention_dropout(model)
        if name in FUNCTIONAL_ATTENTION_DROPOUT_FAMILIES:
            assert switched >= 1 and all(m.config._attn_implementation == ATTENTION_FUNCTION for m in hf), name
        else:
            assert switched == 0 and all(m.config._attn_implementation != ATTENTION_FUNCTION for m in hf), name
            assert (name in MODULE_ATTENTION_DROPOUT_FAMILIES) == any(
                "attention" in n and isinstance(m, nn.Dropout) for n, m in model.named_modules()), name
    assert len(FUNCTIONAL_ATTENTION_DROPOUT_FAMILIES) == 9 and set(MODULE_ATTENTION_DROPOUT_FAMILIES) == {"deberta"}


def _hf_inputs(name: str, tok, model):
    ids = torch.tensor([tok.encode(t)[:12] for t in TEXTS[:3]])
    mask = torch.ones_like(ids)
    mask[0, 1:4] = 0  # masked tokens before real ones (seen by causal models too) and padding after them:
    mask[1, 4:] = 0  # the mask must reach the attention function as the default's does
    extra = {"decoder_input_ids": ids[:, :9]} if name in ("t5", "bart") else {}
    return {"input_ids": ids, "attention_mask": mask, **extra}


@pytest.mark.parametrize("name", ["bert", "roberta", "albert", "electra", "distilbert", "gpt", "t5", "bart"])
def test_the_attention_function_outside_training_equals_the_familys_default(name):
    """Eval mode (no dropout), with padding: the HF model's output under `bertology_pcg16` equals its
    default attention (SDPA) within 1e-6 relative, and eager attention's within 1e-6 absolute."""
    from workbench.dropout import use_fast_attention_dropout

    model, tok = family_model(name)
    hf = model.model.eval()  # the transformers model inside the training wrapper
    batch = _hf_inputs(name, tok, hf)
    assert hf.config._attn_implementation == "sdpa"
    logits = lambda **b: hf(**b).to_tuple()[0]  # noqa: E731  (the first output: the head's logits)
    with torch.no_grad():
        default = logits(**batch)
        hf.set_attn_implementation("eager")
        eager = logits(**batch)
        assert use_fast_attention_dropout(hf) == 1
        ours = logits(**batch)
        unmasked = logits(**{**batch, "attention_mask": torch.ones_like(batch["attention_mask"])})
    torch.testing.assert_close(ours, default, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours, eager, rtol=0, atol=1e-6)
    keep = batch["attention_mask"].bool() if name not in ("t5", "bart") else slice(None)
    assert not torch.allclose(ours[keep], unmasked[keep], atol=1e-4)  # the mask was applied (without it they differ)


def _attention_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=g) for _ in range(3))
    mask = torch.zeros(2, 1, 16, 16)
    mask[1, :, :, 10:] = torch.finfo(torch.float32).min  # eager's additive padding mask
    return q, k, v, mask


def test_attention_dropout_keeps_at_the_right_rate_scales_and_is_unbiased():
    """In training the returned probabilities are the softmax's kept with probability 0.9 (the
    quantised rate, within 5 standard errors over ~3e5 elements) and scaled by 1/0.9, else zero; the
    mean output over 400 draws equals the no-dropout output within 5 standard errors everywhere."""
    from workbench.dropout import keep_threshold, pcg16_attention_forward

    q, k, v, mask = _attention_inputs()
    module = nn.Module()
    probs = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5 + mask, dim=-1)
    ref, ref_w = pcg16_attention_forward(module.eval(), q, k, v, mask, dropout=0.1)
    torch.testing.assert_close(ref_w, probs, rtol=0, atol=1e-6)
    torch.testing.assert_close(ref, (probs @ v).transpose(1, 2), rtol=0, atol=1e-6)
    module.train()
    torch.manual_seed(0)
    outs, kept = [], []
    for _ in range(400):
        out, w = pcg16_attention_forward(module, q, k, v, mask, dropout=0.1)
        nonzero = w != 0
        torch.testing.assert_close(w[nonzero], ref_w[nonzero] / 0.9, rtol=1e-6, atol=0)
        kept.append(nonzero[probs > 0].float())
        outs.append(out)
    rate, n = torch.cat(kept).mean().item(), torch.cat(kept).numel()
    expected = keep_threshold(0.1) / 65536
    assert abs(rate - expected) < 5 * (expected * (1 - expected) / n) ** 0.5
    outs = torch.stack(outs)
    se = outs.std(0) / len(outs) ** 0.5
    assert ((outs.mean(0) - ref).abs() < 5 * se + 1e-6).all()
    assert (outs.std(0) > 0).float().mean() > 0.99  # the draws really differ


def test_attention_dropout_is_reproducible_from_torch_seed():
    from workbench.dropout import pcg16_attention_forward

    q, k, v, mask = _attention_inputs()
    module = nn.Module().train()
    draw = lambda: pcg16_attention_forward(module, q, k, v, mask, dropout=0.1)[0]  # noqa: E731
    torch.manual_seed(3)
    first, second = draw(), draw()
    torch.manual_seed(3)
    assert torch.equal(draw(), first) and not torch.equal(first, second)


def test_a_bert_training_forward_draws_every_mask_with_pcg16_and_bernoulli_mode_is_untouched(monkeypatch, tmp_path):
    """The loop's BERT with `dropout_masks: pcg16`: one forward draws one keep_mask per dropout it
    runs (embeddings; per layer the attention probabilities, attention output, FFN output; the
    pretraining heads none) and no bernoulli_; with `bernoulli` the model keeps SDPA and nn.Dropout.
    Its saved checkpoint does not name the attention function: it opens with SDPA. On a device other
    than the CPU the attention is not switched."""
    import workbench.dropout as wd
    from workbench.config import load_train_config
    from workbench.families import get_family
    from workbench.drivers.train import build_model

    _, tok = family_model("bert")
    family = get_family("bert")
    plain = build_model(load_train_config({"family": "bert", "preset": "tiny", "steps": 3, "dropout_masks": "bernoulli"}),
                        family, tok, 0, torch.device("cpu"))
    assert plain.model.config._attn_implementation == "sdpa"
    assert not any(isinstance(m, FastDropout) for m in plain.modules())
    model = build_model(load_train_config({"family": "bert", "preset": "tiny", "steps": 3}), family, tok, 0, torch.device("cpu"))
    assert model.model.config._attn_implementation == wd.ATTENTION_FUNCTION
    elsewhere = build_model(load_train_config({"family": "bert", "preset": "tiny", "steps": 3}), family, tok, 0,
                            torch.device("meta"))  # not a CPU: torch's masks anyway, so SDPA's fused kernels stay
    assert elsewhere.model.config._attn_implementation == "sdpa"
    calls, bernoulli = [], []
    real = wd.keep_mask
    monkeypatch.setattr(wd, "keep_mask", lambda *a, **k: calls.append(tuple(a[0])) or real(*a, **k))
    monkeypatch.setattr(torch.Tensor, "bernoulli_", lambda *a, **k: bernoulli.append(1))
    model.train()
    ids = torch.tensor([tok.encode(t)[:12] for t in TEXTS[:2]])
    model.model(input_ids=ids, attention_mask=torch.ones_like(ids)).prediction_logits.sum().backward()
    layers, heads = model.model.config.num_hidden_layers, model.model.config.num_attention_heads
    assert calls.count((2, heads, 12, 12)) == layers  # the attention probabilities, B x H x T x T
    assert len(calls) == 1 + 3 * layers and bernoulli == []
    from transformers import AutoModel

    model.save_pretrained(tmp_path)
    assert wd.ATTENTION_FUNCTION not in (tmp_path / "config.json").read_text()
    assert AutoModel.from_pretrained(tmp_path).config._attn_implementation == "sdpa"


def test_the_hash_changes_exactly_for_the_families_whose_training_changed():
    """pcg16 hashes differently from pcg16_modules only for the functional-attention families;
    pcg16_modules (and DeBERTa's/ELMo's pcg16) hash as pcg16 did before (values of the code of
    2026-11-26, commit 9b6143e), bernoulli as always."""
    from workbench.config import load_train_config
    from workbench.dropout import FUNCTIONAL_ATTENTION_DROPOUT_FAMILIES
    from workbench.families import FAMILIES

    before = {"bert": "7a0bab7c085d7391", "roberta": "0e61e32b8dfdec85", "spanbert": "10627f02e98c737a",
              "albert": "bab8c2a2136c6a54", "electra": "33ce288e538ab317", "deberta": "46ddb459ed1801a1",
              "gpt": "3c213eaa04a63a08", "t5": "9d1dfb25bef6b74e", "bart": "3037df7268a68b0c",
              "elmo": "bdbc56a8ba2c4e73", "distilbert": "75818bcfdd52e087"}
    bernoulli = {"bert": "517573be1286762b", "deberta": "2c1ec105cc714028", "elmo": "8c8db8c567808752"}
    assert set(before) == set(FAMILIES)
    for name in FAMILIES:
        h = {m: load_train_config({"family": name, "steps": 3, "dropout_masks": m}).training_hash("cpu")
             for m in ("pcg16", "pcg16_modules", "bernoulli")}
        assert h["pcg16_modules"] == before[name]
        assert (h["pcg16"] != before[name]) == (name in FUNCTIONAL_ATTENTION_DROPOUT_FAMILIES), name
        assert len({h["pcg16_modules"], h["bernoulli"]}) == 2 and h["pcg16"] != h["bernoulli"]
        if name in bernoulli:
            assert h["bernoulli"] == bernoulli[name]


def test_a_run_folder_of_the_module_only_masks_is_refused_with_the_way_to_reuse_it(tmp_path):
    """A BERT folder trained with 2026-11-26's pcg16 (module masks only; its hash = today's
    `pcg16_modules`) is not resumed with today's pcg16: the error names `pcg16_modules`, which claims
    it. A DeBERTa folder of that day is claimed by today's pcg16 (its training did not change)."""
    import json

    from workbench.config import load_train_config
    from workbench.errors import ConfigError
    from workbench.loop import NO_HOOKS
    from workbench.drivers.train import Dist, claim_run_folder, dropout_record

    cpu = torch.device("cpu")
    old = load_train_config({"family": "bert", "steps": 3, "dropout_masks": "pcg16_modules"})
    (tmp_path / "run.json").write_text(json.dumps({"training_hash": old.training_hash("cpu"), "seed": 0}))
    with pytest.raises(ConfigError, match="pcg16 masks for the dropout modules only.*add `dropout_masks: pcg16_modules`"):
        claim_run_folder(load_train_config({"family": "bert", "steps": 3}), 0, tmp_path, Dist(), NO_HOOKS, cpu)
    claim_run_folder(old, 0, tmp_path, Dist(), NO_HOOKS, cpu)  # no error
    deberta = tmp_path / "deberta"
    deberta.mkdir()
    old = load_train_config({"family": "deberta", "steps": 3, "dropout_masks": "pcg16_modules"})
    (deberta / "run.json").write_text(json.dumps({"training_hash": old.training_hash("cpu"), "seed": 0}))
    claim_run_folder(load_train_config({"family": "deberta", "steps": 3}), 0, deberta, Dist(), NO_HOOKS, cpu)
    # what run.json and the manifests record
    record = lambda family, masks: dropout_record(load_train_config({"family": family, "steps": 3, "dropout_masks": masks}))  # noqa: E731
    assert record("bert", "pcg16") == {"setting": "pcg16", "modules": "pcg16", "attention_probabilities": "pcg16"}
    assert record("bert", "pcg16_modules")["attention_probabilities"] == "bernoulli"
    assert record("deberta", "pcg16_modules") == {"setting": "pcg16_modules", "modules": "pcg16",
                                                  "attention_probabilities": "pcg16"}
    assert record("gpt", "bernoulli") == {"setting": "bernoulli", "modules": "bernoulli", "attention_probabilities": "bernoulli"}
    assert record("elmo", "pcg16")["attention_probabilities"] == "none"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    claim_run_folder(load_train_config({"family": "t5", "steps": 3}), 0, fresh, Dist(), NO_HOOKS, cpu)
    assert json.loads((fresh / "run.json").read_text())["dropout_masks"] == record("t5", "pcg16")
