"""Does the distance probe on a real model improve with more training trees and more epochs?
(issue 29 part 5; docs/evidence/real-models.md, "SmolLM2's structural probe: more trees").

SmolLM2's distance probe stayed below the chain baseline in every variant tried with 216-500
training trees, and every fit ran into the 30-epoch cap (experiments/diagnostics/smollm2_structural.py).
This script extracts a model's first-subword word vectors (the workbench's extraction, so a causal
LM is read behind its start token) once for up to N_TRAIN EWT training trees, then fits the
workbench's probe (Hewitt & Manning 2019, `probes.syntax.structural`, rank 64, the paper's
learning-rate decay) on nested seeded subsets of them, with the 30-epoch cap and with a higher cap,
raw and standardised, and prints UUAS per layer next to the chain baseline on the same dev trees.
Run it on MiniLM with the same settings as a regression check (its known UUAS: docs/evidence/main-job.md).

Usage: HF_HUB_OFFLINE=1 python experiments/diagnostics/structural_trees.py MODEL LAYERS N_TRAIN N_EVAL SIZES [OUT.json]
  e.g. ... HuggingFaceTB/SmolLM2-135M-Instruct 0,5,15,25 2000 300 250,500,1000,2000 out.json
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

from probes.syntax import structural as st
from probes.syntax.prepare import plan_splits
from workbench.running.models import ModelHandle

LONG_CAP = 80  # the higher epoch cap (the probe's patience, 4 epochs without a better dev loss, still stops it)


def tree_set(handle, sentences, layers: list[int]) -> st.TreeSet:
    arrs = [a[layers].copy() for a in handle.word_states([s.words for s in sentences], pooling="first", batch_size=16)]
    offsets = np.concatenate([[0], np.cumsum([a.shape[1] for a in arrs])])
    return st.TreeSet(np.concatenate(arrs, axis=1), offsets, [np.asarray(s.heads) for s in sentences],
                      [s.upos for s in sentences])


def subset(data: st.TreeSet, n: int) -> st.TreeSet:
    """The first n sentences of a tree set (its sentences are already in a seeded random order)."""
    end = int(data.offsets[n])
    return st.TreeSet(data.features[:, :end], data.offsets[: n + 1], data.heads[:n], data.upos[:n])


def main(model: str, layers: list[int], n_train: int, n_eval: int, sizes: list[int], out: str | None) -> None:
    torch.set_num_threads(1)
    plan = plan_splits("en_ewt", "train", "dev", max_train_sentences=n_train, max_eval_sentences=n_eval,
                       early_stopping_fraction=0.1, holdout_fraction=0.1, seed=0)
    order = np.random.default_rng(0).permutation(len(plan.fit))  # nested subsets: 250 within 500 within ...
    fit_s = [plan.train[plan.fit[i]] for i in order]
    stop_s = [plan.train[i] for i in plan.stop]
    sizes = [s for s in sizes if s <= len(fit_s)] or [len(fit_s)]
    handle = ModelHandle.load(model)
    t0 = time.time()
    train, dev, ev = (tree_set(handle, s, layers) for s in (fit_s, stop_s, plan.eval))
    print(f"{model}: layers {layers}, {len(fit_s)} fit / {len(stop_s)} early-stopping / {len(plan.eval)} dev trees, "
          f"extraction {time.time() - t0:.0f} s", flush=True)
    chain = st.right_branching_uuas(ev)
    print(f"chain baseline {chain:.3f}", flush=True)
    results = []
    # (trees, epoch cap, standardised): the learning curve at the usual cap, then the largest set
    # with the higher cap, and raw (Hewitt & Manning's features) at the usual cap
    runs = [(n, 30, True) for n in sizes] + [(sizes[-1], LONG_CAP, True), (sizes[-1], 30, False)]
    for n, cap, standardize in runs:
        t0 = time.time()
        fit = st.fit_structural_probe(subset(train, n), dev, "distance", epochs=cap, progress=False,
                                      standardize=standardize)
        uuas = [round(s["uuas"], 3) for s in st.score_distance(st.predict(fit, ev), ev)]
        hist = fit.dev_loss_history
        # the dev loss of the last epoch against the best: did the fit stop on the cap while improving?
        improving_at_end = bool(fit.epochs == cap and (hist[-1] <= hist.min(axis=0) + 1e-9).any())
        results.append({"trees": n, "epoch_cap": cap, "standardize": standardize, "epochs": fit.epochs,
                        "stopped_on_cap_improving": improving_at_end, "uuas": dict(zip(layers, uuas))})
        print(f"  trees={n} cap={cap} standardize={standardize}: {fit.epochs} epochs "
              f"(cap hit while improving: {improving_at_end}), UUAS {dict(zip(layers, uuas))} "
              f"({time.time() - t0:.0f} s)", flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"model": model, "layers": layers, "chain": chain, "dev_trees": len(plan.eval),
                       "early_stopping_trees": len(stop_s), "runs": results}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4]),
         [int(x) for x in sys.argv[5].split(",")], sys.argv[6] if len(sys.argv) > 6 else None)
