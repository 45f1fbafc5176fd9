"""Good, random and bad head pruning of a fine-tuned classifier (Michel et al. 2019; Prasanna et al. 2020).

For each seed: fine-tune CHECKPOINT on sentence_polarity (`workbench.finetune.run_finetune`), then
prune its heads iteratively (`workbench.compress.heads.iterative_pruning`: 10% of the remaining
heads per step, importance recomputed on the masked model from `--importance-examples` training
sentences, dev accuracy after each step) in three orders: "good" (least important first),
"random" and "bad" (most important first). The number of heads prunable at 90% of the full
model's dev accuracy is the last step at or above that line. With `--refinetune`, the three
subnetworks of the size the "good" order reached are applied as masks to the *pretrained* model
(a derived checkpoint whose manifest records the heads kept) and fine-tuned again with the mask
kept through training (Prasanna et al.'s re-fine-tuned good / random / bad subnetworks).

Writes `<out>/prune_heads.json` (every curve with each step's mask, prunable counts, test accuracy
of each threshold subnetwork, re-fine-tuned accuracies; `prune_heads.partial.json` after each
seed, kept if a time limit cuts the run), results-store rows (run name prune-heads) and a summary. CPU:

    python experiments/prune_heads.py sentence-transformers/all-MiniLM-L6-v2 --seeds 0 --train 1000 \\
        --eval 300 --epochs 2 --lr 1e-4 --importance-examples 128 --threads 1 --out /tmp/prune-heads

GPU: see docs/pruning.md (the whole task, 3 seeds, `--to-end --refinetune`). With the recipe of a
`bertology prune` sweep (so its full models are shared; copy the sweep's `full/seed-S` folders into
`<runs root>/finetune/prune-heads-base/` and they are resumed, not retrained):

    python experiments/prune_heads.py sentence-transformers/all-MiniLM-L6-v2 \
        --recipe experiments/prune/minilm_polarity_cpu3.yaml --seeds 0 1 2 --importance-examples 128 --refinetune

With `--refinetune` (and without `--to-end`) the random and bad curves are pruned on through the
step where "good" stopped, so the three re-fine-tuned subnetworks have the same number of heads.

The `bertology prune` sweep runs the same curves (methods heads_good / heads_random / heads_bad,
`workbench.compress.heads.classifier_curve`, every step a masked checkpoint); this script is kept
for what the sweep does not do: Prasanna et al.'s re-fine-tuning of the good / random / bad
subnetworks from the *pretrained* weights (`--refinetune`), and the three curves of one
fine-tuning in one report (prune_heads.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from workbench.compress import heads as H
from workbench.errors import ConfigError
from workbench.finetune import load_classifier, load_finetune_config, prepare, run_finetune
from workbench.io import atomic_write_json, read_yaml
from workbench.loop import TrainingHooks
from workbench.paths import runs_root


FLAG_DEFAULTS = {"epochs": 3, "batch_size": 32, "lr": 5e-5}  # without --recipe


def _mean_sd(values):
    v = np.asarray(values, dtype=float)
    return {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0, "values": v.tolist()}


def prune_seed(model, run, args, seed: int) -> dict:
    """The three orders' curves for one fine-tuned model, and the test accuracy at each threshold."""
    bs = args.batch_size
    settings = H.HeadPruningSettings(importance_examples=args.importance_examples, run_to_end=args.to_end)
    shape = H.head_shape(model)

    def accuracy(kept, enc=run.dev) -> float:
        return H.masked_accuracy(model, enc, kept, run.pad_id, bs)

    out = {}
    for order in H.ORDERS:  # "good" first: with --refinetune the other orders prune at least as far
        t0 = time.time()
        min_steps = out["good"]["threshold_step"] if args.refinetune and order != "good" else 0
        curve = H.classifier_curve(model, run, order, settings, seed, bs, min_steps=min_steps)
        rec = curve.record()
        best = curve.steps[curve.threshold_step].heads_kept
        rec["test_accuracy_at_threshold"] = accuracy(best, run.test)
        rec["rows"] = H.curve_rows(curve, model=args.checkpoint, family=run.family, seed=seed, task="sentence_polarity",
                                   test_at_threshold=rec["test_accuracy_at_threshold"])
        rec["test_accuracy_full"] = accuracy(np.ones(shape, bool), run.test)
        rec["seconds"] = round(time.time() - t0, 1)
        out[order] = rec
        print(f"seed {seed} {order:6s}: full dev {curve.full:.3f}; {curve.prunable}/{int(np.prod(shape))} heads "
              f"prunable at {curve.threshold:.0%} (dev {curve.steps[curve.threshold_step].metric:.3f}, "
              f"test {rec['test_accuracy_at_threshold']:.3f} vs full {rec['test_accuracy_full']:.3f}); "
              f"{rec['seconds']} s", flush=True)
    return out


