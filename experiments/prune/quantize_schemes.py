"""Accuracy of a fine-tuned classifier under the fake-quantization schemes of `bertology prune`.

`workbench.compress.quantize` has two weight schemes: `per_channel` (one symmetric scale per output
channel, over the prunable set; the sweep's default) and `q8bert` (Zafrir et al. 2019: one
symmetric scale per tensor, over every embedding and dense layer). This evaluates one classifier
(e.g. a sweep's `full/seed-S/best`) on the sweep's dev and test sets under each, at each bit width,
with no retraining, beside the per-channel scheme without the pooler (the sweeps before issue 40
quantized the block matrices only):

    per_channel, blocks        the block matrices (include_pooler: false)
    per_channel, blocks+pooler the sweep's default prunable set
    q8bert                     embeddings, blocks, pooler, classifier; one scale per tensor

Usage:
    python experiments/prune/quantize_schemes.py CONFIG.yaml --classifier FOLDER [--bits 8,4,3,2,1]
Prints a table and writes JSON to --out (default: FOLDER/../quantize_schemes.json).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

VARIANTS = (("per_channel, blocks", "per_channel", False), ("per_channel, blocks+pooler", "per_channel", True),
            ("q8bert", "q8bert", False))


def main(argv=None) -> dict:
    import torch

    from workbench.compress.quantize import fake_quantize, quantized_layers
    from workbench.drivers.prune_sweep import load_prune_config
    from workbench.errors import ConfigError
    from workbench.drivers.finetune import evaluate, prepare
    from workbench.running.classifier_loading import load_classifier
    from workbench.io import atomic_write_json

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="the prune sweep config (its finetune: section gives the data)")
    p.add_argument("--classifier", type=Path, required=True, help="a fine-tuned classifier folder")
    p.add_argument("--bits", default="8,4,3,2,1", help="comma-separated bit widths, each 1-8")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    try:
        bits = [int(b) for b in args.bits.split(",")]
    except ValueError:
        raise ConfigError(f"--bits: comma-separated integers, got {args.bits!r}") from None
    if not bits or any(not 1 <= b <= 8 for b in bits):
        raise ConfigError(f"--bits: each from 1 to 8, got {args.bits!r}")
    if not (args.classifier / "config.json").is_file():
        raise ConfigError(f"--classifier: {args.classifier} holds no config.json")
    torch.set_num_threads(1)
    cfg, ft = load_prune_config(args.config)
    with tempfile.TemporaryDirectory() as tmp:
        run = prepare(dataclasses.replace(ft, output_dir=tmp))
    full = load_classifier(args.classifier).eval()

    def accuracy(model) -> dict:
        return {split: evaluate(model, getattr(run, split), list(range(len(getattr(run, split).ids))), run.pad_id,
                                ft.batch_size)[0] for split in ("dev", "test")}

    rows = [{"variant": "float32", "bits": 32, "quantized": 0, **accuracy(full)}]
    for label, scheme, pooler in VARIANTS:
        n = sum(m.weight.numel() for m in quantized_layers(full, scheme, include_pooler=pooler).values())
        for b in bits:
            model = fake_quantize(copy.deepcopy(full), b, include_pooler=pooler, scheme=scheme)
            rows.append({"variant": label, "bits": b, "quantized": n, **accuracy(model)})
            print(f"{label:<28} {b:>2} bits  {n:>10,} weights  dev {rows[-1]['dev']:.4f}  test {rows[-1]['test']:.4f}",
                  flush=True)
    out = args.out or args.classifier.parent / "quantize_schemes.json"
    result = {"classifier": str(args.classifier), "config": str(args.config), "rows": rows}
    atomic_write_json(out, result)
    print(f"float32: dev {rows[0]['dev']:.4f} test {rows[0]['test']:.4f}; JSON: {out}")
    return result


if __name__ == "__main__":
    from workbench.errors import ConfigError

    try:
        main()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
