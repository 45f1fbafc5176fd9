"""Extraction in bf16 vs fp32 on real models (issue 30): speed, and what it does to the probes.

1. Speed (`--models NAME ...`): all-layer `workbench.activations.extract` of a seeded sample of EWT
   train sentences through `ModelHandle.load(name)` (fp32) and `.with_dtype("bf16")` (autocast),
   interleaved, best of `--repeats`, timed in process CPU time (the machine is shared: wall time
   measures the neighbours). Also the largest |activation| of each (Llama's massive activations:
   finite in bf16?) and the largest fp32-bf16 difference per layer.
2. Probes (`--compare RUN_FP32 RUN_BF16`): two `bertology probe syntax` runs that differ only in
   `--dtype` (same sentences, same seed, hence the same bootstrap resamples): accuracy per layer in
   each and the difference with a paired 95% bootstrap CI (the rows' `extra.boot` replicates).
   The issue's rule for making bf16 the default: |difference| <= 0.3 pt UPOS at every layer.

Usage: python benchmarks/bench_extraction_dtype.py --models HuggingFaceTB/SmolLM2-135M-Instruct [--sentences 96]
       python benchmarks/bench_extraction_dtype.py --compare RUN_FP32 RUN_BF16 [--runs-root DIR [DIR_BF16]] [--task upos]
Speed writes benchmarks/results/bench_extraction_dtype-<host>-<time>.json (see results_io.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def speed(names: list[str], n_sentences: int, repeats: int, batch_size: int) -> dict:
    from workbench.activations import extract
    from workbench.data.conllu import load_treebank
    from workbench.running.models import ModelHandle

    train = load_treebank("en_ewt", "train")
    rng = np.random.default_rng(0)
    sents = [train[i].words for i in sorted(rng.choice(len(train), n_sentences, replace=False))]
    out = {}
    for name in names:
        h32 = ModelHandle.load(name)
        handles = {"fp32": h32, "bf16": h32.with_dtype("bf16")}
        n_tok = sum(len(e.ids) for e in h32._encode(sents, count=False))
        best = {k: float("inf") for k in handles}
        layers, maxabs = {}, {}
        for rep in range(repeats):
            for label, h in handles.items():
                with tempfile.TemporaryDirectory() as d:
                    t = time.process_time()
                    acts = extract(h, sents, "dtype-speed", batch_size=batch_size, cache_dir=d, progress=False)
                    best[label] = min(best[label], time.process_time() - t)
                    arr = np.array(acts.layers)
                    maxabs[label] = {"max_abs": float(np.abs(arr).max()), "finite": bool(np.isfinite(arr).all())}
                    layers[label] = arr
            print(f"  {name} rep {rep}: " + ", ".join(f"{k} {v:.2f}s CPU" for k, v in best.items()), flush=True)
        diff = np.abs(layers["fp32"] - layers["bf16"])
        scale = np.abs(layers["fp32"]).max(axis=(1, 2))
        out[name] = {"sentences": n_sentences, "content_tokens": n_tok, "cpu_seconds": best,
                     "tokens_per_cpu_s": {k: n_tok / v for k, v in best.items()},
                     "bf16_speedup": best["fp32"] / best["bf16"], "activations": maxabs,
                     "max_abs_diff_per_layer": diff.max(axis=(1, 2)).tolist(),
                     "max_abs_diff_over_layer_max": (diff.max(axis=(1, 2)) / scale).tolist()}
        r = out[name]["tokens_per_cpu_s"]
        print(f"{name}: fp32 {r['fp32']:.0f} tokens/CPU-s, bf16 {r['bf16']:.0f} ({out[name]['bf16_speedup']:.2f}x); "
              f"max |h| fp32 {maxabs['fp32']['max_abs']:.0f}, bf16 {maxabs['bf16']['max_abs']:.0f} "
              f"(finite: {maxabs['bf16']['finite']})", flush=True)
    return out


def compare(run_a: str, run_b: str, runs_roots: list[str] | None, task: str, metric: str = "accuracy") -> list[dict]:
    """Per (model, layer): accuracy in run a and run b and b - a with a paired percentile CI.
    `runs_roots`: one results store for both runs, or one for each (None: the default store)."""
    from workbench.store.results import ResultsStore

    roots = list(runs_roots or [None])
    stores = [ResultsStore(r) if r else ResultsStore() for r in (roots * 2)[:2]]
    frames = {}
    for run, store in zip((run_a, run_b), stores):
        rows = store.read(run)
        rows = rows[(rows["task"] == task) & (rows["metric"] == metric) & rows["layer"].notna()]
        frames[run] = {(r.model, int(r.layer)): r for r in rows.itertuples()}
    out = []
    for key in sorted(set(frames[run_a]) & set(frames[run_b])):
        a, b = frames[run_a][key], frames[run_b][key]
        ba, bb = (np.asarray(json.loads(r.extra)["boot"], dtype=float) for r in (a, b))
        d = bb - ba  # same seed and sentences: the same resamples, paired
        lo, hi = np.percentile(d, [2.5, 97.5])
        out.append({"model": key[0], "layer": key[1], "a": float(a.value), "b": float(b.value),
                    "diff": float(b.value - a.value), "ci": [float(lo), float(hi)]})
    for model in dict.fromkeys(r["model"] for r in out):
        rs = [r for r in out if r["model"] == model]
        worst = max(rs, key=lambda r: abs(r["diff"]))
        print(f"== {model}: {task} {metric}, {run_b} - {run_a}; largest |diff| {100 * abs(worst['diff']):.2f} pt "
              f"(layer {worst['layer']}); layers within 0.3 pt: {sum(abs(r['diff']) <= 0.003 for r in rs)}/{len(rs)}")
        for r in rs:
            print(f"  layer {r['layer']:>2}: {r['a']:.4f} -> {r['b']:.4f}  diff {100 * r['diff']:+.2f} pt "
                  f"[{100 * r['ci'][0]:+.2f}, {100 * r['ci'][1]:+.2f}]")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=[])
    p.add_argument("--sentences", type=int, default=96)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compare", nargs=2, metavar=("RUN_FP32", "RUN_BF16"))
    p.add_argument("--runs-root", nargs="+", default=None, help="the results store (or one per run)")
    p.add_argument("--task", default="upos")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.compare:
        rows = compare(*args.compare, args.runs_root, args.task)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    if args.models:
        from results_io import record_start, write_result

        start = record_start()
        report = {"threads": args.threads, "torch": torch.__version__,
                  "speed": speed(args.models, args.sentences, args.repeats, args.batch_size)}
        write_result("bench_extraction_dtype", report, start, args.json)


if __name__ == "__main__":
    main()
