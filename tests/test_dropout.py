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

    from workbench.config import load_config
    from workbench.errors import ConfigError
    from workbench.train import build_model

    family = SimpleNamespace(model_config=lambda preset, model: {},
                             build_model=lambda cfg, tok: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1),
                                                                        nn.Sequential(nn.Dropout(0.2))))
    base = {"family": "deberta", "preset": "tiny", "steps": 3}
    fast, plain = load_config(base), load_config({**base, "dropout_masks": "bernoulli"})
    model = build_model(fast, family, None, 0, torch.device("cpu"))
    assert [(type(m), m.p) for m in model.modules() if isinstance(m, nn.Dropout)] == [(FastDropout, 0.1), (FastDropout, 0.2)]
    model = build_model(plain, family, None, 0, torch.device("cpu"))
    assert [type(m) for m in model.modules() if isinstance(m, nn.Dropout)] == [nn.Dropout, nn.Dropout]
    assert fast.dropout_masks == "pcg16" and fast.training_hash() != plain.training_hash()
    with pytest.raises(ConfigError, match="dropout_masks: must be pcg16 or bernoulli, got 'philox'"):
        load_config({**base, "dropout_masks": "philox"})


def test_a_run_folder_of_the_old_masks_is_refused_with_the_way_to_reuse_it(tmp_path):
    """A folder trained before `dropout_masks` existed (its run.json hash = today's `bernoulli` hash)
    is not resumed with pcg16 masks: the error names the key that reuses it; with the key it is
    claimed as before."""
    import json

    from workbench.config import load_config
    from workbench.errors import ConfigError
    from workbench.loop import NO_HOOKS
    from workbench.train import Dist, claim_run_folder

    base = {"family": "gpt", "steps": 3}
    old = load_config({**base, "dropout_masks": "bernoulli"})
    (tmp_path / "run.json").write_text(json.dumps({"training_hash": old.training_hash("cpu"), "seed": 0}))
    with pytest.raises(ConfigError, match="bernoulli dropout masks.*add `dropout_masks: bernoulli`"):
        claim_run_folder(load_config(base), 0, tmp_path, Dist(), NO_HOOKS, torch.device("cpu"))
    claim_run_folder(old, 0, tmp_path, Dist(), NO_HOOKS, torch.device("cpu"))  # no error
    other = load_config({**base, "lr": 1e-2})
    with pytest.raises(ConfigError, match="holds a run of a different config"):
        claim_run_folder(other, 0, tmp_path, Dist(), NO_HOOKS, torch.device("cpu"))
