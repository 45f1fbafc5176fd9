"""Head and MLP pruning (workbench.drivers.head_pruning): gates, masks as weights, slicing, gradient
importance and the iterative procedure, on tiny random models of every family it supports.

transformers 5 ignores `head_mask`, so every masking test also checks that the outputs move."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import (AlbertConfig, AlbertForSequenceClassification, AutoModelForSequenceClassification,
                          BertConfig, BertForSequenceClassification, DebertaV2Config,
                          DebertaV2ForSequenceClassification, GPT2Config, GPT2ForSequenceClassification,
                          LlamaConfig, LlamaForSequenceClassification)

from workbench.drivers import head_pruning as H
from workbench.errors import ConfigError, WorkbenchError

L, NH, HID = 2, 4, 32  # layers, heads, hidden (head_dim 8)


def tiny_classifier(family: str, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=60, num_labels=2, pad_token_id=0)
    if family == "bert":
        cfg = BertConfig(hidden_size=HID, num_hidden_layers=L, num_attention_heads=NH, intermediate_size=64,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common)
        model = BertForSequenceClassification(cfg)
    elif family == "deberta":
        cfg = DebertaV2Config(hidden_size=HID, num_hidden_layers=L, num_attention_heads=NH, intermediate_size=64,
                              relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8,
                              position_biased_input=False, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                              **common)
        model = DebertaV2ForSequenceClassification(cfg)
    elif family == "gpt2":
        cfg = GPT2Config(n_embd=HID, n_layer=L, n_head=NH, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=1, eos_token_id=1, **common)
        model = GPT2ForSequenceClassification(cfg)
    elif family == "llama":  # grouped K/V: 4 query heads over 2 K/V heads, as SmolLM2's 9 over 3
        cfg = LlamaConfig(hidden_size=HID, num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=2,
                          intermediate_size=64, bos_token_id=1, eos_token_id=1, **common)
        model = LlamaForSequenceClassification(cfg)
    else:
        raise ValueError(family)
    # larger weights than the default init so that every head matters visibly in the outputs
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name and "wte" not in name and "wpe" not in name:
                p.normal_(0, 0.3)
    return model.eval()


FAMILIES = ("bert", "deberta", "gpt2", "llama")


def tiny_batch(seed: int = 0, B: int = 3, T: int = 9):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 60, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, -3:] = 0  # one padded row
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1])[:B]}


def head_logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def _reference_zeroed_context(model, layer: int, head: int):
    """The hand reference: a forward pre-hook on the layer's attention output projection that
    zeroes head `head`'s slice of the context vector, written here without the module's code."""
    site = H.attention_sites(model)[layer]
    d = site.head_dim

    def zero(module, args):
        x = args[0].clone()
        x[..., head * d:(head + 1) * d] = 0
        return (x, *args[1:])

    return site.out_proj.register_forward_pre_hook(zero)


@pytest.mark.parametrize("family", FAMILIES)
def test_masking_one_head_equals_zeroing_its_context_vector(family):
    model, batch = tiny_classifier(family), tiny_batch()
    full = head_logits(model, batch)
    handle = _reference_zeroed_context(model, layer=1, head=2)
    reference = head_logits(model, batch)
    handle.remove()
    assert not torch.allclose(full, reference, atol=1e-4), "zeroing a head must change the outputs"

    kept = np.ones((L, NH), bool)
    kept[1, 2] = False
    masked = H.apply_mask(copy.deepcopy(model), kept)
    torch.testing.assert_close(head_logits(masked, batch), reference, atol=1e-6, rtol=0)
    with H.gates(model, torch.tensor(kept, dtype=torch.float32)):
        torch.testing.assert_close(head_logits(model, batch), reference, atol=1e-6, rtol=0)
    # the gates are gone after the block, the model untouched
    torch.testing.assert_close(head_logits(model, batch), full, atol=0, rtol=0)


def test_masking_every_head_of_a_layer_leaves_only_the_residual_path():
    """BERT's attention block is LayerNorm(W_O ctx + b_O + x): with every head of layer 0 masked
    its output must be LayerNorm(x + b_O), computed here by hand from the captured input x."""
    model, batch = tiny_classifier("bert"), tiny_batch()
    kept = np.ones((L, NH), bool)
    kept[0] = False
    masked = H.apply_mask(copy.deepcopy(model), kept)
    block = masked.bert.encoder.layer[0].attention
    seen = {}
    h = block.register_forward_hook(lambda m, args, out: seen.update(x=args[0].detach(), y=out[0].detach()
                                                                      if isinstance(out, tuple) else out.detach()))
    head_logits(masked, batch)
    h.remove()
    ln = block.output.LayerNorm
    z = seen["x"] + block.output.dense.bias
    mean = z.mean(-1, keepdim=True)
    var = ((z - mean) ** 2).mean(-1, keepdim=True)
    expected = (z - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias
    torch.testing.assert_close(seen["y"], expected, atol=1e-5, rtol=0)
    assert not torch.allclose(head_logits(model, batch), head_logits(masked, batch), atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_slicing_gives_the_masked_outputs_with_fewer_parameters(family):
    model, batch = tiny_classifier(family), tiny_batch()
    kept = np.ones((L, NH), bool)
    kept[0, [0, 3]] = False   # half a layer: for Llama one of each K/V group
    kept[1] = False           # a whole layer
    mlps = np.array([True, False])
    masked = H.apply_mask(copy.deepcopy(model), kept, mlps)
    sliced = H.slice_heads(copy.deepcopy(model), kept, mlps)
    assert not torch.allclose(head_logits(model, batch), head_logits(masked, batch), atol=1e-4)
    torch.testing.assert_close(head_logits(sliced, batch), head_logits(masked, batch), atol=1e-5, rtol=0)
    assert H.parameter_count(sliced) < H.parameter_count(masked)
    site = H.attention_sites(sliced)[0]
    assert site.num_heads == 2


def test_mlp_gate_zero_equals_removing_the_mlp_output():
    model, batch = tiny_classifier("bert"), tiny_batch()
    out = model.bert.encoder.layer[1].output.dense
    h = out.register_forward_hook(lambda m, a, o: torch.zeros_like(o))
    reference = head_logits(model, batch)
    h.remove()
    masked = H.apply_mask(copy.deepcopy(model), np.ones((L, NH), bool), [True, False])
    torch.testing.assert_close(head_logits(masked, batch), reference, atol=1e-6, rtol=0)
    assert not torch.allclose(head_logits(model, batch), reference, atol=1e-4)


@pytest.mark.parametrize("family", ("bert", "gpt2"))
def test_gradient_importance_matches_a_finite_difference(family):
    """raw_heads = |dL/dxi_h| / tokens for one batch; checked against a central difference of the
    loss in each gate (float64), and likewise for the MLP gates."""
    model, batch = tiny_classifier(family).double(), tiny_batch()
    imp = H.head_importance(model, [batch])
    tokens = int(batch["attention_mask"].sum())
    assert imp.tokens == tokens

    def loss_at(head_gates, mlp_gates):
        with torch.no_grad(), H.gates(model, head_gates, mlp_gates):
            return float(model(**batch).loss)

    eps = 1e-5
    ones_h, ones_m = torch.ones(L, NH, dtype=torch.float64), torch.ones(L, dtype=torch.float64)
    fd = np.zeros((L, NH))
    for i in range(L):
        for j in range(NH):
            e = torch.zeros(L, NH, dtype=torch.float64)
            e[i, j] = eps
            fd[i, j] = (loss_at(ones_h + e, ones_m) - loss_at(ones_h - e, ones_m)) / (2 * eps)
    np.testing.assert_allclose(imp.raw_heads, np.abs(fd) / tokens, rtol=1e-5, atol=1e-12)
    fd_m = np.zeros(L)
    for i in range(L):
        e = torch.zeros(L, dtype=torch.float64)
        e[i] = eps
        fd_m[i] = (loss_at(ones_h, ones_m + e) - loss_at(ones_h, ones_m - e)) / (2 * eps)
    np.testing.assert_allclose(imp.raw_mlps, np.abs(fd_m) / tokens, rtol=1e-5, atol=1e-12)
    assert imp.raw_heads.std() > 0  # heads differ: the ranking means something


def test_importance_normalisation_is_per_layer_l2_then_global_min_max():
    raw = np.array([[3.0, 4.0, 0.0], [1.0, 1.0, 1.0]])
    by_layer = np.array([[0.6, 0.8, 0.0], [1 / np.sqrt(3)] * 3])
    expected = (by_layer - by_layer.min()) / (by_layer.max() - by_layer.min())
    np.testing.assert_allclose(H.normalise_importance(raw), expected)


def test_importance_sums_batches_and_does_not_touch_the_model():
    model = tiny_classifier("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    b1, b2 = tiny_batch(1), tiny_batch(2)
    one = H.head_importance(model, [b1])
    two = H.head_importance(model, [b2])
    both = H.head_importance(model, [b1, b2])
    expected = (one.raw_heads * one.tokens + two.raw_heads * two.tokens) / (one.tokens + two.tokens)
    np.testing.assert_allclose(both.raw_heads, expected, rtol=1e-10)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_a_head_index_out_of_range_is_one_clear_error():
    model = tiny_classifier("bert")
    with pytest.raises(ConfigError, match=r"head \(1, 4\) is out of range: the model has layers 0-1 and heads 0-3"):
        H.mask_from_removed(model, [(0, 1), (1, 4)])
    with pytest.raises(ConfigError, match=r"head \(2, 0\) is out of range"):
        H.mask_from_removed(model, [(2, 0)])
    with pytest.raises(ConfigError, match="heads_kept has shape"):
        H.apply_mask(model, np.ones((L, NH + 1), bool))
    kept = H.mask_from_removed(model, [(0, 1), (1, 3)])
    assert kept.sum() == L * NH - 2 and not kept[0, 1] and not kept[1, 3]


def test_albert_is_refused_with_the_reason():
    cfg = AlbertConfig(vocab_size=60, embedding_size=16, hidden_size=HID, num_hidden_layers=2, num_attention_heads=NH,
                       intermediate_size=64)
    with pytest.raises(WorkbenchError, match="ALBERT shares one layer's weights"):
        H.attention_sites(AlbertForSequenceClassification(cfg))


def test_the_mask_keeper_holds_the_mask_through_training():
    """AdamW with weight decay moves every weight with a gradient; the after-step hook re-zeroes
    the removed heads' columns, so the trained model still equals its gate-masked self."""
    model, batch = tiny_classifier("bert"), tiny_batch()
    kept = np.ones((L, NH), bool)
    kept[0, 1] = kept[1, 0] = False
    H.apply_mask(model, kept)
    keep = H.mask_keeper(kept)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    model.train()
    for step in range(3):
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()
        keep(model, step + 1)
    model.eval()
    cols = model.bert.encoder.layer[0].attention.output.dense.weight[:, 8:16]
    assert torch.count_nonzero(cols) == 0
    with H.gates(model, torch.tensor(kept, dtype=torch.float32)):
        gated = head_logits(model, batch)
    torch.testing.assert_close(head_logits(model, batch), gated, atol=1e-6, rtol=0)


