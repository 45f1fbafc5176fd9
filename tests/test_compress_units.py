"""The compression pieces one by one (workbench.compress.masks / unstructured / quantize / lowrank),
on tiny random models of several families, against hand and reference computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.compress.lowrank import (
    Factorized,
    equal_parameter_sparsity,
    factorize,
    lowrank_product,
    parameter_count,
    svd_factors,
)
from workbench.compress.masks import (
    apply_masks,
    keep_masked,
    load_masks,
    mask_hash,
    mask_sparsity,
    save_masks,
    sparsity,
)
from workbench.compress.quantize import fake_quantize, int8_dynamic, quantize_weight
from workbench.compress.unstructured import (
    dense_layers,
    imp_schedule,
    layerwise_magnitude_masks,
    magnitude_masks,
    prunable_weights,
    random_masks,
)
from workbench.errors import CheckpointError, ConfigError


def _bert_classifier(seed=0, hidden=32, layers=2):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(vocab_size=120, hidden_size=hidden, num_hidden_layers=layers,
                                                    num_attention_heads=2, intermediate_size=2 * hidden)).eval()


def _gpt2(seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=120, n_embd=32, n_layer=2, n_head=2, n_positions=64)).eval()


def _llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2)).eval()


# ------------------------------------------------------------------------------ the prunable set

def test_prunable_set_is_found_by_structure_in_three_families():
    bert = prunable_weights(_bert_classifier())
    # the block matrices and, as in Chen et al.'s pruning_model, BERT's pooler
    assert bert == [f"bert.encoder.layer.{i}.{m}.weight" for i in range(2) for m in (
        "attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
        "intermediate.dense", "output.dense")] + ["bert.pooler.dense.weight"]
    assert prunable_weights(_bert_classifier(), include_pooler=False) == bert[:-1]
    gpt = prunable_weights(_gpt2())  # Conv1D: c_attn (Q, K, V in one), c_proj, mlp.c_fc, mlp.c_proj; no pooler
    assert gpt == [f"transformer.h.{i}.{m}.weight" for i in range(2) for m in (
        "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    llama = prunable_weights(_llama())
    assert len(llama) == 2 * 7 and all(".self_attn." in n or ".mlp." in n for n in llama)
    # embeddings and the task head only when asked
    with_all = prunable_weights(_bert_classifier(), include_embeddings=True, include_head=True)
    assert set(with_all) - set(bert) == {"bert.embeddings.word_embeddings.weight", "classifier.weight"}


def test_the_pooler_is_ranked_in_the_same_global_magnitude_pruning():
    """Chen et al. (2020) prune `bert.pooler.dense` with the 72 block matrices in one global L1
    ranking: a pooler of planted tiny weights goes first, entirely, before any block weight."""
    model = _bert_classifier()
    with torch.no_grad():
        model.bert.pooler.dense.weight.mul_(1e-9)
    names = prunable_weights(model)
    params = dict(model.named_parameters())
    pooler = params["bert.pooler.dense.weight"].numel()
    masks = magnitude_masks(model, names, pooler / sum(params[n].numel() for n in names))
    assert not masks["bert.pooler.dense.weight"].any()
    assert all(bool(masks[n].all()) for n in names if n != "bert.pooler.dense.weight")


def test_pretraining_masks_of_the_pooler_transfer_to_the_classifier():
    """imp_mlm: masks found on the pretraining module (`model.bert.pooler.dense.weight`) land on
    the classifier's pooler (`bert.pooler.dense.weight`) like the block matrices do."""
    from transformers import BertConfig, BertForPreTraining

    from workbench.drivers.pretraining_ticket import transfer_masks
    from workbench.families.bert import BertPretrainer

    torch.manual_seed(0)
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64)
    source, target = BertPretrainer(BertForPreTraining(config)), _bert_classifier()
    masks = magnitude_masks(source, list(dense_layers(source, include_pooler=True)), 0.4)
    moved = transfer_masks(masks, source, target)
    assert set(moved) == set(prunable_weights(target))
    assert torch.equal(moved["bert.pooler.dense.weight"], masks["model.bert.pooler.dense.weight"])
    assert torch.equal(moved["bert.encoder.layer.1.output.dense.weight"],
                       masks["model.bert.encoder.layer.1.output.dense.weight"])


