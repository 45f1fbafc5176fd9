"""A three-link lineage for the cost table (docs/cost.md): a pretrained checkpoint -> fine-tuned
(`bertology finetune`) -> magnitude-pruned (Han et al. 2015: the 30% smallest weights of every
linear layer set to zero, through `ModelHandle.derive`, then saved). Prints `bertology cost` of
the three: the pruned model trains nothing (own FLOPs 0) and carries its ancestors' total.

Usage: python experiments/cost/lineage_demo.py FINETUNED_BEST_FOLDER OUT_FOLDER [--fraction 0.3]
"""

from __future__ import annotations

import argparse
import sys

import torch

from workbench.cost import checkpoint_cost, format_cost_table, lineage_chain
from workbench.errors import cli_errors
from workbench.running.models import ModelHandle


def magnitude_prune(model, fraction: float):
    """Zero the `fraction` smallest-magnitude weights of every nn.Linear (per layer)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight
                k = int(fraction * w.numel())
                if k:
                    cut = w.abs().flatten().kthvalue(k).values
                    w[w.abs() <= cut] = 0.0
    return model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("finetuned")
    p.add_argument("out")
    p.add_argument("--fraction", type=float, default=0.3)
    args = p.parse_args(argv)
    handle = ModelHandle.load(args.finetuned)
    pruned = handle.derive("magnitude_prune", {"fraction": args.fraction}, apply=magnitude_prune)
    folder = pruned.save(args.out)
    print(format_cost_table([str(x) for x in lineage_chain(folder)]))
    print(f"pruned total FLOPs {checkpoint_cost(folder)['total']['flops']}")
    return 0


if __name__ == "__main__":
    sys.exit(cli_errors(main))