def test_masked_handle_is_a_derived_checkpoint_that_opens_in_plain_transformers(tiny_checkpoint, tmp_path):
    from workbench.running.models import ModelHandle

    parent = ModelHandle.load(tiny_checkpoint)
    Lp, Hp = H.head_shape(parent.model)
    kept = np.ones((Lp, Hp), bool)
    kept[0, 1] = False
    derived = H.masked_handle(parent, kept, method="heads", order="good", seed=0)
    assert derived.checkpoint_hash != parent.checkpoint_hash
    assert derived.lineage.transform == "head_mask"
    assert derived.lineage.params["heads_kept"] == kept.tolist()
    assert derived.lineage.params["n_heads_kept"] == Lp * Hp - 1
    sentences = [["the", "cat", "sat", "down"], ["a", "dog"]]
    a = [np.array(s) for s in derived.word_states(sentences)]
    b = [np.array(s) for s in parent.word_states(sentences)]
    assert not np.allclose(a[0], b[0], atol=1e-5)
    folder = derived.save(tmp_path / "masked")
    reopened = ModelHandle.load(folder)
    c = [np.array(s) for s in reopened.word_states(sentences)]
    np.testing.assert_allclose(c[0], a[0], atol=1e-5)
    manifest = reopened.manifest["derived_from"]
    assert manifest["params"]["heads_kept"] == kept.tolist() and manifest["parent_sha256"] == parent.checkpoint_hash
    # a task model built on the masked body still holds the zeros
    clf = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
    d = clf.config.hidden_size // clf.config.num_attention_heads
    w = clf.bert.encoder.layer[0].attention.output.dense.weight
    assert torch.count_nonzero(w[:, d:2 * d]) == 0 and torch.count_nonzero(w[:, :d]) > 0