def test_a_pooler_the_pretraining_module_lacks_stays_dense_in_the_ticket():
    """SpanBERT pretrains a BertForMaskedLM (no pooler): the classifier's pooler is a fresh layer,
    not pretrained, so the masked-LM ticket keeps it whole (a mask of ones) and prunes the blocks."""
    from transformers import BertConfig, BertForMaskedLM

    from workbench.drivers.prune_sweep import ticket_masks

    torch.manual_seed(0)
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64)
    source, target = torch.nn.ModuleDict({"model": BertForMaskedLM(config)}), _bert_classifier()
    masks = magnitude_masks(source, list(dense_layers(source, include_pooler=True)), 0.4)
    assert not any("pooler" in n for n in masks)
    names = prunable_weights(target)
    out = ticket_masks(masks, source, target, names)
    assert set(out) == set(names) and bool(out["bert.pooler.dense.weight"].all())
    assert mask_sparsity({n: m for n, m in out.items() if "pooler" not in n}) == pytest.approx(0.4, abs=1e-4)


# ------------------------------------------------------------------------------------ masks

def test_magnitude_masks_prune_exactly_the_smallest_weights_globally():
    model = _bert_classifier()
    names = prunable_weights(model)
    params = dict(model.named_parameters())
    allw = np.concatenate([params[n].detach().abs().reshape(-1).numpy() for n in names])
    masks = magnitude_masks(model, names, 0.37)
    k = round(0.37 * allw.size)
    pruned = np.concatenate([(~masks[n]).reshape(-1).numpy() for n in names])
    assert pruned.sum() == k
    threshold = np.sort(allw)[k - 1]
    assert allw[pruned].max() <= threshold <= allw[~pruned].min()
    # global, not per layer: the layers lose different fractions
    per_layer = [float((~masks[n]).float().mean()) for n in names]
    assert max(per_layer) - min(per_layer) > 0.01


def test_imp_masks_nest_and_reach_exactly_k_tenths_of_the_original_weights():
    model = _bert_classifier()
    names = prunable_weights(model)
    total = sum(dict(model.named_parameters())[n].numel() for n in names)
    current = None
    for k, amount in enumerate(imp_schedule(0.9), start=1):
        # the weights move between rounds (training): here a random perturbation
        with torch.no_grad():
            for n in names:
                dict(model.named_parameters())[n].add_(0.01 * torch.randn_like(dict(model.named_parameters())[n]))
        masks = magnitude_masks(model, names, amount, current)
        apply_masks(model, masks)
        assert sum(int((~m).sum()) for m in masks.values()) == round(0.1 * k * total)
        assert sparsity(model, names) == pytest.approx(round(0.1 * k * total) / total, abs=0)
        if current is not None:
            assert all(bool((masks[n] <= current[n]).all()) for n in names)
        current = masks
    assert imp_schedule(0.9) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    with pytest.raises(ConfigError, match="not a multiple"):
        imp_schedule(0.25)


def test_random_masks_are_exact_seeded_and_uniform():
    model = _bert_classifier()
    names = prunable_weights(model)
    a, b, c = (random_masks(model, names, 0.5, seed) for seed in (1, 1, 2))
    assert mask_hash(a) == mask_hash(b) != mask_hash(c)
    assert mask_sparsity(a) == pytest.approx(0.5, abs=1e-6)
    per_matrix = [float((~m).float().mean()) for m in a.values()]
    assert all(0.4 < f < 0.6 for f in per_matrix)


