"""UPOS probes for every layer: the batched engine vs scikit-learn fitted layer by layer, same features.

Features: all-layer word vectors (first subword) of a seeded random BERT (4 layers, hidden 256,
see bench_extraction.build_random_bert) for the first `--train-words` words of EWT train and all of
EWT dev, extracted once through the activation cache (re-runs reuse it). Labels: gold UPOS.

Both sides minimise the same objective per layer: mean cross-entropy + lambda/2 ||W||^2 on
standardised features (sklearn: StandardScaler + LogisticRegression(C = 1/(lambda N)), lbfgs, its
default tol, max_iter 1000). Ours: `probes.engine.fit_probe` with its defaults (all layers in one
batched program; "auto" picks minibatch Adam above 20k words), no early stopping, so neither side
looks at dev while fitting. Ours is stochastic (minibatch order), so it is fitted with `--seeds` (5)
seeds: reported are the slowest seed's wall time, every seed's per-layer dev accuracy, the largest
gap to sklearn over all seeds and layers (target <= 0.5 pt) and the speed ratio (target >= 10x). The same number
of torch / BLAS threads for both (`--threads`, default 1 on shared 2-core machines).

Usage: python benchmarks/bench_probe_fit.py [--train-words 40000] [--l2 1e-4] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def features(train_words: int, cache_dir=None):
    from bench_extraction import build_random_bert

    from workbench.activations import extract
    from workbench.data.conllu import load_treebank

    handle, _ = build_random_bert()
    out = {}
    for split, limit in (("train", train_words), ("dev", None)):
        sents, total = [], 0
        for s in load_treebank("en_ewt", split):
            if limit is not None and total >= limit:
                break
            sents.append(s)
            total += len(s.words)
        acts = extract(handle, [s.words for s in sents], f"en_ewt/{split}[:{total}w]", cache_dir=cache_dir, progress=True)
        out[split] = (np.asarray(acts.layers, dtype=np.float32), [t for s in sents for t in s.upos])
    tags = sorted({t for _, tags in out.values() for t in tags})
    index = {t: i for i, t in enumerate(tags)}
    return {k: (x, np.array([index[t] for t in tags_])) for k, (x, tags_) in out.items()}, len(tags)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-words", type=int, default=40_000)
    p.add_argument("--l2", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", type=int, default=5, help="fit ours with seeds 0..N-1 (the slowest counts)")
    p.add_argument("--cache-dir", type=Path, default=None, help="activation cache (default: the workbench cache root)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    from probes.engine import fit_probe, sklearn_C

    data, n_classes = features(args.train_words, args.cache_dir)
    (xtr, ytr), (xdv, ydv) = data["train"], data["dev"]
    n_layers = xtr.shape[0]
    print(f"features: {n_layers} layers, train {xtr.shape[1]} words, dev {xdv.shape[1]} words, H={xtr.shape[2]}, "
          f"{n_classes} UPOS tags, lambda={args.l2}", flush=True)

    with threadpool_limits(args.threads):
        fit_probe(xtr[:, :2000], ytr[:2000], num_classes=n_classes, early_stopping=False)  # warm-up (imports)
        runs, t_ours, c_ours = [], 0.0, 0.0
        for seed in range(args.seeds):
            t, c = time.perf_counter(), time.process_time()
            ours = fit_probe(xtr, ytr, xdv, ydv, num_classes=n_classes, l2=args.l2, early_stopping=False, seed=seed)
            dt, dc = time.perf_counter() - t, time.process_time() - c
            t_ours, c_ours = max(t_ours, dt), max(c_ours, dc)
            runs.append(ours.dev_accuracy)
            print(f"ours seed {seed} ({ours.config.optimizer}, {ours.steps} epochs, all layers): {dt:.2f}s wall, "
                  f"{dc:.2f}s CPU", flush=True)
        ours_acc = np.stack(runs)  # [seeds, L]

        sk_acc, t_sk, iters = [], 0.0, []
        c = time.process_time()
        for layer in range(n_layers):
            t = time.perf_counter()
            scaler = StandardScaler().fit(xtr[layer])
            clf = LogisticRegression(C=sklearn_C(args.l2, len(ytr)), max_iter=1000)
            clf.fit(scaler.transform(xtr[layer]), ytr)
            t_sk += time.perf_counter() - t
            sk_acc.append(float((clf.predict(scaler.transform(xdv[layer])) == ydv).mean()))
            iters.append(int(clf.n_iter_[0]))
            print(f"  sklearn layer {layer}: {sk_acc[-1]:.4f} ({iters[-1]} iterations, {t_sk:.1f}s so far)", flush=True)
        c_sk = time.process_time() - c  # includes the (cheap) dev predictions

    gap = np.abs(ours_acc - np.array(sk_acc)[None]).max(0)  # [L], worst seed
    seeds = " ".join(f"seed{s:<3}" for s in range(args.seeds))
    print(f"\nlayer  {seeds}  sklearn  max gap(pt)")
    for layer in range(n_layers):
        ours_cols = "  ".join(f"{a:.4f}" for a in ours_acc[:, layer])
        print(f"{layer:>5}  {ours_cols}  {sk_acc[layer]:.4f}   {100 * gap[layer]:.2f}")
    print(f"ours (slowest of {args.seeds} seeds) {t_ours:.2f}s vs sklearn {t_sk:.1f}s wall: {t_sk / t_ours:.1f}x faster (target >= 10x); "
          f"CPU time {c_ours:.1f}s vs {c_sk:.1f}s: {c_sk / c_ours:.1f}x; max accuracy gap {100 * gap.max():.2f} pt "
          f"(target <= 0.5)")
    if args.json:
        args.json.write_text(json.dumps({
            "train_words": int(xtr.shape[1]), "dev_words": int(xdv.shape[1]), "layers": n_layers, "l2": args.l2,
            "threads": args.threads, "ours_seconds": t_ours, "sklearn_seconds": t_sk, "speedup": t_sk / t_ours,
            "ours_cpu_seconds": c_ours, "sklearn_cpu_seconds": c_sk,
            "ours_acc": ours_acc.tolist(), "sklearn_acc": sk_acc, "sklearn_iterations": iters,
            "max_gap_pt": float(100 * gap.max()), "optimizer": ours.config.optimizer,
        }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