# ---------------------------------------------------------------------------- iterative procedure


def test_heads_to_remove_is_ten_percent_of_the_total_or_of_the_remaining_at_least_one():
    assert [H.heads_to_remove(n, 0.1, total=144) for n in (144, 130, 18, 4, 1)] == [14, 14, 14, 4, 1]
    assert [H.heads_to_remove(n, 0.1) for n in (72, 65, 19, 10, 9, 1)] == [7, 6, 1, 1, 1, 1]
    assert H.heads_to_remove(100, 0.29, total=100) == 29  # 0.29 x 100 is 28.999999999999996 in floats


def test_the_schedule_removes_ten_percent_of_all_heads_per_step_as_in_the_papers_code():
    """Michel et al.'s run_bertology and Prasanna et al.'s code: int(0.1 x 144) = 14 heads of
    BERT-base's 12 x 12 per step, 14, 28, 42, ...; `step_of="remaining"` is the earlier variant,
    10% of the heads still present (14, 27, 38, 48, 57, ...)."""
    value, metric = _planted(shape=(12, 12))
    for order in H.ORDERS:
        curve = H.iterative_pruning(value.shape, metric, lambda k: value, order=order, run_to_end=True)
        assert [s.n_removed for s in curve.steps] == [0, 14, 28, 42, 56, 70, 84, 98, 112, 126, 140, 144]
    remaining = H.iterative_pruning(value.shape, metric, lambda k: value, order="good", run_to_end=True,
                                    step_of="remaining")
    assert [s.n_removed for s in remaining.steps][:8] == [0, 14, 27, 38, 48, 57, 65, 72]
    assert remaining.steps[-1].n_removed == 144
    # the settings carry it to the sweep and the script: total unless told
    assert H.HeadPruningSettings().step_of == "total"
    assert H.load_settings({"step_of": "remaining"}, "x.yaml").step_of == "remaining"
    # MLPs with units "both": 10% of 12 layers is one MLP per step, alongside 14 heads
    both = H.iterative_pruning(value.shape, lambda k, m: metric(k), lambda k, m: (value, value.sum(1)), order="good",
                               units="both", run_to_end=True)
    assert [s.n_removed for s in both.steps][:3] == [0, 14, 28] and [s.n_mlps_removed for s in both.steps][:3] == [0, 1, 2]


def _planted(shape=(3, 10), seed=0):
    """A planted task: each head carries a value; the metric is the share of value kept."""
    value = np.random.default_rng(seed).gamma(0.5, size=shape)

    def metric(kept):
        return float((value * kept).sum() / value.sum())

    return value, metric