def test_masks_round_trip_through_safetensors_and_the_hook_keeps_them(tmp_path):
    model = _bert_classifier()
    names = prunable_weights(model)
    masks = magnitude_masks(model, names, 0.6)
    save_masks(tmp_path, masks)
    back = load_masks(tmp_path)
    assert mask_hash(back) == mask_hash(masks) and set(back) == set(masks)
    # a training step moves zeroed weights; the hook zeroes them again, the kept ones keep the step
    apply_masks(model, masks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    hook = keep_masked(masks)
    model.train()
    for step in range(3):
        out = model(input_ids=torch.randint(0, 120, (4, 9)), labels=torch.tensor([0, 1, 0, 1]))
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        moved = sum(int((dict(model.named_parameters())[n][~m] != 0).sum()) for n, m in masks.items())
        assert moved > 0  # AdamW did move the pruned weights ...
        hook(model, step + 1)
        assert sparsity(model, names) == pytest.approx(mask_sparsity(masks), abs=0)  # ... and they are zero again
    with pytest.raises(CheckpointError, match="no masks file"):
        load_masks(tmp_path / "nowhere")


def test_clipping_sees_only_the_live_weights_gradients():
    """The backward pass gives pruned weights gradients too; `masked_training`'s before-step hook
    zeroes them before `clip_grad_norm_`, so the clipping norm is the live weights' (Chen et al.'s
    torch.nn.utils.prune reparametrisation masks those gradients) and every live gradient is scaled
    by clip / (live norm), not by clip / (norm with the pruned ones)."""
    from workbench.compress.masks import masked_training
    from workbench.loop import optimizer_step

    model = _bert_classifier().train()
    torch.manual_seed(1)
    names = prunable_weights(model)
    masks = random_masks(model, names, 0.9, seed=3)  # 90% pruned: most of the gradient is on pruned weights
    apply_masks(model, masks)
    out = model(input_ids=torch.randint(0, 120, (4, 9)), labels=torch.tensor([0, 1, 0, 1]))
    out.loss.backward()
    params = dict(model.named_parameters())
    raw = {n: p.grad.detach().clone() for n, p in params.items()}
    live = {n: torch.where(masks[n], g, torch.zeros_like(g)) if n in masks else g for n, g in raw.items()}
    norm = lambda grads: float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values())))  # noqa: E731
    live_norm, raw_norm = norm(live), norm(raw)
    assert raw_norm > 1.2 * live_norm  # the planted difference the old clipping made
    clip = live_norm / 2  # clipping active

    class Spy:  # an optimizer that records the gradients it is given
        param_groups = [{"lr": 1.0}]
        seen: dict = {}

        def step(self):
            self.seen = {n: p.grad.detach().clone() for n, p in params.items()}

        def zero_grad(self, set_to_none=True):
            model.zero_grad(set_to_none=set_to_none)

    spy = Spy()
    optimizer_step(model, spy, None, clip, masked_training(masks), 1)
    # float32 sums over ~10^4 squares: relative error far below 1e-4
    assert norm(spy.seen) == pytest.approx(clip, rel=1e-4)
    for n, g in spy.seen.items():
        if n in masks:
            assert bool((g[~masks[n]] == 0).all()), n
        assert torch.allclose(g, live[n] * (clip / live_norm), rtol=1e-4, atol=1e-10), n
    assert sparsity(model, names) == pytest.approx(mask_sparsity(masks), abs=0)  # the after-step hook ran too


# ------------------------------------------------------------------------------- quantization

@pytest.mark.parametrize("bits", [8, 4, 3, 2, 1])
def test_k_bit_weights_take_at_most_2_to_the_k_values_per_channel(bits):
    model = fake_quantize(_bert_classifier(), bits)
    reference = _bert_classifier()
    for name, module in dense_layers(model).items():
        w = module.weight.detach()
        for row in w:
            assert len(torch.unique(row)) <= 2 ** bits
        if bits == 1:  # sign times the row's mean |w|
            w0 = dict(reference.named_parameters())[name].detach()
            scale = w0.abs().mean(1, keepdim=True)
            assert torch.allclose(w, torch.where(w0 >= 0, scale, -scale))


def test_quantization_error_shrinks_with_bits_and_8_bits_matches_a_hand_computation():
    w = torch.tensor([[0.5, -1.0, 0.25, 0.1], [2.0, 0.0, -0.3, 1.1]])
    q8 = quantize_weight(w, 8)
    s = torch.tensor([[1.0 / 127], [2.0 / 127]])
    assert torch.allclose(q8, torch.round(w / s) * s)
    q2 = quantize_weight(w, 2)  # levels -s, 0, s with s = max|row|; 0.5 / 1.0 rounds half to even: 0
    assert torch.allclose(q2, torch.tensor([[0.0, -1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 2.0]]))
    big = torch.randn(64, 128)
    errors = [float((quantize_weight(big, b) - big).pow(2).mean()) for b in (2, 3, 4, 8)]
    assert errors == sorted(errors, reverse=True)
    # the 1-bit scale (mean |w|) is the least-squares one for a sign code; the max-scaled 2-bit grid
    # rounds most Gaussian weights to 0, so it is further from the weights than 1 bit
    e1 = float((quantize_weight(big, 1) - big).pow(2).mean())
    assert e1 < errors[0]
    with pytest.raises(ConfigError, match="bits must be an integer"):
        quantize_weight(big, 0)


