"""One IMP round vs one plain fine-tuning epoch: what the masks cost (target: overhead <= 10%).

The same classifier, data and recipe (`workbench.drivers.finetune.train_seed`, one epoch): plain, then
one round of iterative magnitude pruning as the sweep runs it (`workbench.drivers.prune_sweep`): the
global magnitude masks of the trained weights, the rewound start written as a classifier folder,
and the epoch with the `keep_masked` after-step hook. Both are timed alternately `--repeats`
times in one run with the same thread count; the overhead is the ratio of the medians minus 1,
for the whole round and for the epoch with the hook alone (the masks and the rewound start are
fixed costs per round, the hook a cost per step).

Usage: python benchmarks/bench_imp_round.py [--checkpoint sentence-transformers/all-MiniLM-L6-v2]
           [--examples 128] [--threads 1] [--repeats 2]
Writes benchmarks/results/bench_imp_round-<host>-<time>.json (see results_io.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.results_io import record_start, write_result  # noqa: E402


def main(argv=None) -> int:
    from workbench.compress.masks import keep_masked
    from workbench.drivers.prune_sweep import rewound
    from workbench.compress.unstructured import magnitude_masks, prunable_weights
    from workbench.drivers.finetune import load_finetune_config, prepare, train_seed
    from workbench.running.classifier_loading import build_classifier
    from workbench.loop import TrainingHooks, write_model_folder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="sentence-transformers/all-MiniLM-L6-v2")
    ap.add_argument("--examples", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    start_record = record_start()
    root = Path(tempfile.mkdtemp(prefix="bench-imp-"))
    try:
        cfg = load_finetune_config({"checkpoint": args.checkpoint, "seeds": [0], "epochs": 1, "batch_size": 16,
                                    "max_len": 32, "max_train_examples": args.examples, "max_eval_examples": 32,
                                    "baselines": False, "progress": False, "threads": args.threads, "device": "cpu",
                                    "output_dir": str(root / "ft"), "save_every": 100000})
        run = prepare(cfg)
        torch.manual_seed(0)
        start_model = build_classifier(run.checkpoint, run.family, run.data.kind, run.pooling, run.data.label_names,
                                       run.pad_id)
        start = {k: v.clone() for k, v in start_model.state_dict().items()}
        from workbench.running.classifier_loading import load_classifier

        times = {"plain_epoch": [], "imp_round": [], "masks": [], "rewind_and_write": [], "masked_epoch": []}
        for rep in range(args.repeats):
            t = time.perf_counter()
            res = train_seed(cfg, 0, dataclasses.replace(run, folder=root / f"plain-{rep}"))
            times["plain_epoch"].append(time.perf_counter() - t)
            t0 = time.perf_counter()
            trained = load_classifier(res.checkpoint)
            masks = magnitude_masks(trained, prunable_weights(trained), 0.1)
            t1 = time.perf_counter()
            folder = root / f"start-{rep}"
            write_model_folder(folder, rewound(trained, start, masks), run.tokenizer, {"kind": "prune_start"})
            t2 = time.perf_counter()
            train_seed(cfg, 0, dataclasses.replace(run, checkpoint=folder, folder=root / f"imp-{rep}"),
                       hooks=TrainingHooks(after_step=keep_masked(masks)))
            t3 = time.perf_counter()
            for key, value in (("masks", t1 - t0), ("rewind_and_write", t2 - t1), ("masked_epoch", t3 - t2),
                               ("imp_round", t3 - t0)):
                times[key].append(value)
            print(f"repeat {rep}: plain epoch {times['plain_epoch'][-1]:.1f}s, IMP round {t3 - t0:.1f}s (masks "
                  f"{t1 - t0:.1f}s, rewind + write {t2 - t1:.1f}s, the epoch with the hook {t3 - t2:.1f}s)", flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        overhead = med["imp_round"] / med["plain_epoch"] - 1
        hook_overhead = med["masked_epoch"] / med["plain_epoch"] - 1
        print(f"IMP round {med['imp_round']:.1f}s vs plain epoch {med['plain_epoch']:.1f}s: overhead "
              f"{100 * overhead:+.1f}% (target <= 10%); the epoch with the mask hook alone {100 * hook_overhead:+.1f}%; "
              f"fixed costs (masks {med['masks']:.1f}s, rewind + write {med['rewind_and_write']:.1f}s) do not grow "
              f"with the epoch's length")
        write_result("bench_imp_round", {"checkpoint": args.checkpoint, "examples": args.examples,
                                         "threads": args.threads, "repeats": args.repeats, "seconds": times,
                                         "median_seconds": med, "overhead": overhead, "hook_overhead": hook_overhead,
                                         "target_overhead": 0.10}, start_record)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
