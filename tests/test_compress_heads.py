"""Head and MLP pruning (workbench.compress.heads): gates, masks as weights, slicing, gradient
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

from workbench.compress import heads as H
from workbench.errors import ConfigError, WorkbenchError

L, NH, HID = 2, 4, 32  # layers, heads, hidden (head_dim 8)


def _tiny(family: str, seed: int = 0):
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


def _batch(seed: int = 0, B: int = 3, T: int = 9):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 60, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, -3:] = 0  # one padded row
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1])[:B]}


def _logits(model, batch):
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
    model, batch = _tiny(family), _batch()
    full = _logits(model, batch)
    handle = _reference_zeroed_context(model, layer=1, head=2)
    reference = _logits(model, batch)
    handle.remove()
    assert not torch.allclose(full, reference, atol=1e-4), "zeroing a head must change the outputs"

    kept = np.ones((L, NH), bool)
    kept[1, 2] = False
    masked = H.apply_mask(copy.deepcopy(model), kept)
    torch.testing.assert_close(_logits(masked, batch), reference, atol=1e-6, rtol=0)
    with H.gates(model, torch.tensor(kept, dtype=torch.float32)):
        torch.testing.assert_close(_logits(model, batch), reference, atol=1e-6, rtol=0)
    # the gates are gone after the block, the model untouched
    torch.testing.assert_close(_logits(model, batch), full, atol=0, rtol=0)


def test_masking_every_head_of_a_layer_leaves_only_the_residual_path():
    """BERT's attention block is LayerNorm(W_O ctx + b_O + x): with every head of layer 0 masked
    its output must be LayerNorm(x + b_O), computed here by hand from the captured input x."""
    model, batch = _tiny("bert"), _batch()
    kept = np.ones((L, NH), bool)
    kept[0] = False
    masked = H.apply_mask(copy.deepcopy(model), kept)
    block = masked.bert.encoder.layer[0].attention
    seen = {}
    h = block.register_forward_hook(lambda m, args, out: seen.update(x=args[0].detach(), y=out[0].detach()
                                                                      if isinstance(out, tuple) else out.detach()))
    _logits(masked, batch)
    h.remove()
    ln = block.output.LayerNorm
    z = seen["x"] + block.output.dense.bias
    mean = z.mean(-1, keepdim=True)
    var = ((z - mean) ** 2).mean(-1, keepdim=True)
    expected = (z - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias
    torch.testing.assert_close(seen["y"], expected, atol=1e-5, rtol=0)
    assert not torch.allclose(_logits(model, batch), _logits(masked, batch), atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_slicing_gives_the_masked_outputs_with_fewer_parameters(family):
    model, batch = _tiny(family), _batch()
    kept = np.ones((L, NH), bool)
    kept[0, [0, 3]] = False   # half a layer: for Llama one of each K/V group
    kept[1] = False           # a whole layer
    mlps = np.array([True, False])
    masked = H.apply_mask(copy.deepcopy(model), kept, mlps)
    sliced = H.slice_heads(copy.deepcopy(model), kept, mlps)
    assert not torch.allclose(_logits(model, batch), _logits(masked, batch), atol=1e-4)
    torch.testing.assert_close(_logits(sliced, batch), _logits(masked, batch), atol=1e-5, rtol=0)
    assert H.parameter_count(sliced) < H.parameter_count(masked)
    site = H.attention_sites(sliced)[0]
    assert site.num_heads == 2


def test_mlp_gate_zero_equals_removing_the_mlp_output():
    model, batch = _tiny("bert"), _batch()
    out = model.bert.encoder.layer[1].output.dense
    h = out.register_forward_hook(lambda m, a, o: torch.zeros_like(o))
    reference = _logits(model, batch)
    h.remove()
    masked = H.apply_mask(copy.deepcopy(model), np.ones((L, NH), bool), [True, False])
    torch.testing.assert_close(_logits(masked, batch), reference, atol=1e-6, rtol=0)
    assert not torch.allclose(_logits(model, batch), reference, atol=1e-4)


@pytest.mark.parametrize("family", ("bert", "gpt2"))
def test_gradient_importance_matches_a_finite_difference(family):
    """raw_heads = |dL/dxi_h| / tokens for one batch; checked against a central difference of the
    loss in each gate (float64), and likewise for the MLP gates."""
    model, batch = _tiny(family).double(), _batch()
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
    model = _tiny("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    b1, b2 = _batch(1), _batch(2)
    one = H.head_importance(model, [b1])
    two = H.head_importance(model, [b2])
    both = H.head_importance(model, [b1, b2])
    expected = (one.raw_heads * one.tokens + two.raw_heads * two.tokens) / (one.tokens + two.tokens)
    np.testing.assert_allclose(both.raw_heads, expected, rtol=1e-10)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_a_head_index_out_of_range_is_one_clear_error():
    model = _tiny("bert")
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
    model, batch = _tiny("bert"), _batch()
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
        gated = _logits(model, batch)
    torch.testing.assert_close(_logits(model, batch), gated, atol=1e-6, rtol=0)


def test_masked_handle_is_a_derived_checkpoint_that_opens_in_plain_transformers(tiny_checkpoint, tmp_path):
    from workbench.models import ModelHandle

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


def test_heads_to_remove_is_ten_percent_of_the_remaining_at_least_one():
    assert [H.heads_to_remove(n, 0.1) for n in (72, 65, 19, 10, 9, 1)] == [7, 6, 1, 1, 1, 1]


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
    # the schedule: 30 heads, 10% of those left per step, at least one
    removed = [s.n_removed for s in curve.steps]
    assert removed[:4] == [0, 3, 5, 7]
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


def test_prune_heads_recipe_is_the_sweeps_so_the_full_models_are_shared(tmp_path):
    """experiments/prune_heads.py --recipe takes the sweep config's finetune: mapping: the same
    training hash as `bertology prune` (so the sweep's full/seed-S folders resume), and the
    flags that would contradict it are refused."""
    import importlib.util
    from pathlib import Path

    from workbench.compress.sweep import load_prune_config
    from workbench.finetune import load_finetune_config

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
    kept = s.check_removed(_tiny("bert"))
    assert kept.sum() == L * NH - 1 and not kept[0, 1]
    for values, message in [({"orders": ["best"]}, r"prune.yaml: orders: unknown order\(s\) \['best'\]"),
                            ({"fraction": 1.2}, r"prune.yaml: fraction: 1.2 is not in \(0, 1\]"),
                            ({"threshold": 0}, r"prune.yaml: threshold: 0.0 is not in \(0, 1\]"),
                            ({"importance_examples": 0}, "prune.yaml: importance_examples"),
                            ({"fractoin": 0.1}, r"prune.yaml: unknown key\(s\) \['fractoin'\] \(did you mean 'fraction'"),
                            ({"remove": [[0, 1, 2]]}, "prune.yaml: remove: ")]:
        with pytest.raises(ConfigError, match=message):
            H.load_settings(values, "prune.yaml")
    with pytest.raises(ConfigError, match=r"prune.yaml: remove: head \(0, 4\) is out of range"):
        H.load_settings({"remove": [[0, 4]]}, "prune.yaml").check_removed(_tiny("bert"), "prune.yaml")