def test_q8bert_scheme_is_one_scale_per_tensor_over_embeddings_and_every_dense_layer():
    """Q8BERT (Zafrir et al. 2019): symmetric linear quantization with one scale per tensor,
    s = max|W| / (2^(k-1) - 1), of every Embedding and fully connected layer (word, position and
    token-type embeddings, the blocks, the pooler, the classifier), against a hand computation."""
    from workbench.compress.quantize import q8bert_layers, quantized_layers

    reference = _bert_classifier()
    model = fake_quantize(_bert_classifier(), 4, scheme="q8bert")
    names = set(q8bert_layers(reference))
    assert {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
            "bert.embeddings.token_type_embeddings.weight", "bert.pooler.dense.weight",
            "classifier.weight"} | set(prunable_weights(reference)) == names
    got, ref = dict(model.named_parameters()), dict(reference.named_parameters())
    for n in names:
        w0 = ref[n].detach()
        s = w0.abs().max() / 7
        assert torch.allclose(got[n], torch.clamp(torch.round(w0 / s), -7, 7) * s, atol=1e-7), n
        assert len(torch.unique(got[n])) <= 15
    assert torch.equal(got["bert.embeddings.LayerNorm.weight"], ref["bert.embeddings.LayerNorm.weight"])
    # the per-channel default: a row of small weights keeps its own step; one step per tensor
    # (the largest weight's) rounds that row to zero
    w = torch.tensor([[1.0, -0.5, 0.25], [0.004, -0.002, 0.003]])
    assert bool((quantize_weight(w, 4, per_channel=False)[1] == 0).all())
    assert bool((quantize_weight(w, 4)[1] != 0).all())
    assert set(quantized_layers(reference)) == set(dense_layers(reference))
    with pytest.raises(ConfigError, match="quantization scheme must be one of per_channel, q8bert, got 'q8bit'"):
        fake_quantize(_bert_classifier(), 8, scheme="q8bit")


def test_int8_dynamic_runs_close_to_fp32_and_is_smaller():
    from workbench.compress.quantize import state_size_bytes

    model = _bert_classifier(hidden=64)
    q = int8_dynamic(model)
    ids = torch.randint(0, 120, (3, 12))
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, q(input_ids=ids).logits
    assert torch.allclose(a, b, atol=0.05)
    assert state_size_bytes(q) < 0.6 * state_size_bytes(model)


# ---------------------------------------------------------------------------------- low rank

def test_svd_at_full_rank_reproduces_the_layer_and_rank_r_is_best():
    torch.manual_seed(0)
    w = torch.randn(24, 40)
    a, b = svd_factors(w, 24)
    assert torch.allclose(a @ b, w, atol=1e-5)
    a4, b4 = svd_factors(w, 4)
    assert torch.linalg.matrix_rank(a4 @ b4) == 4
    s = torch.linalg.svdvals(w.double())
    assert float((w - a4 @ b4).pow(2).sum()) == pytest.approx(float(s[4:].pow(2).sum()), rel=1e-5)  # Eckart-Young
    model = _bert_classifier()
    ids = torch.randint(0, 120, (2, 7))
    full = lowrank_product(_bert_classifier(), 32)  # 32 = the smaller side of every matrix: unchanged
    with torch.no_grad():
        assert torch.equal(full(input_ids=ids).logits, model(input_ids=ids).logits)


def test_factorized_layers_compute_the_rank_r_product_with_fewer_parameters():
    ids = torch.randint(0, 120, (2, 7))
    product = lowrank_product(_bert_classifier(hidden=64), 8)
    split = factorize(_bert_classifier(hidden=64), 8)
    assert sum(isinstance(m, Factorized) for m in split.modules()) == 12
    with torch.no_grad():
        assert torch.allclose(product(input_ids=ids).logits, split(input_ids=ids).logits, atol=1e-5)
    saved = parameter_count(_bert_classifier(hidden=64)) - parameter_count(split)
    # per block: 4 matrices 64x64 (4096 -> 8*128) and 2 of 64x128 (8192 -> 8*192)
    assert saved == 2 * (4 * (4096 - 1024) + 2 * (8192 - 1536))
    assert equal_parameter_sparsity((64, 128), 8) == pytest.approx(1 - 1536 / 8192)


def test_layerwise_masks_prune_each_matrix_to_its_own_fraction():
    model = _bert_classifier()
    names = prunable_weights(model)
    amounts = {n: 0.1 * (i % 5) for i, n in enumerate(names)}
    masks = layerwise_magnitude_masks(model, amounts)
    params = dict(model.named_parameters())
    for n in names:
        assert int((~masks[n]).sum()) == round(amounts[n] * params[n].numel())


def test_ties_at_the_threshold_are_pruned_by_position_to_the_exact_count():
    model = torch.nn.ParameterDict({"w": torch.nn.Parameter(torch.tensor([[0.5, 0.1, 0.1], [0.1, 0.9, 0.1]]))})
    masks = magnitude_masks(model, ["w"], 0.5)  # 3 of 6: the four 0.1s tie, the first three by position go
    assert masks["w"].tolist() == [[True, False, False], [False, True, True]]
