"""Gradient head importance vs leave-one-head-out ablation: time and agreement (Michel et al. 2019).

Same model, same sentences, same loss: (a) `workbench.drivers.head_pruning.head_importance`, one
forward and backward pass per batch with gates on every head's context vector (I_h = E|dL/dxi_h|);
(b) `leave_one_out`: the loss with each head alone masked (gate 0), minus the full model's loss:
L x H + 1 forward passes over the same batches. Reported: CPU (process) and wall time of each, the
ratio (target >= 20x), and the Spearman correlation of the two rankings over all heads (with the
top-10 overlap). Both run in one process, interleaved order, one thread by default, so the ratio is
measured under the same load.

Model: a fine-tuned sequence classifier folder (e.g. `experiments/prune_heads.py`'s
`<runs>/finetune/prune-heads-base/seed-0/best`, MiniLM on sentence_polarity); data: the first
`--sentences` sentences of the sentence_polarity dev split of the workbench's fixed split.

Usage: python benchmarks/bench_head_importance.py CLASSIFIER [--sentences 64] [--batch-size 16] [--threads 1]
Writes benchmarks/results/bench_head_importance-<host>-<time>.json (see results_io.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _clock():
    return time.process_time(), time.perf_counter()


def _since(t):
    c, w = _clock()
    return {"cpu_s": round(c - t[0], 3), "wall_s": round(w - t[1], 3)}


def main(argv=None) -> dict:
    from scipy.stats import spearmanr
    from transformers import AutoTokenizer

    from results_io import record_start, write_result
    from workbench.drivers import head_pruning as H
    from workbench.drivers.finetune import FinetuneConfig, load_task, used_splits
    from workbench.running.classifier_loading import load_classifier

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("classifier", help="a fine-tuned sequence classifier folder")
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = record_start()

    model = load_classifier(args.classifier)
    tok = AutoTokenizer.from_pretrained(args.classifier)
    cfg = FinetuneConfig(checkpoint=str(args.classifier), task="sentence_polarity")
    data = load_task(cfg)
    rows = used_splits(data, cfg)["dev"][: args.sentences]
    batches = []
    for b0 in range(0, len(rows), args.batch_size):
        idx = rows[b0: b0 + args.batch_size]
        enc = tok([" ".join(data.words[i]) for i in idx], padding=True, truncation=True, max_length=128,
                  return_tensors="pt")
        batches.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                        "labels": torch.tensor([data.labels[i] for i in idx])})
    shape = H.head_shape(model)

    def mean_loss(kept) -> float:
        total = n = 0.0
        with torch.no_grad(), H.gates(model, torch.tensor(kept, dtype=torch.float32)):
            for b in batches:
                k = len(b["labels"])
                total += float(model(**b).loss) * k
                n += k
        return total / n

    H.head_importance(model, batches[:1])  # warm-up (allocator, kernels)
    t = _clock()
    grad = H.head_importance(model, batches)
    t_grad = _since(t)
    t = _clock()
    loo = H.leave_one_out(shape, mean_loss)
    t_loo = _since(t)

    rho = spearmanr(grad.raw_heads.reshape(-1), loo.reshape(-1))
    top_grad = set(np.argsort(-grad.raw_heads.reshape(-1))[:10])
    top_loo = set(np.argsort(-loo.reshape(-1))[:10])
    report = {
        "model": str(args.classifier), "layers_heads": list(shape), "sentences": len(rows),
        "tokens": grad.tokens, "batch_size": args.batch_size, "threads": torch.get_num_threads(),
        "gradient": t_grad, "leave_one_out": {**t_loo, "forward_passes": int(np.prod(shape)) + 1},
        "speedup_cpu": round(t_loo["cpu_s"] / t_grad["cpu_s"], 2),
        "speedup_wall": round(t_loo["wall_s"] / t_grad["wall_s"], 2),
        "spearman": float(rho.statistic if hasattr(rho, "statistic") else rho.correlation),
        "spearman_p": float(rho.pvalue), "top10_overlap": len(top_grad & top_loo),
        "gradient_importance": grad.raw_heads.tolist(), "leave_one_out_delta_loss": loo.tolist(),
        "target": "speedup >= 20",
    }
    print(f"gradient {t_grad} | leave-one-out {t_loo} | speedup cpu {report['speedup_cpu']}x wall "
          f"{report['speedup_wall']}x | Spearman {report['spearman']:.3f} (p {report['spearman_p']:.2g}) | "
          f"top-10 overlap {report['top10_overlap']}")
    write_result("bench_head_importance", report, start, args.json)
    return report


if __name__ == "__main__":
    main()