def test_good_order_prunes_least_important_first_and_stops_below_the_threshold():
    value, metric = _planted()
    calls = []

    def importance(kept):
        calls.append(kept.copy())
        return value

    curve = H.iterative_pruning(value.shape, metric, importance, order="good", threshold=0.9)
    # the schedule: 30 heads, 10% of all of them per step
    removed = [s.n_removed for s in curve.steps]
    assert removed[:4] == [0, 3, 6, 9]
    # each step removed exactly the least valuable heads still present
    order = np.argsort(value.reshape(-1), kind="stable")
    for s in curve.steps:
        gone = np.flatnonzero(~s.heads_kept.reshape(-1))
        assert set(gone) == set(order[: s.n_removed])
    # it stopped at the first step under 90% and reports the step before it
    assert curve.steps[-1].metric < 0.9 and all(s.metric >= 0.9 for s in curve.steps[:-1])
    assert curve.threshold_step == len(curve.steps) - 2
    assert curve.prunable == curve.steps[-2].n_removed
    # importance was recomputed on the masked model at every step
    assert len(calls) == len(curve.steps) - 1 and calls[1].sum() == 27


def test_bad_and_random_orders_prune_fewer_heads_than_good_on_a_planted_task():
    value, metric = _planted()
    curves = {o: H.iterative_pruning(value.shape, metric, lambda k: value, order=o, seed=3, run_to_end=True)
              for o in H.ORDERS}
    assert curves["good"].prunable > curves["random"].prunable > curves["bad"].prunable
    # run_to_end: every order goes to zero heads on the same schedule
    assert [s.n_removed for s in curves["good"].steps] == [s.n_removed for s in curves["bad"].steps]
    assert curves["good"].steps[-1].n_removed == value.size
    # the random order is a seeded permutation
    again = H.iterative_pruning(value.shape, metric, None, order="random", seed=3, run_to_end=True)
    assert all(np.array_equal(a.heads_kept, b.heads_kept) for a, b in zip(again.steps, curves["random"].steps))


def test_min_steps_prunes_past_the_threshold_to_the_good_orders_size():
    """Re-fine-tuning (Prasanna et al.) compares the three subnetworks at the size "good" reached:
    `min_steps` keeps the bad and random orders pruning below the line through that step."""
    value, metric = _planted()
    good = H.iterative_pruning(value.shape, metric, lambda k: value, order="good", threshold=0.9)
    bad = H.iterative_pruning(value.shape, metric, lambda k: value, order="bad", threshold=0.9)
    assert bad.threshold_step < good.threshold_step  # without it, bad stops far earlier
    longer = H.iterative_pruning(value.shape, metric, lambda k: value, order="bad", threshold=0.9,
                                 min_steps=good.threshold_step)
    assert len(longer.steps) == good.threshold_step + 1  # steps 0..N, then it stops
    assert longer.steps[-1].n_removed == good.steps[good.threshold_step].n_removed
    # the extra steps keep removing the most valuable heads first, and the threshold is unchanged
    order = np.argsort(-value.reshape(-1), kind="stable")
    gone = np.flatnonzero(~longer.steps[-1].heads_kept.reshape(-1))
    assert set(gone) == set(order[: longer.steps[-1].n_removed])
    assert longer.threshold_step == bad.threshold_step and longer.prunable == bad.prunable
    # min_steps below where the curve stops anyway changes nothing
    same = H.iterative_pruning(value.shape, metric, lambda k: value, order="good", threshold=0.9, min_steps=1)
    assert [s.n_removed for s in same.steps] == [s.n_removed for s in good.steps]


def _sizes_and_parts(sub, good):
    return int(sub.sum()), int((sub & ~good).sum()), int((sub & good).sum())


@pytest.mark.parametrize("keep", [3, 10, 15, 22, 27])
def test_random_and_bad_subnetworks_have_the_good_ones_size_and_bad_is_built_from_the_pruned(keep):
    """Prasanna et al. (2020): the random and bad subnetworks have as many heads as the good one;
    bad is drawn from the heads the good procedure pruned, topped up from the good ones only when
    fewer were pruned than kept (the authors' mask mode "bad")."""
    rng = np.random.default_rng(keep)
    good = np.zeros(30, bool)
    good[rng.permutation(30)[:keep]] = True
    good = good.reshape(3, 10)
    pruned = 30 - keep
    for seed in (0, 1):
        random = H.equal_size_subnetwork(good, "random", seed)
        bad = H.equal_size_subnetwork(good, "bad", seed)
        assert random.shape == bad.shape == good.shape
        assert random.sum() == bad.sum() == keep
        n, from_pruned, from_good = _sizes_and_parts(bad, good)
        if pruned >= keep:  # only pruned heads
            assert (from_pruned, from_good) == (keep, 0)
        else:  # every pruned head, the rest from the good subnetwork
            assert (from_pruned, from_good) == (pruned, keep - pruned)
        # seeded: the same draw again
        assert np.array_equal(H.equal_size_subnetwork(good, "bad", seed), bad)
        assert np.array_equal(H.equal_size_subnetwork(good, "random", seed), random)
    assert np.array_equal(H.equal_size_subnetwork(good, "good", 0), good)
    # the random subnetwork is drawn from all heads: over seeds it takes pruned and kept ones alike
    draws = np.stack([H.equal_size_subnetwork(good, "random", s) for s in range(400)])
    share = draws.mean(0)
    assert abs(share[good].mean() - keep / 30) < 0.03 and abs(share[~good].mean() - keep / 30) < 0.03


