"""Why SmolLM2's structural probe is below the chain baseline (issue 29 part 5; docs/evidence/real-models.md).

Reads SmolLM2-135M-Instruct on seeded EWT sentences with and without the causal start token
(`ModelHandle.causal_start`), first or last subword, and fits the workbench's distance probe
(Hewitt & Manning 2019, `probes.syntax.structural`) raw and standardised on a few layers; prints the
mean per-word max |x| of the first word against the others (the massive activations, Sun et al.
2024) and the UUAS per layer next to the chain baseline.

Usage: HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python experiments/diagnostics/smollm2_structural.py N_TRAIN N_EVAL [OUT.json]
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

from probes.syntax import structural as st
from probes.syntax.prepare import plan_splits
from workbench.running.models import causal_start_id
from workbench.running.models import ModelHandle

LAYERS = [0, 2, 5, 10, 15, 20, 25, 30]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def tree_set(handle, sentences, pooling):
    arrs = [a[LAYERS].copy() for a in handle.word_states([s.words for s in sentences], pooling=pooling, batch_size=16)]
    offsets = np.concatenate([[0], np.cumsum([a.shape[1] for a in arrs])])
    return st.TreeSet(np.concatenate(arrs, axis=1), offsets, [np.asarray(s.heads) for s in sentences],
                      [s.upos for s in sentences])


def main(n_train: int, n_eval: int, out: str | None) -> None:
    torch.set_num_threads(1)
    plan = plan_splits("en_ewt", "train", "dev", max_train_sentences=n_train, max_eval_sentences=n_eval,
                       early_stopping_fraction=0.1, holdout_fraction=0.1, seed=0)
    fit_s, stop_s = [plan.train[i] for i in plan.fit], [plan.train[i] for i in plan.stop]
    handle = ModelHandle.load(MODEL)
    start_id = causal_start_id(handle.tokenizer)
    results = {}
    for start in (False, True):
        handle.causal_start = start_id if start else None  # False: the extraction before the fix
        for pooling in ("first", "last"):
            t0 = time.time()
            train, dev, ev = (tree_set(handle, s, pooling) for s in (fit_s, stop_s, plan.eval))
            firsts = train.offsets[:-1]
            others = np.setdiff1d(np.arange(train.features.shape[1]), firsts)
            peak = lambda rows: np.abs(train.features[:, rows]).max(-1).mean(-1).round(1).tolist()  # noqa: E731
            print(f"start={start} pooling={pooling} ({time.time() - t0:.0f}s): mean max|x| first word {peak(firsts)}, "
                  f"other words {peak(others)}", flush=True)
            for standardize in (False, True):
                fit = st.fit_structural_probe(train, dev, "distance", progress=False, standardize=standardize)
                uuas = [round(s["uuas"], 3) for s in st.score_distance(st.predict(fit, ev), ev)]
                results[f"start={start},pooling={pooling},standardize={standardize}"] = uuas
                print(f"  standardize={standardize}: UUAS {dict(zip(LAYERS, uuas))} ({fit.epochs} epochs)", flush=True)
    chain = st.right_branching_uuas(ev)
    print("chain baseline", round(chain, 3))
    if out:
        with open(out, "w") as f:
            json.dump({"layers": LAYERS, "uuas": results, "chain": chain}, f, indent=1)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
