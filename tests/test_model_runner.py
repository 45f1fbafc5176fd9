"""The model runner (`workbench.running`): named activation points, the activation cache, edits.

The runner reads the residual stream and attention patterns from what transformers records in the
very forward it runs, so a cached value is compared with the model's own output for the same
input BIT FOR BIT (the same ops in the same order in one process: no tolerance is needed, and none
would hide a wrong layer index). Values the runner reads by hooks (`attn.z`, a pre-LN stack's last
block before its final norm) are checked against what they must give downstream: the final norm of
the last block's output is the stack's output, the heads' context vectors are the attention
pattern applied to the value vectors (float32 sums in another order: atol 1e-5 against values of
order 1), and an edit that zeroes `mlp_out` equals zeroing the MLP's last projection.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import TINY_BUILDERS
from workbench.errors import ConfigError
from workbench.running.models import ModelHandle
from workbench.running import ModelRunner

FAMILIES = ["bert", "gpt", "t5", "bart"]


@pytest.fixture(scope="module")
def models(tokenizers):
    out = {}
    for name in FAMILIES:
        m = TINY_BUILDERS[name](tokenizers[name])
        m.set_attn_implementation("eager")
        out[name] = m
    return out


def _ids(seed=0, B=3, T=9, V=900):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # one padded row
    return ids, mask


def _equal(a, b):
    return a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("name", FAMILIES)
def test_cached_layers_and_patterns_are_the_models_own(models, name):
    model = models[name]
    runner = ModelRunner(model)
    ids, mask = _ids()
    with torch.no_grad():
        if name in ("t5", "bart"):
            dec, dmask = ids[:, :6], mask[:, :6]
            # the whole model (head=True) against the whole model...
            _, cache = runner.run_with_cache(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dmask, head=True)
            ref = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dmask,
                        output_hidden_states=True, output_attentions=True)
            pairs = [("encoder", ref.encoder_hidden_states, ref.encoder_attentions),
                     ("decoder", ref.decoder_hidden_states, ref.decoder_attentions)]
            assert all(_equal(a, b) for a, b in zip(cache.patterns("decoder", cross=True), ref.cross_attentions))
            # ...and the bodies (the encoder, then the decoder reading it) against the bodies
            _, body = runner.run_with_cache(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dmask)
            enc = model.get_encoder()(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            de = model.get_decoder()(input_ids=dec, attention_mask=dmask, encoder_hidden_states=enc.last_hidden_state,
                                     encoder_attention_mask=mask, use_cache=False, output_hidden_states=True)
            assert all(_equal(a, b) for a, b in zip(body.layers("encoder"), enc.hidden_states))
            assert all(_equal(a, b) for a, b in zip(body.layers("decoder"), de.hidden_states))
        else:
            _, cache = runner.run_with_cache(ids, mask)
            ref = model.base_model(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
            pairs = [(runner.stacks[0].name, ref.hidden_states, ref.attentions)]
    for stack, hs, att in pairs:
        layers, patterns = cache.layers(stack), cache.patterns(stack)
        assert len(layers) == len(hs) == 3 and len(patterns) == len(att) == 2
        assert all(_equal(a, b) for a, b in zip(layers, hs)), f"{name} {stack}: layers differ"
        assert all(_equal(a, b) for a, b in zip(patterns, att)), f"{name} {stack}: patterns differ"


def test_hook_names_of_a_causal_lm(models):
    assert ModelRunner(models["gpt"]).hook_names() == [
        "embed",
        "blocks.0.resid_post", "blocks.0.attn.pattern", "blocks.0.attn.z", "blocks.0.mlp_out",
        "blocks.1.resid_post", "blocks.1.attn.pattern", "blocks.1.attn.z", "blocks.1.mlp_out",
        "final"]
    names = ModelRunner(models["t5"]).hook_names()
    assert names[0] == "encoder.embed" and names[-1] == "decoder.final"
    assert "decoder.blocks.1.cross_attn.pattern" in names and "encoder.blocks.0.attn.z" not in names


def test_last_block_of_a_pre_ln_stack_is_read_before_its_final_norm(models):
    """GPT-2: `blocks.{L-1}.resid_post` is the block's own output; `final` is ln_f of it."""
    model = models["gpt"]
    ids, mask = _ids()
    with torch.no_grad():
        _, cache = ModelRunner(model).run_with_cache(ids, mask, names=["blocks.1.resid_post", "final"])
        assert _equal(model.transformer.ln_f(cache["blocks.1.resid_post"]), cache["final"])
        assert not torch.allclose(cache["blocks.1.resid_post"], cache["final"], atol=1e-2)
    bert = ModelRunner(models["bert"])  # post-LN: no final norm, the last block IS the output
    with torch.no_grad():
        _, cache = bert.run_with_cache(ids, mask, names=["blocks.1.resid_post", "final"])
    assert _equal(cache["blocks.1.resid_post"], cache["final"])


