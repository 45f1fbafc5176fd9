"""Good, random and bad head pruning of a fine-tuned classifier (Michel et al. 2019; Prasanna et al. 2020).

For each seed: fine-tune CHECKPOINT on sentence_polarity (`workbench.drivers.finetune.run_finetune`), then
prune its heads iteratively (`workbench.drivers.head_pruning.iterative_pruning`: 10% of all heads per
step, `--step-of total`, as in Michel et al.'s and Prasanna et al.'s code; `--step-of remaining`:
10% of the heads still present, the earlier variant; importance recomputed on the masked model
from the first `--importance-examples` dev sentences, one absolute gradient per sentence as in the
papers' scripts (`--importance-split train`, `--importance-batch N|finetune`: the variants), dev
accuracy after each step) in three orders:
"good" (least important first), "random" and "bad" (most important first). The number of heads
prunable at 90% of the full model's dev accuracy is the last step at or above that line.
`--units both` prunes heads and MLPs (Prasanna et al.: joint steps, then heads-only half steps and
MLP-only steps, `--both-schedule continue`; `joint`: the joint steps only), `--units mlps` MLPs.

The three subnetworks compared (`--subnetworks equal_size`, the default: Prasanna et al.'s
comparison): "good" is the good order's mask at the threshold; "random" and "bad" have its size:
random = as many heads drawn uniformly, bad = drawn from the heads the good procedure pruned
(topped up from the good ones when too few were pruned; `heads.equal_size_subnetwork`). Each
subnetwork's dev and test accuracy is measured on the fine-tuned model. `--subnetworks threshold`:
each order's own mask where its curve crosses the threshold (the earlier comparison). With
`--refinetune`, the three subnetworks are applied as masks to the *pretrained* model (a derived
checkpoint whose manifest records the heads kept) and fine-tuned again with the mask kept through
training (Prasanna et al.'s re-fine-tuned good / random / bad subnetworks).

Writes `<out>/prune_heads.json` (every curve with each step's mask, prunable counts, each
subnetwork with its mask and accuracies, re-fine-tuned accuracies; `prune_heads.partial.json` after
each seed, kept if a time limit cuts the run), results-store rows (run name prune-heads) and a
summary. A bad option value is one line on stderr and exit 2, before any work. CPU:

    python experiments/prune_heads.py sentence-transformers/all-MiniLM-L6-v2 --seeds 0 --train 1000 \\
        --eval 300 --epochs 2 --lr 1e-4 --importance-examples 128 --threads 1 --out /tmp/prune-heads

GPU: see docs/evidence/pruning.md (the whole task, 3 seeds, `--to-end --refinetune`). With the recipe of a
`bertology prune` sweep (so its full models are shared; copy the sweep's `full/seed-S` folders into
`<runs root>/finetune/prune-heads-base/` and they are resumed, not retrained):

    python experiments/prune_heads.py sentence-transformers/all-MiniLM-L6-v2 \
        --recipe experiments/prune/minilm_polarity_cpu3.yaml --seeds 0 1 2 --importance-examples 128 --refinetune

With `--subnetworks threshold --refinetune` (and without `--to-end`) the random and bad curves are
pruned on through the step where "good" stopped, and their masks at that step are re-fine-tuned
(the earlier equal-size comparison, by order rather than by Prasanna et al.'s construction).

The `bertology prune` sweep runs the same curves and subnetworks (methods heads_good / heads_random
/ heads_bad, `workbench.drivers.head_pruning.classifier_curve`, every step a masked checkpoint) and,
with `heads: {refinetune: true}`, the re-fine-tuning as a stage of its units (`--jobs`,
`--executor slurm`); this script's `--refinetune` calls that stage's unit for each subnetwork
(`workbench.drivers.prune_sweep.refinetune_unit`: the same weights), and the script is kept for the
three curves of one fine-tuning in one report (prune_heads.json) and `--subnetworks threshold`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from workbench.drivers import head_pruning as H
from workbench.errors import ConfigError
from workbench.drivers.finetune import load_finetune_config, prepare, run_finetune
from workbench.running.classifier_loading import load_classifier
from workbench.io import atomic_write_json, read_yaml
from workbench.paths import runs_root


FLAG_DEFAULTS = {"epochs": 3, "batch_size": 32, "lr": 5e-5}  # without --recipe


def _mean_sd(values):
    v = np.asarray(values, dtype=float)
    return {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0, "values": v.tolist()}


def head_settings(args) -> H.HeadPruningSettings:
    """The pruning settings of the flags, checked (a bad value is one `ConfigError`)."""
    return H.load_settings({"importance_examples": args.importance_examples, "run_to_end": args.to_end,
                            "step_of": args.step_of, "subnetworks": args.subnetworks,
                            "importance_split": args.importance_split, "importance_batch": args.importance_batch,
                            "units": args.units, "both_schedule": args.both_schedule}, "prune_heads.py")


def _mlps(step) -> np.ndarray | None:
    """A step's MLP mask (a `PruningStep` or its record), None when only heads were pruned."""
    m = step.mlps_kept if isinstance(step, H.PruningStep) else step.get("mlps_kept")
    return None if m is None else np.asarray(m, bool)