def test_each_orders_subnetwork_at_equal_size_or_at_its_own_threshold():
    value, metric = _planted()
    curves = {o: H.iterative_pruning(value.shape, metric, lambda k: value, order=o, seed=2, threshold=0.9)
              for o in H.ORDERS}
    best = curves["good"].steps[curves["good"].threshold_step]
    assert curves["bad"].prunable < curves["good"].prunable  # the bad order stops far sooner
    for order in H.ORDERS:
        sub = H.order_subnetwork(curves, order, seed=2)
        assert sub.n_removed == best.n_removed and sub.heads_kept.sum() == best.heads_kept.sum()
        assert sub.step == best.step
        own = H.order_subnetwork(curves, order, seed=2, how="threshold")
        assert own.n_removed == curves[order].prunable
    bad = H.order_subnetwork(curves, "bad", seed=2)
    # good removed 12 of 30 and kept 18: bad holds all 12 it removed and 6 of the heads it kept
    assert (best.n_removed, int(best.heads_kept.sum())) == (12, 18)
    assert _sizes_and_parts(bad.heads_kept, best.heads_kept) == (18, 12, 6)
    # MLPs (units "both"): each pool sized by the good mask's own count
    both = {o: H.iterative_pruning(value.shape, lambda k, m: metric(k) * (0.5 + m.mean() / 2),
                                   lambda k, m: (value, np.array([1.0, 2.0, 3.0])), order=o, units="both", threshold=0.8)
            for o in H.ORDERS}
    gb = both["good"].steps[both["good"].threshold_step]
    for order in ("random", "bad"):
        sub = H.order_subnetwork(both, order, seed=0)
        assert sub.heads_kept.sum() == gb.heads_kept.sum() and sub.mlps_kept.sum() == gb.mlps_kept.sum()
    with pytest.raises(ConfigError, match="subnetworks 'same'"):
        H.order_subnetwork(curves, "bad", 0, how="same")