def test_attn_z_is_the_pattern_applied_to_the_values(models):
    model = models["bert"]
    ids, mask = _ids()
    with torch.no_grad():
        _, cache = ModelRunner(model).run_with_cache(ids, mask, names=["blocks.1.attn.z", "blocks.1.attn.pattern",
                                                                       "blocks.0.resid_post"])
        self_att = model.bert.encoder.layer[1].attention.self
        v = self_att.value(cache["blocks.0.resid_post"])  # [B, T, H]
        B, T, H = v.shape
        v = v.view(B, T, 2, H // 2).transpose(1, 2)  # [B, heads, T, d]
        z = (cache["blocks.1.attn.pattern"] @ v).transpose(1, 2).reshape(B, T, H)
    torch.testing.assert_close(cache["blocks.1.attn.z"], z, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_an_edit_of_mlp_out_equals_zeroing_the_mlp(models, name):
    model = models[name]
    runner = ModelRunner(model)
    ids, mask = _ids(1)
    zeroed = copy.deepcopy(model)
    out = ModelRunner(zeroed).sites()[0].mlp_out
    with torch.no_grad():
        out.weight.zero_()
        out.bias.zero_()
        want = zeroed(input_ids=ids, attention_mask=mask).logits
        plain = model(input_ids=ids, attention_mask=mask).logits
        with runner.hooks({"blocks.0.mlp_out": lambda t: t * 0}):
            got = model(input_ids=ids, attention_mask=mask).logits
        after = model(input_ids=ids, attention_mask=mask).logits
    assert _equal(got, want)
    assert not torch.allclose(got, plain, atol=1e-3)  # the edit moved the output...
    assert _equal(after, plain)  # ...and is gone after the block


def test_an_edit_of_the_residual_stream_is_what_the_cache_and_the_next_block_see(models):
    model = models["gpt"]
    runner = ModelRunner(model)
    ids, mask = _ids(2)
    with torch.no_grad(), runner.hooks({"blocks.0.resid_post": lambda t: torch.zeros_like(t)}):
        _, cache = runner.run_with_cache(ids, mask, names=["blocks.0.resid_post", "blocks.1.resid_post"])
        block1 = model.transformer.h[1](torch.zeros_like(cache["blocks.1.resid_post"]), attention_mask=None)
    assert not cache["blocks.0.resid_post"].any()
    # every position reads zeros; its output does not depend on the (causal) mask then
    assert _equal(cache["blocks.1.resid_post"][0], (block1[0] if isinstance(block1, tuple) else block1)[0])


def test_bad_names_are_one_clear_error(models):
    runner = ModelRunner(models["gpt"])
    ids, mask = _ids()
    for bad, says in (("blocks.7.resid_post", "layers 0-1"), ("encoder.embed", "unknown activation point"),
                      ("blocks.0.mlp", "unknown activation point")):
        with pytest.raises(ConfigError, match=says):
            runner.run(ids, mask, names=[bad])
    with pytest.raises(ConfigError, match="cannot be edited"):
        with runner.hooks({"final": lambda t: t}):
            pass


def test_the_handle_runs_through_the_runner(models, tokenizers, monkeypatch):
    """`ModelHandle.forward` reads its states from the runner's cache: the model's own hidden states."""
    h = ModelHandle(models["bert"], tokenizers["bert"])
    calls = []
    run = h.runner.run
    monkeypatch.setattr(h.runner, "run", lambda *a, **k: calls.append(k["names"]) or run(*a, **k))
    out = h.forward([["The", "cat", "sat", "."]])
    assert calls == [["embed", "blocks.0.resid_post", "final"]]
    with torch.no_grad():
        ref = models["bert"].bert(input_ids=out.batch.input_ids, attention_mask=out.batch.attention_mask,
                                  output_hidden_states=True).hidden_states
    assert all(_equal(a, b) for a, b in zip(out.hidden_states["encoder"], ref))
