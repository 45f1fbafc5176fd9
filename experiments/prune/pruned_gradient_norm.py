"""How much of the clipped gradient norm a ticket's pruned weights carried before issue 40.

A retrained ticket's pruned weights are constant zeros, yet the backward pass gives them
gradients. Before issue 40 `clip_grad_norm_` counted them, so whenever clipping was active the
live weights' gradients were scaled by clip / (norm of all gradients) instead of clip / (norm of
the live ones) (`workbench.compress.masks.zero_pruned_gradients` now zeroes them first, as Chen et
al.'s reparametrised pruning does). This measures both norms on the first training batches of a
ticket's retraining: the sweep's one-shot magnitude mask of a fine-tuned classifier at a sparsity,
on the rewound start (the pretrained body under the seed's fresh head, `rewind_step: 0`).

Usage:
    python experiments/prune/pruned_gradient_norm.py CONFIG.yaml --classifier FOLDER [--sparsity 0.5]
Prints a table and writes JSON to --out (default: FOLDER/../pruned_gradient_norm.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> dict:
    import numpy as np
    import torch

    from workbench.drivers.prune_sweep import load_prune_config, rewound
    from workbench.compress.unstructured import dense_layers, magnitude_masks
    from workbench.errors import ConfigError
    from workbench.drivers.finetune import collate, epoch_order, prepare, to_model_device
    from workbench.running.classifier_loading import build_classifier, load_classifier
    from workbench.io import atomic_write_json

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="the prune sweep config (finetune: gives the data, seed and clip)")
    p.add_argument("--classifier", type=Path, required=True, help="the seed's fine-tuned full classifier folder")
    p.add_argument("--sparsity", type=float, default=0.5)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not 0 < args.sparsity < 1:
        raise ConfigError(f"--sparsity: a fraction in (0, 1), got {args.sparsity}")
    if args.batches < 1:
        raise ConfigError(f"--batches: at least 1, got {args.batches}")
    if not (args.classifier / "config.json").is_file():
        raise ConfigError(f"--classifier: {args.classifier} holds no config.json")
    torch.set_num_threads(1)
    cfg, ft = load_prune_config(args.config)
    seed = ft.seeds[0]
    with tempfile.TemporaryDirectory() as tmp:
        run = prepare(dataclasses.replace(ft, output_dir=tmp))
    full = load_classifier(args.classifier)
    names = list(dense_layers(full, cfg.include_embeddings, cfg.include_head, cfg.include_pooler))
    masks = magnitude_masks(full, names, args.sparsity)
    torch.manual_seed(seed)
    start = build_classifier(run.checkpoint, run.family, run.data.kind, run.pooling, run.data.label_names,
                             run.pad_id).state_dict()
    model = rewound(full, start, masks).train()
    params = dict(model.named_parameters())
    order = epoch_order(seed, 0, len(run.train.ids))
    rows = []
    for b in range(min(args.batches, -(-len(order) // ft.batch_size))):
        batch = to_model_device(collate(run.train, [int(i) for i in order[b * ft.batch_size:(b + 1) * ft.batch_size]], run.pad_id),
                    model)
        model(**batch).loss.backward()
        all_sq = sum(float(p.grad.double().pow(2).sum()) for p in params.values() if p.grad is not None)
        pruned_sq = sum(float(params[n].grad.double()[~m].pow(2).sum()) for n, m in masks.items())
        model.zero_grad(set_to_none=True)
        norm_all, norm_live = all_sq ** 0.5, (all_sq - pruned_sq) ** 0.5
        rows.append({"batch": b, "norm_all": norm_all, "norm_live": norm_live,
                     "scale_before": min(1.0, ft.clip / norm_all), "scale_after": min(1.0, ft.clip / norm_live)})
        print(f"batch {b}: norm all {norm_all:.3f}  live {norm_live:.3f}  live-gradient scale at clip {ft.clip}: "
              f"before {rows[-1]['scale_before']:.3f}  after {rows[-1]['scale_after']:.3f}", flush=True)
    ratio = np.array([r["norm_all"] / r["norm_live"] for r in rows])
    summary = {"classifier": str(args.classifier), "sparsity": args.sparsity, "clip": ft.clip,
               "prunable": len(names), "ratio_mean": float(ratio.mean()), "ratio_max": float(ratio.max()),
               "clipped_before": float(np.mean([r["norm_all"] > ft.clip for r in rows])),
               "clipped_after": float(np.mean([r["norm_live"] > ft.clip for r in rows])), "rows": rows}
    out = args.out or args.classifier.parent / "pruned_gradient_norm.json"
    atomic_write_json(out, summary)
    print(f"norm(all) / norm(live): mean {summary['ratio_mean']:.3f}, max {summary['ratio_max']:.3f}; clipping active "
          f"on {summary['clipped_before']:.0%} of batches before, {summary['clipped_after']:.0%} after; JSON: {out}")
    return summary


if __name__ == "__main__":
    from workbench.errors import ConfigError

    try:
        main()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