def _script():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("prune_heads_script", root / "experiments" / "prune_heads.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.mark.parametrize("how", ["equal_size", "threshold"])
def test_the_scripts_three_subnetworks_on_planted_curves(how, monkeypatch):
    """experiments/prune_heads.py: with --subnetworks equal_size every order's subnetwork has the
    good one's size (bad from the heads good pruned), and those are the masks its rows and the
    re-fine-tuning use; with threshold, each order's own threshold mask."""
    from types import SimpleNamespace

    script = _script()
    value = np.array([[0.01, 0.02, 0.03, 0.04], [0.3, 0.5, 0.8, 1.0]])  # the tiny BERT's 2 x 4 heads

    def curve(model, run, order, settings, seed, bs, min_steps=0):
        return H.iterative_pruning(value.shape, lambda k: float((value * k).sum() / value.sum()), lambda k: value,
                                   order=order, threshold=0.9, seed=seed, step_of=settings.step_of, min_steps=min_steps)

    monkeypatch.setattr(H, "classifier_curve", curve)
    monkeypatch.setattr(H, "masked_accuracy",
                        lambda model, enc, kept, pad, bs, mlps=None: float((value * kept).sum() / value.sum()))
    args = SimpleNamespace(batch_size=4, importance_examples=8, to_end=False, step_of="total", subnetworks=how,
                           refinetune=False, checkpoint="tiny", importance_split="dev", importance_batch="1",
                           units="heads", both_schedule="continue")
    run = SimpleNamespace(dev="dev", test="test", pad_id=0, family="bert")
    out = script.prune_seed(tiny_classifier("bert"), run, args, seed=0)
    good = np.array(out["good"]["subnetwork"]["heads_kept"])
    # good: 10% of 8 heads is one per step; the 4 small heads go (0.96 of the value), the 0.3 head would leave 0.86
    assert out["good"]["prunable"] == 4 and good.tolist() == [[False] * 4, [True] * 4]
    for order in ("random", "bad"):
        sub = out[order]["subnetwork"]
        kept = np.array(sub["heads_kept"])
        rows = [r for r in out[order]["rows"] if r["metric"] == "head_kept"]
        assert np.array_equal(np.array([r["value"] for r in rows]).reshape(2, 4), kept.astype(float))
        assert {r["extra"]["subnetwork"] for r in rows} == {how}
        assert sub["dev"] == pytest.approx((value * kept).sum() / value.sum())
        if how == "equal_size":
            assert kept.sum() == 4 and sub["n_removed"] == 4
        else:
            assert sub["n_removed"] == out[order]["prunable"]
    if how == "equal_size":  # 4 pruned, 4 kept: bad is exactly the pruned heads
        assert np.array_equal(np.array(out["bad"]["subnetwork"]["heads_kept"]), ~good)
    else:  # the bad order falls under the line at its first step: its subnetwork is the full model
        assert np.array(out["bad"]["subnetwork"]["heads_kept"]).all()


def test_prune_heads_recipe_is_the_sweeps_so_the_full_models_are_shared(tmp_path):
    """experiments/prune_heads.py --recipe takes the sweep config's finetune: mapping: the same
    training hash as `bertology prune` (so the sweep's full/seed-S folders resume), and the
    flags that would contradict it are refused."""
    import importlib.util
    from pathlib import Path

    from workbench.drivers.prune_sweep import load_prune_config
    from workbench.drivers.finetune import load_finetune_config

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("prune_heads_script", root / "experiments" / "prune_heads.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    sweep_file = root / "experiments" / "prune" / "minilm_polarity_cpu3.yaml"
    args = type("Args", (), dict(checkpoint="sentence-transformers/all-MiniLM-L6-v2", seeds=[1], recipe=str(sweep_file),
                                 train=None, eval=None, epochs=None, lr=None, batch_size=None, device="auto",
                                 threads=None))()
    base = script.recipe(args)
    _, ft = load_prune_config(sweep_file)
    cfg = load_finetune_config({**base, "name": "prune-heads-base"})
    assert cfg.training_hash() == ft.training_hash()
    assert (cfg.max_train_examples, cfg.max_len, cfg.batch_size, cfg.seeds) == (1000, 32, 16, [1])
    args.epochs = 3
    with pytest.raises(ConfigError, match="the recipe sets the training; drop epochs"):
        script.recipe(args)
    # without --recipe: the flags, over the script's defaults
    args.recipe, args.train = None, 200
    flags = load_finetune_config({**script.recipe(args), "name": "x"})
    assert (flags.epochs, flags.lr, flags.batch_size, flags.max_train_examples) == (3, 5e-5, 32, 200)


def test_bad_settings_are_one_clear_error():
    _, metric = _planted()
    with pytest.raises(ConfigError, match="order 'best'"):
        H.iterative_pruning((3, 10), metric, None, order="best")
    with pytest.raises(ConfigError, match="fraction 1.2"):
        H.iterative_pruning((3, 10), metric, None, order="random", fraction=1.2)
    with pytest.raises(ConfigError, match="needs an importance"):
        H.iterative_pruning((3, 10), metric, None, order="good")
    with pytest.raises(ConfigError, match="step_of 'left'"):
        H.iterative_pruning((3, 10), metric, None, order="random", step_of="left")


def test_the_scripts_bad_option_values_are_one_line_and_exit_2_before_any_work(tmp_path, capsys, monkeypatch):
    script = _script()
    monkeypatch.setattr(script, "run_finetune", lambda *a, **k: pytest.fail("work started"))
    for flag, message in ((["--step-of", "left"], "step_of: 'left' is not one of total, remaining"),
                          (["--subnetworks", "same"], "subnetworks: 'same' is not one of equal_size, threshold")):
        with pytest.raises(SystemExit) as stop:
            script.main(["tiny", *flag, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ rows and the view


def test_curve_rows_and_the_surviving_heads_matrix():
    """Rows of two seeds' curves -> the app's matrix: each cell the share of seeds keeping the head."""
    from app.views.prune_heads import PLOTS, matrix, surviving_heads, surviving_heads_plot

    value, metric = _planted(shape=(2, 5))
    rows = []
    masks = {}
    for seed in (0, 1):
        for order in ("good", "random"):
            curve = H.iterative_pruning(value.shape, metric, lambda k: value, order=order, seed=seed, threshold=0.8)
            masks[seed, order] = curve.steps[curve.threshold_step].heads_kept
            rows += H.curve_rows(curve, model="m", family="bert", seed=seed, task="t", test_at_threshold=0.5)
    import pandas as pd

    df = pd.DataFrame(rows)
    kept_rows = df[df["metric"] == "head_kept"]
    assert len(kept_rows) == 2 * 2 * value.size and set(kept_rows["layer"]) == {1, 2}
    prunable = df[df["metric"] == "heads_prunable"]
    assert sorted(prunable["value"]) == sorted(float((~m).sum()) for m in masks.values())
    table = surviving_heads(df)
    for order in ("good", "random"):
        expected = (masks[0, order].astype(float) + masks[1, order]) / 2
        np.testing.assert_allclose(matrix(table, order), expected)
    drawn = PLOTS["prune_heads_matrix"](df, "Surviving heads", {})
    assert drawn is not None and len(drawn.figure.data) == 2
    np.testing.assert_allclose(np.asarray(drawn.figure.data[0].z, float), (masks[0, "good"] + masks[1, "good"].astype(float)) / 2)
    assert surviving_heads_plot(df, "x", {"model": "m", "task": "t"}).data["value"].between(0, 1).all()


def test_settings_coerce_and_refuse_bad_values_naming_the_key():
    s = H.load_settings({"orders": "good,bad", "fraction": "0.2", "threshold": 0.8, "remove": [[0, 1]]}, "prune.yaml")
    assert s.orders == ["good", "bad"] and s.fraction == 0.2 and s.remove == [[0, 1]]
    kept = s.check_removed(tiny_classifier("bert"))
    assert kept.sum() == L * NH - 1 and not kept[0, 1]
    for values, message in [({"orders": ["best"]}, r"prune.yaml: orders: unknown order\(s\) \['best'\]"),
                            ({"fraction": 1.2}, r"prune.yaml: fraction: 1.2 is not in \(0, 1\]"),
                            ({"threshold": 0}, r"prune.yaml: threshold: 0.0 is not in \(0, 1\]"),
                            ({"importance_examples": 0}, "prune.yaml: importance_examples"),
                            ({"step_of": "left"}, r"prune.yaml: step_of: 'left' is not one of total, remaining"),
                            ({"subnetworks": "same"}, r"prune.yaml: subnetworks: 'same' is not one of equal_size, threshold"),
                            ({"fractoin": 0.1}, r"prune.yaml: unknown key\(s\) \['fractoin'\] \(did you mean 'fraction'"),
                            ({"remove": [[0, 1, 2]]}, "prune.yaml: remove: ")]:
        with pytest.raises(ConfigError, match=message):
            H.load_settings(values, "prune.yaml")
    with pytest.raises(ConfigError, match=r"prune.yaml: remove: head \(0, 4\) is out of range"):
        H.load_settings({"remove": [[0, 4]]}, "prune.yaml").check_removed(tiny_classifier("bert"), "prune.yaml")


# ------------------------------------------------- issue 49: per-example importance, Prasanna's continuation


def _one_example(batch, b):
    """Example b of a batch alone, without its padding: a batch of one."""
    n = int(batch["attention_mask"][b].sum())
    return {"input_ids": batch["input_ids"][b: b + 1, :n], "attention_mask": batch["attention_mask"][b: b + 1, :n],
            "labels": batch["labels"][b: b + 1]}


def test_per_example_importance_is_michel_et_als_expectation_of_absolute_per_example_gradients():
    """I_h = E_x |dL(x)/dxi_h| (Michel et al. 2019): one batched pass with per-example gates gives
    each example's own absolute gradient, the same numbers as batches of one (the reference
    scripts' --batch_size 1); the absolute value of the batch-mean gradient (the rule before issue
    49) lets opposite-signed examples cancel and is a different, smaller quantity."""
    model = tiny_classifier("bert").double()
    batch = tiny_batch(B=3)
    exact = H.head_importance(model, [batch], per_example=True)
    singles = [H.head_importance(model, [_one_example(batch, b)]) for b in range(3)]
    summed_h = sum(s.raw_heads * s.tokens for s in singles) / exact.tokens
    summed_m = sum(s.raw_mlps * s.tokens for s in singles) / exact.tokens
    assert exact.tokens == sum(s.tokens for s in singles)
    np.testing.assert_allclose(exact.raw_heads, summed_h, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(exact.raw_mlps, summed_m, rtol=1e-9, atol=1e-15)
    mean_rule = H.head_importance(model, [batch], per_example=False)
    # |mean of gradients| <= mean of |gradients| (x3 examples), strictly where signs differ
    assert np.all(mean_rule.raw_heads * 3 <= exact.raw_heads * (1 + 1e-6))  # the model's loss is float32 inside
    assert (mean_rule.raw_heads * 3 < exact.raw_heads - 1e-9).any()
    # at a mask (a removed head's gate at 0 in every example's copy) the same equality holds
    kept = np.ones((L, NH), bool)
    kept[0, 0] = False
    masked = H.head_importance(model, [batch], heads_kept=kept, per_example=True)
    masked_singles = sum(H.head_importance(model, [_one_example(batch, b)], heads_kept=kept).raw_heads
                         * int(batch["attention_mask"][b].sum()) for b in range(3)) / masked.tokens
    np.testing.assert_allclose(masked.raw_heads, masked_singles, rtol=1e-9, atol=1e-15)


def _encoded(n, seed):
    from workbench.drivers.finetune import Encoded

    g = np.random.default_rng(seed)
    return Encoded([g.integers(2, 60, size=int(g.integers(4, 10))) for _ in range(n)],
                   [int(v) for v in g.integers(0, 2, size=n)])


def test_classifier_importance_defaults_to_the_dev_split_one_example_per_gradient():
    """The sweep's and the script's importance (`classifier_importance`): the first
    `importance_examples` dev examples, one absolute gradient per example, whatever the
    fine-tuning batch; `importance_split: train` and `importance_batch: finetune` give the rule
    before issue 49 (|gradient| of each fine-tuning batch of training examples)."""
    from types import SimpleNamespace

    from workbench.drivers.finetune import collate

    model = tiny_classifier("bert").double()
    run = SimpleNamespace(train=_encoded(12, 1), dev=_encoded(10, 2), pad_id=0)
    kept = np.ones((L, NH), bool)
    default = H.HeadPruningSettings(importance_examples=7)
    assert (default.importance_split, default.importance_batch) == ("dev", 1)
    got = H.classifier_importance(model, run, default, batch_size=4)(kept)
    by_one = H.head_importance(model, [collate(run.dev, [i], 0) for i in range(7)]).heads
    np.testing.assert_allclose(got, by_one, rtol=1e-9, atol=1e-12)
    # the same ranking whatever the fine-tuning batch
    np.testing.assert_allclose(H.classifier_importance(model, run, default, batch_size=3)(kept), by_one,
                               rtol=1e-9, atol=1e-12)
    old = H.load_settings({"importance_examples": 7, "importance_split": "train", "importance_batch": "finetune"})
    got_old = H.classifier_importance(model, run, old, batch_size=4)(kept)
    rows = list(range(7))
    expected = H.head_importance(model, [collate(run.train, rows[i: i + 4], 0) for i in (0, 4)]).heads
    np.testing.assert_allclose(got_old, expected, rtol=1e-9, atol=1e-12)
    assert not np.allclose(got_old, by_one)
    # a fixed n: |gradient| of n examples' mean loss, n independent of the fine-tuning batch
    two = H.load_settings({"importance_examples": 7, "importance_batch": 2})
    np.testing.assert_allclose(H.classifier_importance(model, run, two, batch_size=4)(kept),
                               H.head_importance(model, [collate(run.dev, rows[i: i + 2], 0) for i in (0, 2, 4, 6)]).heads,
                               rtol=1e-9, atol=1e-12)
    # with MLPs: the pair, MLPs from the same per-example gradients
    heads, mlps = H.classifier_importance(model, run, default, batch_size=4)(kept, np.ones(L, bool))
    np.testing.assert_allclose(heads, by_one, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(mlps, H.head_importance(model, [collate(run.dev, [i], 0) for i in range(7)]).mlps,
                               rtol=1e-9, atol=1e-12)


def _planted_both(shape=(12, 12), seed=0):
    """Heads and MLPs each carry a value; the metric is the mean of the shares of head value and
    MLP value kept."""
    value = np.random.default_rng(seed).gamma(0.5, size=shape)
    mlp_value = np.random.default_rng(seed + 1).gamma(2.0, size=shape[0])

    def metric(kept, mlps):
        return 0.5 * float((value * kept).sum() / value.sum()) + 0.5 * float((mlp_value * mlps).sum() / mlp_value.sum())

    return value, mlp_value, metric


def test_units_both_continues_with_heads_only_half_steps_then_mlp_only_steps_as_prasanna_et_al():
    """Prasanna et al.'s find_head_mlp_masks.py: joint steps (10% of the heads and one MLP) until
    the metric falls below the line; then, from the last good masks, heads alone, num_to_mask // 2
    per step (7 of 144), until it falls; then MLPs alone, one per step, until it falls. The
    subnetwork is the last good mask. `both_schedule: joint` is the rule before issue 49."""
    value, mlp_value, metric = _planted_both()
    imp = lambda k, m: (value, mlp_value)  # noqa: E731
    curve = H.iterative_pruning(value.shape, metric, imp, order="good", units="both", threshold=0.9)
    floor = 0.9 * curve.full
    phases = [s.phase for s in curve.steps[1:]]
    joint = [s for s in curve.steps if s.phase == "joint"]
    heads = [s for s in curve.steps[1:] if s.phase == "heads"]
    mlps = [s for s in curve.steps[1:] if s.phase == "mlps"]
    assert phases == ["joint"] * (len(joint) - 1) + ["heads"] * len(heads) + ["mlps"] * len(mlps)
    assert heads and mlps
    # the joint phase: 14 heads and one MLP per step, stopped at its first step under the line
    assert [s.n_removed for s in joint] == [14 * i for i in range(len(joint))]
    assert [s.n_mlps_removed for s in joint] == list(range(len(joint)))
    assert joint[-1].metric < floor and all(s.metric >= floor for s in joint[:-1])
    # heads alone from the last good joint mask, 7 per step, its MLPs fixed, until under the line
    last_joint = joint[-2]
    assert heads[0].n_removed == last_joint.n_removed + 7
    assert [s.n_removed for s in heads] == [last_joint.n_removed + 7 * (i + 1) for i in range(len(heads))]
    assert all(np.array_equal(s.mlps_kept, last_joint.mlps_kept) for s in heads)
    assert heads[-1].metric < floor and all(s.metric >= floor for s in heads[:-1])
    # MLPs alone from the last good mask (heads' last good, else the joint one), one per step
    start = heads[-2] if len(heads) > 1 else last_joint
    assert all(np.array_equal(s.heads_kept, start.heads_kept) for s in mlps)
    assert [s.n_mlps_removed for s in mlps] == [start.n_mlps_removed + i + 1 for i in range(len(mlps))]
    assert mlps[-1].metric < floor or not mlps[-1].mlps_kept.any()
    # the subnetwork: the last mask above the line, here past the joint phase
    best = curve.steps[curve.threshold_step]
    assert best.metric >= floor and best.phase in ("heads", "mlps")
    assert best.n_removed >= last_joint.n_removed and best.n_mlps_removed >= last_joint.n_mlps_removed
    assert (best.n_removed, best.n_mlps_removed) != (last_joint.n_removed, last_joint.n_mlps_removed)
    # the good order removes the least valuable units first in every phase
    order = np.argsort(value.reshape(-1), kind="stable")
    assert set(np.flatnonzero(~best.heads_kept.reshape(-1))) == set(order[: best.n_removed])
    # the earlier rule: the joint steps only
    old = H.iterative_pruning(value.shape, metric, imp, order="good", units="both", threshold=0.9,
                              both_schedule="joint")
    assert [s.phase for s in old.steps] == ["joint"] * len(joint)
    assert old.threshold_step == len(joint) - 2 and old.prunable == last_joint.n_removed
    assert H.HeadPruningSettings().both_schedule == "continue"
    # units heads: one phase, unchanged by the setting
    heads_only = H.iterative_pruning(value.shape, lambda k: metric(k, np.ones(12, bool)), lambda k: value,
                                     order="good", threshold=0.9)
    assert {s.phase for s in heads_only.steps} == {"joint"}


def test_issue_49_settings_refuse_bad_values_naming_the_key():
    for values, message in [({"importance_split": "test"}, r"x.yaml: importance_split: 'test' is not one of dev, train"),
                            ({"importance_batch": 0}, r"x.yaml: importance_batch: '0' is not a positive integer or 'finetune'"),
                            ({"importance_batch": "big"}, r"x.yaml: importance_batch: 'big' is not a positive integer"),
                            ({"both_schedule": "prasanna"}, r"x.yaml: both_schedule: 'prasanna' is not one of continue, joint")]:
        with pytest.raises(ConfigError, match=message):
            H.load_settings(values, "x.yaml")
    assert H.load_settings({"importance_batch": "16"}, "x.yaml").importance_batch == 16
    with pytest.raises(ConfigError, match="both_schedule 'x'"):
        H.iterative_pruning((3, 10), lambda k, m: 1.0, None, order="random", units="both", both_schedule="x")
