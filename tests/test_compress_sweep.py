"""The compression sweep (workbench.drivers.prune_sweep, `bertology prune`): lottery-ticket rounds,
kept masks, rewinding, derived checkpoints that plain transformers opens, rows, resume, bad configs.

A tiny BERT (2 layers, hidden 32) fine-tuned for one epoch on 64 real sentence_polarity sentences:
the numbers mean nothing, the invariants are exact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.conftest import tiny_bert
from workbench.compress.masks import load_masks, mask_hash
from workbench.drivers.prune_sweep import load_prune_config, rewound, run_prune
from workbench.compress.unstructured import prunable_weights
from workbench.store.results import ResultsStore, decode_extra

FT = {"task": "sentence_polarity", "seeds": [0, 1], "epochs": 1, "lr": 1e-3, "max_train_examples": 64,
      "max_eval_examples": 32, "batch_size": 16, "baselines": False, "device": "cpu"}


@pytest.fixture(scope="module")
def tokenizer():
    """A WordPiece tokenizer trained on 2,000 sentence_polarity sentences (a second, not the
    session's four tokenizers)."""
    from tests.conftest import TOKENIZER_SPECS
    from workbench.data.raw import load_labelled
    from workbench.tokenization import build_tokenizer

    kind, special = TOKENIZER_SPECS["bert"]
    return build_tokenizer(kind, special, [ex.text for ex in load_labelled("sentence_polarity")[:2000]], vocab_size=1000)


@pytest.fixture(scope="module")
def pretrained(tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pretrained") / "tiny-bert"
    tiny_bert(tokenizer, hidden=32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _config(pretrained, out, **kw):
    base = {"finetune": {**FT, "checkpoint": str(pretrained)}, "methods": ["imp", "oneshot", "random", "reinit",
            "quantize", "lowrank"], "sparsities": [0.1, 0.2], "bits": [8, 1], "ranks": [4],
            "output_dir": str(out), "progress": False}
    base.update(kw)
    return load_prune_config(base)


@pytest.fixture(scope="module")
def sweep(pretrained, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    cfg, ft = _config(pretrained, root / "sweep")
    store = ResultsStore(root / "runs")
    return run_prune(cfg, ft, store=store), store, cfg, ft


def _point(result, method, amount, seed):
    return next(p for p in result.points if p["method"] == method and p["amount"] == amount and p["seed"] == seed)


@pytest.mark.slow
def test_imp_rounds_prune_exactly_a_tenth_of_the_original_weights_each(sweep):
    result = sweep[0]
    for seed in (0, 1):
        previous = None
        for k, amount in enumerate((0.1, 0.2), start=1):
            p = _point(result, "imp", amount, seed)
            assert p["round"] == k
            # counted as zeros in the saved weights, not read from the mask
            assert p["sparsity_measured"] == pytest.approx(0.1 * k, abs=0.5 / p["prunable"])
            masks = load_masks(p["checkpoint"])
            pruned = sum(int((~m).sum()) for m in masks.values())
            assert pruned == round(0.1 * k * p["prunable"])
            if previous is not None:  # nested: what round k-1 pruned stays pruned
                assert all(bool((~previous[n] <= ~masks[n]).all()) for n in masks)
            previous = masks


@pytest.mark.slow
def test_points_are_derived_checkpoints_that_plain_transformers_opens(sweep, tokenizer):
    from transformers import AutoModel

    from workbench.running.models import ModelHandle

    result = sweep[0]
    p = _point(result, "imp", 0.2, 1)
    folder = Path(p["checkpoint"])
    manifest = json.loads((folder / "manifest.json").read_text())
    lineage = manifest["derived_from"]
    assert lineage["transform"] == "prune_imp"
    assert lineage["params"]["sparsity"] == 0.2 and lineage["params"]["seed"] == 1
    assert lineage["params"]["mask_sha256"] == mask_hash(load_masks(folder))
    assert lineage["parent"].endswith("full/seed-1/best")
    plain = AutoModel.from_pretrained(folder).eval()
    handle = ModelHandle.load(folder)
    words = [["a", "fine", "film", "."], ["dull", "and", "long"]]
    ours = handle.forward(words)
    enc = tokenizer([" ".join(w) for w in words], return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = plain(**enc, output_hidden_states=True).hidden_states
    for b, w in enumerate(words):
        n = int(enc["attention_mask"][b].sum())
        assert torch.allclose(ours.hidden_states["encoder"][-1][b, :n], theirs[-1][b, :n], atol=1e-5)
    # zeros where pruned, in the plain model's own weights
    masks = load_masks(folder)
    params = dict(plain.named_parameters())
    for name, m in masks.items():
        body_name = name.split(".", 1)[1]  # bert.encoder... -> encoder...
        assert bool((params[body_name][~m] == 0).all())


@pytest.mark.slow
def test_masked_weights_stay_zero_and_kept_ones_train(sweep):
    from workbench.running.classifier_loading import load_classifier

    result = sweep[0]
    for method in ("oneshot", "random", "reinit"):
        p = _point(result, method, 0.2, 0)
        model = load_classifier(p["checkpoint"])
        masks = load_masks(p["checkpoint"])
        params = dict(model.named_parameters())
        assert all(bool((params[n][~m] == 0).all()) for n, m in masks.items())
        # the survivors did train: not all of them are still at their (masked) start values
        assert sum(int((params[n][m] != 0).sum()) for n, m in masks.items()) == p["nonzero_prunable"]
    # the prunable set: the six dense matrices of each of the 2 blocks and the pooler (Chen et al.)
    names = list(load_masks(_point(result, "imp", 0.1, 0)["checkpoint"]))
    assert len(names) == 13 and all(".encoder.layer." in n for n in names[:-1])
    assert names[-1] == "bert.pooler.dense.weight"


def test_rewinding_restores_every_kept_weight_bit_exactly():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    start_model = BertForSequenceClassification(cfg)
    start = {k: v.clone() for k, v in start_model.state_dict().items()}
    trained = BertForSequenceClassification(cfg)  # other weights: "after fine-tuning"
    names = prunable_weights(trained)
    from workbench.compress.unstructured import magnitude_masks

    masks = magnitude_masks(trained, names, 0.4)
    model = rewound(trained, start, masks)
    params = dict(model.named_parameters())
    for n, p in params.items():
        if n in masks:
            assert torch.equal(p[masks[n]], start[n][masks[n]]) and bool((p[~masks[n]] == 0).all())
        else:
            assert torch.equal(p, start[n])
    assert trained is not model and not torch.equal(dict(trained.named_parameters())[names[0]], params[names[0]])


def test_rewinding_keeps_the_trained_task_head_as_chen_et_als_rewind():
    """Chen et al. (2020)'s `rewind()` (LT_glue.py) restores the pretrained `bert.*` weights only:
    the rewound start is the rewind point's body under the trained model's task head."""
    from transformers import BertConfig, BertForSequenceClassification

    from workbench.drivers.prune_sweep import task_head_keys, with_trained_head

    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    start = {k: v.clone() for k, v in BertForSequenceClassification(cfg).state_dict().items()}
    trained = BertForSequenceClassification(cfg)  # other weights: "after fine-tuning"
    assert task_head_keys(trained) == ["classifier.weight", "classifier.bias"]
    kept = with_trained_head(start, trained)
    assert kept.keys() == start.keys()
    for k, v in kept.items():
        expected = trained.state_dict()[k] if k.startswith("classifier.") else start[k]
        assert torch.equal(v, expected), k
    assert not torch.equal(kept["classifier.weight"], start["classifier.weight"])


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["keep", "reset"])
def test_a_ticket_retrains_under_the_trained_head_unless_rewind_head_reset(pretrained, tmp_path, monkeypatch, rule):
    """IMP round 1, one-shot and random start from the pretrained body; with `rewind_head: keep`
    (the default) under the full model's trained task head (IMP round r: round r-1's), with
    `reset` under the seed's initial head, as before issue 49. The start weights are read where
    the sweep builds them (`rewound`)."""
    import workbench.drivers.prune_sweep as sweep_module

    starts = []
    real = sweep_module.rewound

    def capture(template, start, masks):
        starts.append({k: v.clone() for k, v in start.items()})
        return real(template, start, masks)

    monkeypatch.setattr(sweep_module, "rewound", capture)
    cfg, ft = _config(pretrained, tmp_path / "sweep", methods=["imp", "oneshot", "random"], sparsities=[0.1, 0.2],
                      finetune={**FT, "checkpoint": str(pretrained), "seeds": [0]},
                      **({} if rule == "keep" else {"rewind_head": "reset"}))
    assert cfg.rewind_head == rule
    result = run_prune(cfg, ft, store=ResultsStore(tmp_path / "runs"))
    from workbench.running.classifier_loading import load_classifier

    full = load_classifier(Path(_point(result, "full", 0.0, 0)["checkpoint"])).state_dict()
    imp1 = load_classifier(Path(_point(result, "imp", 0.1, 0)["checkpoint"])).state_dict()
    # the order the sweep retrains in: imp 0.1, imp 0.2, then oneshot and random at 0.1 and 0.2
    assert len(starts) == 6
    initial = starts[0]["classifier.weight"] if rule == "reset" else None
    heads = [full, imp1, full, full, full, full] if rule == "keep" else [None] * 6
    for i, start in enumerate(starts):
        body = [k for k in start if not k.startswith("classifier.")]
        assert all(torch.equal(start[k], starts[0][k]) for k in body)  # the pretrained body every time
        if rule == "keep":
            assert torch.equal(start["classifier.weight"], heads[i]["classifier.weight"]), i
        else:
            assert torch.equal(start["classifier.weight"], initial) and not torch.equal(initial, full["classifier.weight"])
    p = _point(result, "imp", 0.1, 0)
    manifest = json.loads((Path(p["checkpoint"]) / "manifest.json").read_text())
    assert manifest["derived_from"]["params"]["rewind_head"] == rule


@pytest.mark.slow
def test_rows_wins_and_post_hoc_points(sweep):
    result, store, cfg, ft = sweep
    rows = store.read(result.run_id)
    seeded = rows[rows["seed"].notna() & (rows["metric"] == "accuracy")]
    # full + 2 IMP rounds + oneshot/random/reinit at 2 sparsities + 2 bits + lowrank and its magnitude twin
    assert len(seeded) == 2 * 2 * (1 + 2 + 3 * 2 + 2 + 2)
    # per-seed rows only (issue 41): the mean, its t-interval and wins are computed when read
    assert rows["seed"].notna().all() and set(rows["metric"]) <= {"accuracy", "head_kept", "heads_prunable", "mlp_kept"}
    from workbench.drivers.prune_rows import format_table, over_seeds

    full = seeded[(seeded["model"] == "full") & (seeded["split"] == "test")]["value"].to_numpy(dtype=float)
    acc = over_seeds(rows, "test").set_index(["model", "amount"])
    wins = over_seeds(rows, "test", "wins")
    assert set(wins["model"]) == {"imp", "oneshot", "random", "reinit"}
    for _, r in wins.iterrows():
        x = seeded[(seeded["model"] == r["model"]) & (seeded["split"] == "test") & seeded["extra"].map(
            lambda e: decode_extra(e)["amount"] == r["amount"])]["value"].to_numpy(dtype=float)
        assert acc.loc[(r["model"], r["amount"]), "value"] == pytest.approx(x.mean())
        assert r["full_mean"] == pytest.approx(full.mean())
        assert r["value"] == float(x.mean() >= full.mean() - full.std(ddof=1))
    assert format_table(rows).splitlines()[1].split()[:2] == ["full", "0"]
    q1 = _point(result, "quantize", 1, 0)
    assert q1["bits"] == 1 and q1["sparsity_measured"] == 0.0
    lr = _point(result, "lowrank", 4, 0)
    lm = _point(result, "lowrank_magnitude", 4, 0)
    # equal parameter counts: each 32x32 matrix r(m+n)=256 of 1024, each 32x64 / 64x32 384 of 2048;
    # the pooler (32x32, in the prunable set) is not factorised by lowrank, so not pruned by its twin
    assert lm["nonzero_prunable"] == 2 * (4 * 256 + 2 * 384) + 32 * 32
    assert lr["sparsity_measured"] == 0.0


@pytest.mark.slow
def test_a_rerun_resumes_every_point_without_training(sweep, monkeypatch):
    import workbench.drivers.finetune as finetune

    result, store, cfg, ft = sweep
    calls = []
    real = finetune.train_seed

    def counting(*a, **kw):
        calls.append(a[1])
        return real(*a, **kw)

    monkeypatch.setattr(finetune, "train_seed", counting)
    again = run_prune(cfg, ft, store=store)
    # only the full models are read back (their result.json), no point retrains
    assert calls == [0, 1]
    assert [(p["method"], p["amount"], p["seed"], p["test"]) for p in again.points] == \
           [(p["method"], p["amount"], p["seed"], p["test"]) for p in result.points]


@pytest.mark.parametrize("change, message", [
    ({"sparsities": [0.5, 1.2]}, "sparsities[1]: a sparsity is a fraction in (0, 1), got 1.2"),
    ({"bits": [0]}, "bits[0]: bits must be an integer from 1 to 8, got 0"),
    ({"methods": ["imp", "magic"]}, "methods[1]: unknown method 'magic'"),
    ({"methods": ["lowrank_magnitude"]}, "methods[0]: unknown method 'lowrank_magnitude'"),
    ({"sparsities": [0.25]}, "sparsities[0]: 0.25 is not a multiple of imp_step 0.1"),
    ({"methods": ["reinit"]}, "methods: reinit uses IMP's masks"),
    ({"sparsity": [0.5]}, "unknown key(s) ['sparsity'] (did you mean 'sparsities'?)"),
    ({"rewind_schedule": "resume"}, "rewind_schedule: must be one of continue, restart, got 'resume'"),
    ({"quantize_scheme": "q8bit"}, "quantize_scheme: must be one of per_channel, q8bert, got 'q8bit'"),
    ({"include_pooler": "maybe"}, "include_pooler: expected true/false, got 'maybe'"),
    ({"rewind_head": "fresh"}, "rewind_head: must be one of keep, reset, got 'fresh'"),
])
def test_bad_configs_are_one_line_and_exit_2_before_any_work(tmp_path, change, message, capsys):
    from app.cli import main

    cfg = {"finetune": {**FT, "checkpoint": "sentence-transformers/all-MiniLM-L6-v2"},
           "output_dir": str(tmp_path / "out"), **change}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["prune", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and str(path) in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_experiment_prunes_then_probes_every_point(sweep, pretrained, tmp_path, monkeypatch, capsys):
    """`bertology run` with `prune:` runs the sweep (here resumed: the fixture's folder) and the syntax
    probe on every point; the rows name each point by its folder (method-amount-seed)."""
    from app.experiments import run_experiment

    result, store, cfg, ft = sweep
    monkeypatch.setenv("BERTOLOGY_RUNS", str(store.root))
    prune_yaml = tmp_path / "prune.yaml"
    prune_yaml.write_text(yaml.safe_dump({**cfg.to_dict(), "finetune": cfg.finetune}))
    experiment = {"name": "prune-probe", "prune": "prune.yaml",
                  "probe": {"syntax": {"tasks": ["upos"], "max_train_sentences": 60, "max_eval_sentences": 30,
                                       "mdl_tasks": [], "scalar_mix_tasks": [], "n_boot": 20, "baselines": [],
                                       "progress": False}}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(experiment))
    assert run_experiment(path) == 0
    runs = store.runs(probe="syntax")
    rows = store.read(runs["run_id"].iloc[-1])
    models = set(rows.loc[(rows["task"] == "upos") & (rows["metric"] == "accuracy"), "model"])
    assert models == {Path(p["checkpoint"]).name for p in result.points}
    assert {"full-0-seed0", "imp-0.2-seed1", "quantize-1bit-seed0", "lowrank-r4-seed1"} <= models


@pytest.mark.slow
def test_rewinding_to_an_early_fine_tuning_step(pretrained, tmp_path):
    """rewind_step 2 (Frankle et al. 2020): the rewind point is the full model's weights after its
    second optimizer step, bit for bit (the same seed trained again, read by an after-step hook);
    the ticket records its rewind step (the rewound start itself: test_rewinding_restores_...)."""
    import dataclasses

    from workbench.drivers.finetune import prepare, train_seed

    from workbench.running.classifier_loading import load_classifier
    from workbench.loop import TrainingHooks

    cfg, ft = _config(pretrained, tmp_path / "sweep", methods=["imp"], sparsities=[0.1], rewind_step=2,
                      finetune={**FT, "checkpoint": str(pretrained), "seeds": [0]})
    result = run_prune(cfg, ft, store=ResultsStore(tmp_path / "runs"))
    rewind = load_classifier(tmp_path / "sweep" / "full" / "seed-0" / "rewind").state_dict()
    seen = {}

    def capture(model, step):
        if step == 2:
            seen.update({k: v.detach().clone() for k, v in model.state_dict().items()})

    run = prepare(dataclasses.replace(ft, output_dir=str(tmp_path / "again")))
    train_seed(ft, 0, run, hooks=TrainingHooks(after_step=capture))
    assert seen and all(torch.equal(seen[k], rewind[k]) for k in rewind)
    p = _point(result, "imp", 0.1, 0)
    assert p["rewind_step"] == 2
    manifest = json.loads((Path(p["checkpoint"]) / "manifest.json").read_text())
    assert manifest["derived_from"]["params"]["rewind_step"] == 2


def _recorded_training(monkeypatch):
    """(step, learning rate, batch checksum) of every optimizer step of every fine-tuning, in order."""
    import workbench.drivers.finetune as finetune

    steps, batches = [], []
    real_step, real_terms = finetune.optimizer_step, finetune.loss_terms

    def step(model, optimizer, scheduler, clip, hooks, n):
        steps.append((n, real_step(model, optimizer, scheduler, clip, hooks, n)))
        return steps[-1][1]

    def terms(model, batch, *a, **kw):
        batches.append(int((batch["input_ids"] * batch["attention_mask"]).sum()))
        return real_terms(model, batch, *a, **kw)

    monkeypatch.setattr(finetune, "optimizer_step", step)
    monkeypatch.setattr(finetune, "loss_terms", terms)
    return lambda: [(n, lr, b) for (n, lr), b in zip(steps, batches)]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["continue", "restart"])
def test_retraining_from_a_rewind_step_continues_the_schedule(pretrained, tmp_path, monkeypatch, schedule):
    """rewind_step k (Frankle et al. 2020): with `continue` the ticket retrains the full run's steps
    k+1..T, at the full run's learning rates (warm-up and decay at step k) and on its batches, as
    open_lth's train(start_step=k) does; `restart` (the old behaviour) trains steps 1..T from the
    schedule's start. Two epochs, warm-up half the steps, k = 5 (inside the second epoch)."""
    record = _recorded_training(monkeypatch)
    k = 5
    cfg, ft = _config(pretrained, tmp_path / "sweep", methods=["oneshot", "random"], sparsities=[0.2], rewind_step=k,
                      rewind_schedule=schedule,
                      finetune={**FT, "checkpoint": str(pretrained), "seeds": [0], "epochs": 2, "warmup": 0.5})
    result = run_prune(cfg, ft, store=ResultsStore(tmp_path / "runs"))
    seen = record()
    total = next(i for i in range(1, len(seen)) if seen[i][0] != seen[i - 1][0] + 1)  # the full run's steps
    full, retrained = seen[:total], seen[total:]
    assert [n for n, _, _ in full] == list(range(1, total + 1)) and total > k + 1
    lrs = [lr for _, lr, _ in full]
    assert lrs[0] < max(lrs) and lrs[-1] < max(lrs)  # a warm-up, then a decay
    expected = full[k:] if schedule == "continue" else full
    assert retrained == expected * 2  # oneshot, then random: the same steps, rates and batches
    for method in ("oneshot", "random"):
        p = _point(result, method, 0.2, 0)
        assert p["rewind_step"] == k and p["from_step"] == (k if schedule == "continue" else 0)
        assert p["sparsity_measured"] == pytest.approx(0.2, abs=0.5 / p["prunable"])


@pytest.mark.slow
def test_a_rewind_step_past_the_fine_tuning_is_one_line_and_exit_2(pretrained, tmp_path, capsys):
    from app.cli import main

    path = tmp_path / "late.yaml"
    path.write_text(yaml.safe_dump({"finetune": {**FT, "checkpoint": str(pretrained), "seeds": [0]},
                                    "methods": ["oneshot"], "sparsities": [0.1], "rewind_step": 1000,
                                    "output_dir": str(tmp_path / "out"), "progress": False}))
    assert main(["prune", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rewind_step: 1000 is not below the fine-tuning's" in err, err
    assert not (tmp_path / "out" / "full" / "seed-0").exists()  # refused before any training


# ------------------------------------------------------------------------------ head pruning points

@pytest.fixture(scope="module")
def head_sweep(pretrained, tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    cfg, ft = _config(pretrained, root / "sweep", methods=["heads_good", "heads_remove"],
                      heads={"fraction": 0.25, "threshold": 1.0, "run_to_end": True, "importance_examples": 32,
                             "remove": [[0, 1], [1, 0]]},
                      finetune={**FT, "checkpoint": str(pretrained), "seeds": [0]})
    store = ResultsStore(root / "runs")
    return run_prune(cfg, ft, store=store), store


def test_head_points_are_masked_checkpoints_whose_outputs_equal_gating(head_sweep, tokenizer):
    from transformers import AutoModelForSequenceClassification

    from workbench.drivers import head_pruning as H
    from workbench.running.classifier_loading import load_classifier

    result, store = head_sweep
    full = load_classifier(Path(_point(result, "full", 0.0, 0)["checkpoint"])).eval()
    good = sorted((p for p in result.points if p["method"] == "heads_good"), key=lambda p: p["amount"])
    # tiny BERT: 2 layers x 2 heads; 25% of the remaining per step, at least one, run to the end
    assert [p["n_heads"] - p["n_heads_kept"] for p in good] == [1, 2, 3, 4]
    batch = tokenizer(["a good film", "not a good film at all"], return_tensors="pt", padding=True)
    for p in good + [_point(result, "heads_remove", 0.5, 0)]:
        folder = Path(p["checkpoint"])
        manifest = json.loads((folder / "manifest.json").read_text())
        kept = np.array(manifest["derived_from"]["params"]["heads_kept"], dtype=bool)
        assert kept.tolist() == p["heads_kept"] and p["amount"] == pytest.approx(1 - kept.mean())
        model = AutoModelForSequenceClassification.from_pretrained(folder).eval()  # plain transformers opens it
        for layer, site in enumerate(H.attention_sites(model)):  # zeroed columns = removed heads, exactly
            zero = (site.out_proj.weight.view(site.out_proj.weight.shape[0], site.num_heads, -1) == 0).all(0).all(-1)
            assert zero.numpy().tolist() == (~kept[layer]).tolist()
        with torch.no_grad(), H.gates(full, torch.tensor(kept, dtype=torch.float32)):
            gated = full(**batch).logits
        with torch.no_grad():
            assert torch.allclose(model(**batch).logits, gated, atol=1e-5)
    removed = _point(result, "heads_remove", 0.5, 0)["heads_kept"]
    assert [(l, h) for l in range(2) for h in range(2) if not removed[l][h]] == [(0, 1), (1, 0)]


def test_head_sweep_rows_hold_the_surviving_heads_matrix(head_sweep):

    result, store = head_sweep
    rows = store.query(probe="prune")
    rows = rows[rows["run_id"] == result.run_id]
    kept = rows[rows["metric"] == "head_kept"]
    assert len(kept) == 4 and set(kept["model"]) == {"heads"}
    prunable = rows[rows["metric"] == "heads_prunable"]["value"].item()
    # threshold 1.0: the subnetwork is the last step whose dev accuracy is at least the full model's
    assert float((kept["value"] == 0).sum()) == prunable
    acc = rows[(rows["metric"] == "accuracy") & (rows["model"] == "heads_good") & rows["seed"].notna()
               & (rows["split"] == "test")]
    assert sorted(acc["value"]) == sorted(p["test"]["accuracy"] for p in result.points if p["method"] == "heads_good")


def test_a_head_sweep_rerun_reads_its_points_back_and_finds_the_same_masks(head_sweep, pretrained):
    result, store = head_sweep
    cfg, ft = _config(pretrained, result.folder, methods=["heads_good", "heads_remove"],
                      heads={"fraction": 0.25, "threshold": 1.0, "run_to_end": True, "importance_examples": 32,
                             "remove": [[0, 1], [1, 0]]},
                      finetune={**FT, "checkpoint": str(pretrained), "seeds": [0]})
    written = {p["checkpoint"]: (Path(p["checkpoint"]).parent / "point.json").stat().st_mtime_ns for p in result.points}
    again = run_prune(cfg, ft, store=store)
    assert [(p["method"], p["amount"], p["heads_kept"] if "heads_kept" in p else None, p["test"]) for p in again.points] == \
           [(p["method"], p["amount"], p["heads_kept"] if "heads_kept" in p else None, p["test"]) for p in result.points]
    assert {p["checkpoint"]: (Path(p["checkpoint"]).parent / "point.json").stat().st_mtime_ns
            for p in again.points} == written  # read back, not rewritten
    # the recomputed curve (deterministic importance) gives the same surviving heads
    kept = store.query(probe="prune")
    kept = kept[kept["metric"] == "head_kept"]
    kept = kept.assign(head=[decode_extra(e)["head"] for e in kept["extra"]]).sort_values(["layer", "head"])
    by_run = {run: tuple(g["value"]) for run, g in kept.groupby("run_id")}
    assert len(by_run) == 2 and len(set(by_run.values())) == 1


# planted head values of the tiny BERT's 2 x 2 heads: the good order removes (0, 0) and (0, 1), then
# (1, 0) takes the metric to 0.65 of the full model's, under 0.9: its subnetwork keeps layer 1's two heads
PLANTED = np.array([[0.01, 0.02], [0.5, 1.0]])


def _planted_curve(model, run, order, settings, seed, batch_size, min_steps=0):
    """`heads.classifier_curve` on planted head values (the sweep's wiring is under test, not a
    tiny model's accuracies, which differ between CPU kinds)."""
    from workbench.drivers import head_pruning as H

    assert H.head_shape(model) == PLANTED.shape
    return H.iterative_pruning(PLANTED.shape, lambda kept: float((PLANTED * kept).sum() / PLANTED.sum()),
                               lambda kept: PLANTED, order=order, fraction=settings.fraction, threshold=settings.threshold,
                               seed=seed, run_to_end=settings.run_to_end, step_of=settings.step_of, min_steps=min_steps)


@pytest.fixture(scope="module")
def order_sweeps(pretrained, tmp_path_factory):
    """heads_random listed before heads_good, on planted curves; the default (equal_size) and
    subnetworks: threshold."""
    from workbench.drivers import head_pruning as H

    root = tmp_path_factory.mktemp("orders")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(H, "classifier_curve", _planted_curve)
        for how in ("equal_size", "threshold"):
            cfg, ft = _config(pretrained, root / how, methods=["heads_random", "heads_good", "heads_bad"],
                              heads={"fraction": 0.25, "threshold": 0.9, "subnetworks": how, "importance_examples": 8},
                              finetune={**FT, "checkpoint": str(pretrained), "seeds": [0]})
            store = ResultsStore(root / how / "runs")
            result = run_prune(cfg, ft, store=store)
            rows = store.query(probe="prune")
            out[how] = result, rows[rows["run_id"] == result.run_id]
    return out


def _kept_rows(rows, order):
    kept = rows[rows["metric"] == "head_kept"]
    extra = [decode_extra(e) for e in kept["extra"]]
    mask = np.zeros(PLANTED.shape, bool)
    kinds = set()
    for (_, r), e in zip(kept.iterrows(), extra):
        if e["order"] == order:
            mask[int(r["layer"]) - 1, e["head"]] = r["value"] == 1.0
            kinds.add(e["subnetwork"])
    return mask, kinds


def test_the_sweeps_random_and_bad_subnetworks_have_the_good_ones_size(order_sweeps):
    """Prasanna et al.'s comparison in the sweep: besides their curves, heads_random and heads_bad
    write the random and bad subnetworks of the good one's size (2 of 4 heads kept), bad drawn
    from the heads good pruned; the surviving-heads rows of each order are those subnetworks."""
    result, rows = order_sweeps["equal_size"]
    good_kept = np.array([[False, False], [True, True]])
    good = [p for p in result.points if p["method"] == "heads_good"]
    assert [p["n_heads"] - p["n_heads_kept"] for p in sorted(good, key=lambda p: p["amount"])] == [1, 2, 3]
    assert all(p["step_of"] == "total" for p in good)
    random_point = _point(result, "heads_random_equal_size", 0.5, 0)
    bad_point = _point(result, "heads_bad_equal_size", 0.5, 0)
    for p in (random_point, bad_point):
        assert p["n_heads_kept"] == 2 and p["subnetwork"] == "equal_size" and p["pruning_step"] == 2
        folder = Path(p["checkpoint"])
        kept = np.array(json.loads((folder / "manifest.json").read_text())["derived_from"]["params"]["heads_kept"])
        assert kept.tolist() == p["heads_kept"]
    # 2 pruned, 2 kept: bad is exactly the pruned heads
    assert np.array_equal(np.array(bad_point["heads_kept"]), ~good_kept)
    for order, expected in (("good", good_kept), ("random", np.array(random_point["heads_kept"])),
                            ("bad", ~good_kept)):
        mask, kinds = _kept_rows(rows, order)
        assert np.array_equal(mask, expected), order
        assert kinds == ({"threshold"} if order == "good" else {"equal_size"})
    # the curves' own prunable counts stay the orders' (bad stops at once: 0 heads)
    prunable = {decode_extra(e)["order"]: v for e, v in zip(rows[rows["metric"] == "heads_prunable"]["extra"],
                                                              rows[rows["metric"] == "heads_prunable"]["value"])}
    assert prunable["good"] == 2.0 and prunable["bad"] == 0.0
    # rows of the equal-size points, by name, next to the curves' points
    assert {"heads_random_equal_size", "heads_bad_equal_size"} <= set(rows["model"])


def test_subnetworks_threshold_keeps_each_orders_own_threshold_mask(order_sweeps):
    result, rows = order_sweeps["threshold"]
    assert not [p for p in result.points if p["method"].endswith("_equal_size")]
    bad_mask, kinds = _kept_rows(rows, "bad")
    assert kinds == {"threshold"} and bad_mask.all()  # the bad order's first step falls under the line: nothing pruned


def test_equal_size_random_or_bad_without_good_is_one_line_and_exit_2(pretrained, tmp_path, capsys):
    from app.cli import main

    cfg = {"finetune": {**FT, "checkpoint": str(pretrained)}, "methods": ["heads_bad"],
           "output_dir": str(tmp_path / "out")}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["prune", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "list heads_good too" in err and str(path) in err, err
    assert not (tmp_path / "out").exists()
    cfg["heads"] = {"subnetworks": "threshold"}  # the earlier comparison needs no good curve
    load_prune_config(cfg)


@pytest.mark.parametrize("heads, message", [
    ({"remove": [[0, 2]]}, "heads: remove: head (0, 2) is out of range: the model has layers 0-1 and heads 0-1"),
    ({"remove": [[5, 0]]}, "heads: remove: head (5, 0) is out of range"),
    ({"fraction": 1.5}, "heads: fraction: 1.5 is not in (0, 1]"),
    ({"orders": ["good"]}, "heads: orders: not a sweep setting"),
    ({"fractoin": 0.1}, "heads: unknown key(s) ['fractoin']"),
    ({}, "heads: remove: method heads_remove needs (layer, head) pairs"),
    ({"remove": [[0, 1]], "step_of": "left"}, "heads: step_of: 'left' is not one of total, remaining"),
    ({"remove": [[0, 1]], "subnetworks": "same"}, "heads: subnetworks: 'same' is not one of equal_size, threshold"),
    ({"remove": [[0, 1]], "importance_split": "test"}, "heads: importance_split: 'test' is not one of dev, train"),
    ({"remove": [[0, 1]], "importance_batch": 0}, "heads: importance_batch: '0' is not a positive integer or 'finetune'"),
    ({"remove": [[0, 1]], "both_schedule": "x"}, "heads: both_schedule: 'x' is not one of continue, joint"),
    ({"remove": [[0, 1]], "refinetune": True}, "heads: refinetune re-fine-tunes the good, random and bad subnetworks"),
])
def test_bad_head_settings_are_one_line_and_exit_2_before_any_work(pretrained, tmp_path, heads, message, capsys):
    from app.cli import main

    cfg = {"finetune": {**FT, "checkpoint": str(pretrained)}, "methods": ["heads_good", "heads_remove"],
           "heads": heads, "output_dir": str(tmp_path / "out")}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["prune", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and str(path) in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_retrained_points_cost_their_retraining_on_top_of_what_found_the_mask(pretrained, tmp_path):
    """Issue 29's costs along a lineage for lottery tickets: a retrained point's own cost is its
    retraining (not the zero of a bare transform); its total adds the checkpoint the mask was found
    in (the full model; IMP round k: round k-1, which holds the rounds before it; reinit: the IMP
    point of its sparsity); a post-hoc transform (quantization) adds nothing of its own."""
    import shutil

    from workbench.cost import checkpoint_cost

    base = tmp_path / "tiny-bert"
    shutil.copytree(pretrained, base)
    own = {"flops": 1e12, "device_hours": 1.0, "energy_kwh": 2.0, "co2e_kg": 0.5}
    (base / "manifest.json").write_text(json.dumps(
        {"family": "bert", "cost": {"own": own, "parent": None, "total": {**own, "known": True}}}))
    cfg, ft = _config(base, tmp_path / "sweep", methods=["imp", "oneshot", "reinit", "quantize"], bits=[8],
                      finetune={**FT, "seeds": [0], "checkpoint": str(base)})
    result = run_prune(cfg, ft, store=ResultsStore(tmp_path / "runs"))
    cost = {(p["method"], p["amount"]): checkpoint_cost(p["checkpoint"]) for p in result.points}
    full = cost[("full", 0.0)]["total"]
    assert full["known"] and full["flops"] > own["flops"]  # pretraining + the full fine-tuning

    def total_is(point, prior_total):
        got = cost[point]
        assert got["own"]["flops"] > 0 and got["own"]["tokens"] > 0 and "fine-tuning" in got["own"]["what"]
        for k in ("flops", "device_hours", "energy_kwh", "co2e_kg"):
            assert got["total"][k] == pytest.approx(got["own"][k] + prior_total[k])
        assert got["total"]["known"]

    total_is(("oneshot", 0.1), full)
    total_is(("imp", 0.1), full)
    total_is(("imp", 0.2), cost[("imp", 0.1)]["total"])  # round 2 was found in round 1's weights
    total_is(("reinit", 0.2), cost[("imp", 0.2)]["total"])
    assert cost[("imp", 0.2)]["total"]["flops"] > cost[("imp", 0.1)]["total"]["flops"] > full["flops"]
    q = cost[("quantize", 8)]
    assert q["own"]["flops"] == 0.0 and q["total"]["flops"] == pytest.approx(full["flops"])
