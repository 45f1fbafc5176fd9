"""Held-out masked-LM loss of the pretraining tickets against one-shot and random masks.

The pretraining ticket (Chen et al. 2020, Sec. 5; `workbench.drivers.pretraining_ticket`) is the
pretrained weights theta_0 times the mask IMP finds for the masked-LM loss. Before any task
fine-tuning, how much of the pretrained model's masked-LM ability does each subnetwork keep? For
each sparsity this evaluates, on the same fixed held-out batches of the checkpoint's own corpus
(`workbench.drivers.train.evaluate_heldout`): theta_0 x the MLM-IMP mask, theta_0 x a one-shot global
magnitude mask of theta_0 (`magnitude_masks`), and theta_0 x a uniformly random mask of the same
sparsity (`random_masks`), all without retraining; the unpruned model is the reference.

The MLM-IMP rounds are read from a finished `bertology prune` sweep's round folder (the sweep's
`mlm:` settings; `mlm_tickets` finds finished rounds and does not train).

Usage (the reference sweep, experiments/prune/reference_polarity.yaml):
    python experiments/prune/mlm_ticket_loss.py CONFIG.yaml --checkpoint CKPT [--sparsities 0.3,0.5,0.7]
Prints a table and writes JSON to --out (default: <rounds folder>/mlm_ticket_loss.json).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> dict:
    import torch

    from workbench.compress.masks import apply_masks, mask_sparsity, sparsity
    from workbench.drivers.pretraining_ticket import (load_mlm_settings, mlm_tickets, pretraining_manifest,
                                                       round_config)
    from workbench.drivers.prune_sweep import load_prune_config, mlm_sparsities
    from workbench.compress.unstructured import dense_layers, magnitude_masks, random_masks
    from workbench.families import get_family
    from workbench.store.checkpoints import single_checkpoint
    from workbench.io import atomic_write_json
    from workbench.drivers.train import evaluate_heldout, prepare_data

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="the prune sweep config (its finetune: and mlm: sections)")
    p.add_argument("--checkpoint", help="replaces finetune.checkpoint")
    p.add_argument("--rounds", help="the MLM rounds folder (default: mlm.output_dir)")
    p.add_argument("--sparsities", help="comma-separated (default: mlm.sparsities)")
    p.add_argument("--batches", type=int, default=8, help="held-out batches")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    cfg, ft = load_prune_config(args.config, None, {"checkpoint": args.checkpoint})
    settings = load_mlm_settings(cfg.mlm, args.config)
    rounds = Path(args.rounds or settings.output_dir)
    amounts = [float(x) for x in args.sparsities.split(",")] if args.sparsities else mlm_sparsities(cfg)
    checkpoint = single_checkpoint(ft.checkpoint).resolve()
    manifest = pretraining_manifest(checkpoint)
    family = get_family(manifest["family"])
    tickets, pretrained, _ = mlm_tickets(checkpoint, max(amounts), cfg.imp_step, settings, rounds, device="cpu",
                                      log=lambda _: None)
    train_cfg = round_config(manifest, settings, checkpoint, rounds / "round-1", "cpu", False)
    data = prepare_data(train_cfg, family)
    names = list(dense_layers(pretrained))
    loader = importlib.import_module(f"workbench.families.{manifest['family']}").load_pretrainer

    def loss(masks):
        model = loader(checkpoint)
        if masks is not None:
            apply_masks(model, masks)
            assert abs(sparsity(model, names) - mask_sparsity(masks)) < 1e-6
        return evaluate_heldout(model, family, data.heldout, data.tokenizer, train_cfg, args.batches,
                                torch.device("cpu"))["mlm"]

    full = loss(None)
    out = {"checkpoint": str(checkpoint), "rounds": str(rounds), "batches": args.batches,
           "batch_size": train_cfg.batch_size, "full": full, "points": []}
    print(f"unpruned: held-out MLM loss {full:.4f}")
    print(f"{'sparsity':>8} {'mlm_imp':>8} {'oneshot':>8} {'random':>8}")
    for a in amounts:
        row = {"sparsity": a, "mlm_imp": loss(tickets[a]), "oneshot": loss(magnitude_masks(pretrained, names, a)),
               "random": loss(random_masks(pretrained, names, a, seed=round(a * 1000)))}
        out["points"].append(row)
        print(f"{a:>8.2f} {row['mlm_imp']:>8.4f} {row['oneshot']:>8.4f} {row['random']:>8.4f}", flush=True)
    atomic_write_json(args.out or rounds / "mlm_ticket_loss.json", out)
    return out


if __name__ == "__main__":
    main()