def prune_seed(model, run, args, seed: int) -> dict:
    """The three orders' curves for one fine-tuned model, each order's subnetwork (`--subnetworks`)
    and its dev and test accuracy."""
    bs = args.batch_size
    settings = head_settings(args)
    shape = H.head_shape(model)

    def accuracy(kept, mlps=None, enc=run.dev) -> float:
        return H.masked_accuracy(model, enc, kept, run.pad_id, bs, mlps)

    out, curves = {}, {}
    for order in H.ORDERS:  # "good" first: the other orders' subnetworks are sized by it
        t0 = time.time()
        old_refinetune = args.refinetune and settings.subnetworks == "threshold" and order != "good"
        min_steps = out["good"]["threshold_step"] if old_refinetune else 0
        curve = curves[order] = H.classifier_curve(model, run, order, settings, seed, bs, min_steps=min_steps)
        rec = curve.record()
        sub = H.order_subnetwork(curves, order, seed, settings.subnetworks)
        sub_dev = accuracy(sub.heads_kept, _mlps(sub)) if np.isnan(sub.metric) else sub.metric
        rec["subnetwork"] = {"kind": settings.subnetworks if order != "good" else "threshold", "step": sub.step,
                             "n_removed": sub.n_removed, "heads_kept": sub.heads_kept.astype(bool).tolist(),
                             **({} if sub.mlps_kept is None else {"mlps_kept": sub.mlps_kept.astype(bool).tolist(),
                                                                  "n_mlps_removed": sub.n_mlps_removed}),
                             "dev": sub_dev, "test": accuracy(sub.heads_kept, _mlps(sub), run.test)}
        best = curve.steps[curve.threshold_step]
        rec["test_accuracy_at_threshold"] = accuracy(best.heads_kept, _mlps(best), run.test)
        rec["rows"] = H.curve_rows(curve, model=args.checkpoint, family=run.family, seed=seed, task="sentence_polarity",
                                   test_at_threshold=rec["subnetwork"]["test"], subnetwork=sub,
                                   subnetwork_kind=rec["subnetwork"]["kind"])
        rec["test_accuracy_full"] = accuracy(np.ones(shape, bool), enc=run.test)
        rec["seconds"] = round(time.time() - t0, 1)
        out[order] = rec
        mlps_note = f" and {curve.mlps_prunable}/{shape[0]} MLPs" if settings.units != "heads" else ""
        print(f"seed {seed} {order:6s}: full dev {curve.full:.3f}; {curve.prunable}/{int(np.prod(shape))} heads{mlps_note} "
              f"prunable at {curve.threshold:.0%} (dev {curve.steps[curve.threshold_step].metric:.3f}, "
              f"test {rec['test_accuracy_at_threshold']:.3f} vs full {rec['test_accuracy_full']:.3f}); "
              f"subnetwork ({rec['subnetwork']['kind']}, {sub.n_removed} removed): dev {sub_dev:.3f} "
              f"test {rec['subnetwork']['test']:.3f}; {rec['seconds']} s", flush=True)
    return out


