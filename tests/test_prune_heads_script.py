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
        trained = load_classifier(runs / "prune_heads" / "refinetuned" / f"seed-0-{order}" / "finetune" / "seed-0" / "best")
        d = trained.config.hidden_size // trained.config.num_attention_heads
        for layer, heads in enumerate(kept):
            w = trained.bert.encoder.layer[layer].attention.output.dense.weight
            for h, k in enumerate(heads):
                assert (torch.count_nonzero(w[:, h * d:(h + 1) * d]) > 0) == bool(k)
    saved = json.loads((tmp_path / "out" / "prune_heads.json").read_text())
    assert saved["summary"]["refinetuned_test"]["good"]["values"] == [ref["good"]["test"]]


REFINETUNE_SWEEP = {"methods": ["heads_good", "heads_random", "heads_bad"], "heads": {"refinetune": True,
                                                                                     "importance_examples": 16}}


@pytest.mark.slow
def test_the_sweeps_refinetune_stage_gives_the_scripts_subnetworks_and_weights(tiny_checkpoint, tmp_path, monkeypatch):
    """`bertology prune` with `heads: {refinetune: true}` (issue 51: the re-fine-tuning as a stage of
    the sweep's units) re-fine-tunes the same good / random / bad subnetworks as
    experiments/prune_heads.py --refinetune on the same fine-tuned model: the same masks, the same
    accuracies, the same weights, and the script's rows (metric accuracy_refinetuned). (Before the
    script called the stage's unit, this test held against its own loop too.)"""
    from types import SimpleNamespace

    from workbench.drivers import head_pruning as H
    from workbench.running.model_loading import load_tensors

    runs = tmp_path / "runs"
    monkeypatch.setenv("BERTOLOGY_RUNS", str(runs))
    finetune = {"checkpoint": str(tiny_checkpoint), "task": "sentence_polarity", "seeds": [0], "epochs": 1,
                "lr": 1e-3, "batch_size": 16, "max_len": 32, "max_train_examples": 64, "max_eval_examples": 48,
                "baselines": False, "device": "cpu", "progress": False}
    value = np.array([[0.05, 3.0], [0.1, 0.3]])  # planted, as above: good stops at step 2
    monkeypatch.setattr(H, "masked_accuracy", lambda model, enc, kept, *a, **k: float((value * kept).sum() / value.sum()))
    monkeypatch.setattr(H, "head_importance", lambda model, batches, heads_kept=None, mlps_kept=None, **_:
                        SimpleNamespace(heads=value, mlps=None))
    cfg_file = tmp_path / "sweep.yaml"
    cfg_file.write_text(yaml.safe_dump({"finetune": finetune, **REFINETUNE_SWEEP}))
    cfg, ft = load_prune_config(cfg_file, {"output_dir": str(tmp_path / "sweep"), "progress": False})
    swept = run_prune(cfg, ft, store=ResultsStore(tmp_path / "store"))
    base = runs / "finetune" / "prune-heads-base"
    base.mkdir(parents=True)
    shutil.copytree(tmp_path / "sweep" / "full" / "seed-0", base / "seed-0")
    report = _script().main([str(tiny_checkpoint), "--recipe", str(cfg_file), "--seeds", "0", "--importance-examples",
                             "16", "--refinetune", "--out", str(tmp_path / "out")])
    ref = report["seeds"]["0"]["refinetuned"]
    rows = swept.rows[swept.rows["metric"] == "accuracy_refinetuned"]
    assert len(rows) == 6
    for order in H.ORDERS:
        point = json.loads((tmp_path / "sweep" / "refinetuned" / f"seed-0-{order}" / "point.json").read_text())
        assert (point["dev"], point["test"], point["n_kept"]) == (ref[order]["dev"], ref[order]["test"], ref[order]["n_kept"])
        got = {s: float(rows[(rows["split"] == s) & rows["extra"].map(lambda e: e["order"] == order)]["value"].iloc[0])
               for s in ("dev", "test")}
        assert got == {"dev": ref[order]["dev"], "test": ref[order]["test"]}
        ours = tmp_path / "sweep" / "refinetuned" / f"seed-0-{order}" / "finetune" / "seed-0" / "best"
        theirs = runs / "prune_heads" / "refinetuned" / f"seed-0-{order}" / "finetune" / "seed-0" / "best"
        a, b = load_tensors(ours / "model.safetensors"), load_tensors(theirs / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("executor", [pytest.param("local"), pytest.param("slurm", marks=pytest.mark.slurm)])
def test_the_refinetune_stage_in_local_processes_writes_the_rows_of_the_in_process_sweep(executor, request,
                                                                                      tiny_checkpoint, tmp_path,
                                                                                      monkeypatch):
    """The re-fine-tunings as units in two local processes (`--jobs 2`) or as Slurm jobs on the test
    session's cluster: the rows of the same sweep run in this process, value for value (one torch
    thread in both)."""
    from app.cli import main
    from tests.slurm_cluster import executor_flags

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
        finetune = {"checkpoint": str(tiny_checkpoint), "task": "sentence_polarity", "seeds": [0], "epochs": 1,
                    "lr": 1e-3, "batch_size": 16, "max_len": 32, "max_train_examples": 64, "max_eval_examples": 48,
                    "baselines": False, "device": "cpu", "threads": 1}
        config = {"finetune": finetune, **REFINETUNE_SWEEP, "name": "tiny-heads", "progress": False}
        cfg, ft = load_prune_config({**config, "output_dir": str(tmp_path / "seq")})
        seq = run_prune(cfg, ft, store=ResultsStore(tmp_path / "store-seq"))
        path = tmp_path / "prune.yaml"
        path.write_text(yaml.safe_dump(config))
        flags = executor_flags(executor, request) if executor == "slurm" else []
        assert main(["prune", str(path), "--output-dir", str(tmp_path / "par"), "--jobs", "2", *flags]) == 0
    finally:
        torch.set_num_threads(before)
    store = ResultsStore(tmp_path / "runs")
    par = store.read(store.runs(name="tiny-heads")["run_id"].iloc[-1])
    seq_rows = ResultsStore(tmp_path / "store-seq").read(seq.run_id)

    def refinetuned(df):
        df = df[df["metric"] == "accuracy_refinetuned"]
        return sorted((int(r.seed), r.split, json.loads(r.extra)["order"] if isinstance(r.extra, str) else r.extra["order"],
                       r.value) for r in df.itertuples())

    assert len(refinetuned(par)) == 6 and refinetuned(par) == refinetuned(seq_rows)
    assert len(par) == len(seq_rows)