def refinetune(args, base_cfg: dict, curves: dict, seed: int) -> dict:
    """Re-fine-tune the pretrained model under each order's mask of the size "good" reached (the
    random and bad curves were pruned at least that far, `prune_seed`; with the base recipe)."""
    from workbench.models import ModelHandle

    step = curves["good"]["threshold_step"]
    base = ModelHandle.load(args.checkpoint)
    res = {"step": step, "n_removed": curves["good"]["steps"][step]["n_removed"]}
    for order in H.ORDERS:
        steps = curves[order]["steps"]
        kept = np.asarray(steps[min(step, len(steps) - 1)]["heads_kept"], bool)
        if min(step, len(steps) - 1) != step:  # the order stopped early: its mask at the nearest step
            res[f"{order}_note"] = f"curve ended at step {len(steps) - 1}"
        # the masked pretrained model, a derived checkpoint named by what it holds (parent and mask)
        key = hashlib.sha256(json.dumps([str(args.checkpoint), kept.tolist()]).encode()).hexdigest()[:12]
        folder = runs_root() / "prune_heads" / "masked" / f"seed-{seed}-{order}-{key}"
        if not folder.is_dir():
            H.masked_handle(base, kept, method="heads", order=order, seed=seed, step=step).save(folder)
        cfg = load_finetune_config({**base_cfg, "checkpoint": str(folder), "seeds": [seed],
                                    "epochs": args.refinetune_epochs or args.epochs,
                                    "name": f"refinetune-{order}-seed-{seed}", "baselines": False})
        r = run_finetune(cfg, hooks=TrainingHooks(after_step=H.mask_keeper(kept)))
        res[order] = {"dev": r.seeds[0].dev["accuracy"], "test": r.seeds[0].test["accuracy"],
                      "n_kept": int(kept.sum()), "checkpoint": str(folder)}
        print(f"seed {seed} re-fine-tuned {order:6s} ({int(kept.sum())} heads): dev {res[order]['dev']:.3f} "
              f"test {res[order]['test']:.3f}", flush=True)
    return res


def recipe(args) -> dict:
    """The fine-tuning recipe: the `finetune:` mapping of `--recipe` (a `bertology prune` sweep
    config, or a `bertology finetune` config) with CHECKPOINT and --seeds, so the full models are
    the sweep's (same training hash: a copy of the sweep's full/seed-S folder in this run's
    prune-heads-base folder is resumed, not retrained); without it, the recipe the flags give."""
    flags = {"max_train_examples": args.train, "max_eval_examples": args.eval, "epochs": args.epochs,
             "lr": args.lr, "batch_size": args.batch_size}
    if args.recipe:
        given = [k for k, v in flags.items() if v is not None]
        if given:
            raise ConfigError(f"--recipe {args.recipe}: the recipe sets the training; drop {', '.join(given)}")
        doc = read_yaml(args.recipe, "recipe")
        base = dict(doc["finetune"] if isinstance(doc.get("finetune"), dict) else doc)
        base.pop("name", None)
        base.pop("output_dir", None)
    else:
        base = {"task": "sentence_polarity", "pooling": "auto", "device": args.device, "threads": args.threads,
                **{**FLAG_DEFAULTS, **{k: v for k, v in flags.items() if v is not None}}}
    if base.get("task", "sentence_polarity") != "sentence_polarity":
        raise ConfigError(f"--recipe {args.recipe}: task {base['task']!r}; this script prunes sentence_polarity")
    return {**base, "checkpoint": args.checkpoint, "seeds": args.seeds, "progress": False}


def _without_rows(report: dict) -> dict:
    return {**report, "seeds": {s: {**e, "curves": {o: {k: v for k, v in c.items() if k != "rows"}
                                                    for o, c in e["curves"].items()}}
                                for s, e in report["seeds"].items()}}


