"""experiments/prune_heads.py end to end on a tiny BERT (2 layers x 2 heads, hidden 32) and 64
real sentence_polarity sentences: `--recipe` takes a sweep config's fine-tuning recipe and resumes
a copy of that sweep's full model instead of retraining it, and `--refinetune` re-fine-tunes the
good / random / bad subnetworks of the same size (Prasanna et al. 2020) with their masks kept.
The accuracies mean nothing at this size; the sizes, the masks and the resume are exact."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from workbench.drivers.prune_sweep import load_prune_config, run_prune
from workbench.running.classifier_loading import load_classifier
from workbench.store.results import ResultsStore

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("prune_heads_script", ROOT / "experiments" / "prune_heads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_recipe_resumes_the_sweeps_full_model_and_refinetunes_equal_sized_subnetworks(tiny_checkpoint, tmp_path,
                                                                                    monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setenv("BERTOLOGY_RUNS", str(runs))
    recipe = {"finetune": {"checkpoint": str(tiny_checkpoint), "task": "sentence_polarity", "seeds": [0], "epochs": 1,
                           "lr": 1e-3, "batch_size": 16, "max_len": 32, "max_train_examples": 64,
                           "max_eval_examples": 48, "baselines": False, "device": "cpu", "progress": False},
              "methods": ["random"], "sparsities": [0.5], "imp_step": 0.5}
    cfg_file = tmp_path / "sweep.yaml"
    cfg_file.write_text(yaml.safe_dump(recipe))
    # the sweep's full model, copied where the script's base fine-tuning looks for it
    cfg, ft = load_prune_config(cfg_file, {"output_dir": str(tmp_path / "sweep"), "progress": False})
    run_prune(cfg, ft, store=ResultsStore(tmp_path / "store"))
    base = runs / "finetune" / "prune-heads-base"
    base.mkdir(parents=True)
    shutil.copytree(tmp_path / "sweep" / "full" / "seed-0", base / "seed-0")
    full = load_classifier(tmp_path / "sweep" / "full" / "seed-0" / "best")

    # a planted head metric and importance (as in test_compress_heads' planted task), so "good"
    # reaches a later step than "bad" and the script must prune "bad" past its own threshold
    from types import SimpleNamespace

    from workbench.drivers import head_pruning as H

    value = np.array([[0.05, 3.0], [0.1, 0.3]])  # the tiny BERT: 2 layers x 2 heads
    monkeypatch.setattr(H, "masked_accuracy", lambda model, enc, kept, *a, **k: float((value * kept).sum() / value.sum()))
    monkeypatch.setattr(H, "head_importance", lambda model, batches, heads_kept=None, mlps_kept=None, **_:
                        SimpleNamespace(heads=value, mlps=None))
    script = _script()
    report = script.main([str(tiny_checkpoint), "--recipe", str(cfg_file), "--seeds", "0", "--importance-examples",
                          "16", "--refinetune", "--out", str(tmp_path / "out")])
    entry = report["seeds"]["0"]
    # resumed, not retrained: the script's fine-tuned model is the sweep's, weight for weight
    resumed = load_classifier(entry["finetuned"])
    assert all(torch.equal(a, b) for a, b in zip(full.state_dict().values(), resumed.state_dict().values()))
    # the three subnetworks re-fine-tuned at the size "good" reached (Prasanna et al.): good's mask,
    # a random draw of as many heads, and bad, drawn from the heads good pruned
    ref, curves = entry["refinetuned"], entry["curves"]
    step = curves["good"]["threshold_step"]
    # good removes the two smallest heads (metric 0.957) and stops at the third (0.870); bad at once
    assert step == 2 and curves["bad"]["threshold_step"] == 0
    assert len(curves["bad"]["steps"]) == 2  # bad's curve stops at its own line: its subnetwork is sized by good's
    sizes = {o: ref[o]["n_kept"] for o in ("good", "random", "bad")}
    assert sizes == {"good": 2, "random": 2, "bad": 2} and ref["subnetworks"] == "equal_size"
    good_kept = np.asarray(curves["good"]["steps"][step]["heads_kept"], bool)
    assert good_kept.tolist() == [[False, True], [False, True]]
    masks = {o: np.asarray(curves[o]["subnetwork"]["heads_kept"], bool) for o in ("good", "random", "bad")}
    assert np.array_equal(masks["good"], good_kept) and np.array_equal(masks["bad"], ~good_kept)
    # each re-fine-tuned model kept its mask: the removed heads' output columns are exactly zero
    for order in ("good", "random", "bad"):
        kept = masks[order]
        trained = load_classifier(runs / "finetune" / f"refinetune-{order}-seed-0" / "seed-0" / "best")
        d = trained.config.hidden_size // trained.config.num_attention_heads
        for layer, heads in enumerate(kept):
            w = trained.bert.encoder.layer[layer].attention.output.dense.weight
            for h, k in enumerate(heads):
                assert (torch.count_nonzero(w[:, h * d:(h + 1) * d]) > 0) == bool(k)
    saved = json.loads((tmp_path / "out" / "prune_heads.json").read_text())
    assert saved["summary"]["refinetuned_test"]["good"]["values"] == [ref["good"]["test"]]