def refinetune(args, base_cfg: dict, curves: dict, seed: int) -> dict:
    """Re-fine-tune the pretrained model under each order's subnetwork of the size "good" reached
    (`--subnetworks equal_size`: Prasanna et al.'s random and bad subnetworks; `threshold`: the
    random and bad curves' masks at that step, `prune_seed` pruned them that far), with the base
    recipe: each one the prune sweep's re-fine-tuning unit (`workbench.drivers.prune_sweep.
    refinetune_unit`, what `bertology prune` with `heads: {refinetune: true}` runs as a stage of its
    units), under `<runs root>/prune_heads/refinetuned/seed-S-ORDER/`."""
    from workbench.drivers.prune_sweep import refinetune_unit

    step = curves["good"]["threshold_step"]
    res = {"step": step, "n_removed": curves["good"]["steps"][step]["n_removed"], "subnetworks": args.subnetworks}
    ft = load_finetune_config({**base_cfg, "epochs": args.refinetune_epochs or args.epochs})
    for order in H.ORDERS:
        if args.subnetworks == "equal_size":  # Prasanna et al.'s subnetworks, all of the good one's size
            kept, mlps = np.asarray(curves[order]["subnetwork"]["heads_kept"], bool), _mlps(curves[order]["subnetwork"])
        else:  # the earlier comparison: each order's curve at the step "good" reached
            steps = curves[order]["steps"]
            kept, mlps = np.asarray(steps[min(step, len(steps) - 1)]["heads_kept"], bool), _mlps(steps[min(step, len(steps) - 1)])
            if min(step, len(steps) - 1) != step:  # the order stopped early: its mask at the nearest step
                res[f"{order}_note"] = f"curve ended at step {len(steps) - 1}"
        r = refinetune_unit(ft, str(runs_root() / "prune_heads"), seed, order, step, kept.tolist(),
                            None if mlps is None else mlps.tolist())
        res[order] = {k: r[k] for k in ("dev", "test", "n_kept", "checkpoint", "n_mlps_kept") if k in r}
        print(f"seed {seed} re-fine-tuned {order:6s} ({int(kept.sum())} heads"
              f"{'' if mlps is None else f', {int(mlps.sum())} MLPs'}): dev {res[order]['dev']:.3f} "
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
    """Every curve's rows (`workbench.drivers.head_pruning.curve_rows`) and the re-fine-tuned accuracies
    as one results-store run named prune-heads (the app's surviving-heads matrix reads it)."""
    from workbench.store.results import ResultsStore

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
    ap.add_argument("--importance-examples", type=int, default=512, help="at most this many (the first) examples")
    ap.add_argument("--importance-split", default="dev", help="dev (the papers' scripts) or train (before issue 49)")
    ap.add_argument("--importance-batch", default="1", help="examples per absolute gradient: 1 (Michel et al.'s "
                    "E_x|dL(x)/dxi|), N, or finetune (the fine-tuning batch, before issue 49)")
    ap.add_argument("--units", default="heads", help="heads, mlps or both (Prasanna et al.)")
    ap.add_argument("--both-schedule", default="continue", help="units both: continue (Prasanna et al.'s heads-only "
                    "and MLP-only steps after the joint ones) or joint (the joint steps only, before issue 49)")
    ap.add_argument("--to-end", action="store_true", help="prune every order down to zero heads (full curves)")
    ap.add_argument("--step-of", default="total", help="what each step's 10%% is a share of: total (all heads, "
                    "the papers' schedule; default) or remaining (the heads still present, the earlier variant)")
    ap.add_argument("--subnetworks", default="equal_size", help="equal_size (random and bad subnetworks of the "
                    "good one's size, Prasanna et al.; default) or threshold (each order's own threshold mask)")
    ap.add_argument("--refinetune", action="store_true")
    ap.add_argument("--refinetune-epochs", type=int, default=None, help="epochs of each re-fine-tuning (default --epochs)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/prune_heads"),
                    help="where prune_heads.json goes (checkpoints go under the runs root, $BERTOLOGY_RUNS)")
    args = ap.parse_args(argv)
    try:  # every setting checked before any work: one line and exit 2
        head_settings(args)
        base_cfg = recipe(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

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
                                                                for s in report["seeds"]]),
                                 "subnetwork_test": _mean_sd([report["seeds"][s]["curves"][order]["subnetwork"]["test"]
                                                              for s in report["seeds"]]),
                                 "subnetwork_heads_removed": _mean_sd([report["seeds"][s]["curves"][order]["subnetwork"]["n_removed"]
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