def write_rows(report: dict, rows_by_seed: dict) -> str:
    """Every curve's rows (`workbench.compress.heads.curve_rows`) and the re-fine-tuned accuracies
    as one results-store run named prune-heads (the app's surviving-heads matrix reads it)."""
    from workbench.results import ResultsStore

    rows = []
    for seed, entry in report["seeds"].items():
        for order in H.ORDERS:
            rows += rows_by_seed[seed][order]
        for order in H.ORDERS if "refinetuned" in entry else ():
            r = entry["refinetuned"][order]
            for split in ("dev", "test"):
                rows.append({"model": report["checkpoint"], "seed": int(seed), "probe": H.PROBE,
                             "task": "sentence_polarity", "split": split, "metric": "accuracy_refinetuned",
                             "value": r[split], "extra": {"method": H.METHOD, "order": order,
                                                          "n_kept": r["n_kept"], "checkpoint": r["checkpoint"]}})
    with ResultsStore().start_run("prune", {"method": H.METHOD, **report["args"]}, seeds=[int(s) for s in report["seeds"]],
                                  checkpoints=[e["finetuned"] for e in report["seeds"].values()],
                                  name="prune-heads") as writer:
        writer.add(rows)
        writer.note("summary", report["summary"])
        return writer.run_id


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="pretrained checkpoint folder or Hub name (e.g. MiniLM)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--recipe", help="take the fine-tuning recipe from this YAML's finetune: mapping (a prune "
                    "sweep config, e.g. experiments/prune/minilm_polarity_cpu3.yaml) instead of the flags below")
    ap.add_argument("--train", type=int, default=None, help="training sentences (default: the whole train split)")
    ap.add_argument("--eval", type=int, default=None, help="cap dev and test sentences")
    ap.add_argument("--epochs", type=int, default=None, help=f"default {FLAG_DEFAULTS['epochs']}")
    ap.add_argument("--batch-size", type=int, default=None, help=f"default {FLAG_DEFAULTS['batch_size']}")
    ap.add_argument("--lr", type=float, default=None, help=f"default {FLAG_DEFAULTS['lr']}")
    ap.add_argument("--importance-examples", type=int, default=512)
    ap.add_argument("--to-end", action="store_true", help="prune every order down to zero heads (full curves)")
    ap.add_argument("--refinetune", action="store_true")
    ap.add_argument("--refinetune-epochs", type=int, default=None, help="epochs of each re-fine-tuning (default --epochs)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/prune_heads"),
                    help="where prune_heads.json goes (checkpoints go under the runs root, $BERTOLOGY_RUNS)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    base_cfg = recipe(args)
    cfg = load_finetune_config({**base_cfg, "name": "prune-heads-base"})
    args.batch_size, args.epochs = cfg.batch_size, cfg.epochs
    fine = run_finetune(cfg)
    run = prepare(cfg)
    report = {"checkpoint": args.checkpoint, "args": vars(args), "device": str(run.device), "seeds": {}}
    for r in fine.seeds:
        model = load_classifier(r.checkpoint).to(run.device)
        curves = prune_seed(model, run, args, r.seed)
        entry = {"finetuned": r.checkpoint, "curves": curves}
        report["seeds"][str(r.seed)] = entry
        atomic_write_json(out / "prune_heads.partial.json", _without_rows(report))  # the curves, before re-fine-tuning
        if args.refinetune:  # the same entry, now with the re-fine-tuned accuracies
            entry["refinetuned"] = refinetune(args, base_cfg, curves, r.seed)
            atomic_write_json(out / "prune_heads.partial.json", _without_rows(report))  # kept if a time limit cuts the run
    report["summary"] = {order: {"prunable": _mean_sd([report["seeds"][s]["curves"][order]["prunable"]
                                                        for s in report["seeds"]]),
                                 "test_at_threshold": _mean_sd([report["seeds"][s]["curves"][order]["test_accuracy_at_threshold"]
                                                                for s in report["seeds"]])}
                         for order in H.ORDERS}
    report["summary"]["full_test"] = _mean_sd([report["seeds"][s]["curves"]["good"]["test_accuracy_full"]
                                               for s in report["seeds"]])
    if args.refinetune:
        report["summary"]["refinetuned_test"] = {o: _mean_sd([report["seeds"][s]["refinetuned"][o]["test"]
                                                              for s in report["seeds"]]) for o in H.ORDERS}
    report["seconds"] = round(time.time() - t0, 1)
    rows_by_seed = {s: {o: e["curves"][o]["rows"] for o in H.ORDERS} for s, e in report["seeds"].items()}
    atomic_write_json(out / "prune_heads.json", _without_rows(report))  # first: the evidence, whatever follows
    report["run_id"] = write_rows(report, rows_by_seed)
    atomic_write_json(out / "prune_heads.json", _without_rows(report))
    print(json.dumps(report["summary"], indent=1))
    print(f"wrote {out / 'prune_heads.json'} in {report['seconds']} s")
    return report


if __name__ == "__main__":
    main()
