"""Step time and peak memory of each fine-tuning method vs full fine-tuning, on one model.

Every method (`workbench.running.peft_methods.METHODS`) runs in its own fresh Python process, so that its
peak memory is its own: the classifier is built from the checkpoint (default all-MiniLM-L6-v2,
BERT 6 x 384) exactly as `bertology finetune` builds it, the method attached, AdamW over what
trains, then `--steps` optimizer steps (forward, backward, clip, step; the fine-tuning loop's own
pieces) on one fixed batch of `--batch-size` real sentence_polarity sentences, `--warmup` more
steps first, untimed. Reported per method:

- step time: median seconds per step (and the min), the ratio to full fine-tuning;
- memory: peak resident set size of the process (`resource.getrusage(RUSAGE_SELF).ru_maxrss`),
  and the peak minus the RSS measured after the model was built and before the first step
  (`psutil`): what training adds (gradients, optimizer state, activations kept for backward). On
  CUDA also `torch.cuda.max_memory_allocated` (the same difference). RSS, not tracemalloc:
  tracemalloc sees Python allocations only, not torch's tensors;
- trainable and total parameter counts, and the AdamW state the trainable values need (2 fp32
  moments each).

Usage: python benchmarks/bench_peft.py [--checkpoint sentence-transformers/all-MiniLM-L6-v2]
       [--steps 20] [--batch-size 32] [--max-len 64] [--threads 1] [--device cpu]
Writes benchmarks/results/bench_peft-<host>-<time>.json (see results_io.py).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT))  # this checkout's workbench, also in the child processes


def one_method(args) -> dict:
    """The measurement of one method (run in a child process)."""
    import psutil

    from workbench.data.raw import load_labelled
    from workbench.drivers.finetune import classification_loss, load_finetune_config, method_options
    from workbench.running.classifier_loading import build_classifier
    from workbench.loop import NO_HOOKS, adamw, apply_param_filter, loss_terms, optimizer_step
    from workbench.running.models import ModelHandle
    from workbench.running.peft_methods import attach, insert_prompt

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = load_finetune_config({"checkpoint": args.checkpoint, "method": args.method})
    handle = ModelHandle.load(args.checkpoint)
    examples = load_labelled("sentence_polarity")[: args.batch_size]
    n_prompt = cfg.prompt_tokens if args.method == "prompt" else 0
    wb = handle.tokenize_words([ex.text.split() for ex in examples])
    rows = []
    for b in range(len(examples)):
        ids = wb.input_ids[b][wb.attention_mask[b].bool()].numpy()[: args.max_len - n_prompt]
        if n_prompt:
            first = handle.model.get_input_embeddings().num_embeddings
            ids, _ = insert_prompt(ids, 0, list(range(first, first + n_prompt)), len(handle._prefix))
        rows.append(ids)
    T = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), T), handle.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for b, r in enumerate(rows):
        input_ids[b, : len(r)] = torch.from_numpy(r)
        mask[b, : len(r)] = 1
    labels = torch.tensor([int(ex.label == "pos") for ex in examples])
    batch = {k: v.to(device) for k, v in {"input_ids": input_ids, "attention_mask": mask, "labels": labels}.items()}

    torch.manual_seed(0)
    model = build_classifier(handle.path, handle.family, "sentence", "last" if handle.family == "gpt" else "first",
                             ["neg", "pos"], handle.pad_id)
    del handle
    counts = apply_param_filter(model, attach(model, args.method, method_options(cfg)))
    model.to(device).train()
    optimizer = adamw(model.named_parameters(), 1e-4, 0.01)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rss_before = psutil.Process().memory_info().rss
    cuda_before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    times = []
    for step in range(args.warmup + args.steps):
        t = time.perf_counter()
        loss_terms(model, batch, NO_HOOKS, classification_loss)["loss"].backward()
        optimizer_step(model, optimizer, None, 1.0, NO_HOOKS, step + 1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    out = {"method": args.method, "trainable": counts["parameters"], "total_parameters": counts["total"],
           "adam_state_bytes": 2 * 4 * counts["parameters"], "tokens_per_batch": int(mask.sum()),
           "batch_shape": list(input_ids.shape), "step_seconds_median": float(np.median(times)),
           "step_seconds_min": float(np.min(times)), "step_seconds": times,
           "peak_rss_bytes": peak_rss, "rss_after_build_bytes": rss_before,
           "training_rss_bytes": peak_rss - rss_before}
    if device.type == "cuda":
        out["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        out["cuda_training_bytes"] = torch.cuda.max_memory_allocated() - cuda_before
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--methods", default="full,head,bitfit,adapter,prompt,lora")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--method", help=argparse.SUPPRESS)  # the child's one method
    p.add_argument("--json", type=Path, help="output file (default: benchmarks/results/bench_peft-<host>-<time>.json)")
    args = p.parse_args()
    if args.method:
        print(json.dumps(one_method(args)))
        return
    from results_io import record_start, write_result

    start = record_start()
    results = {}
    for method in args.methods.split(","):
        cmd = [sys.executable, __file__, "--method", method, "--checkpoint", args.checkpoint, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--batch-size", str(args.batch_size), "--max-len", str(args.max_len),
               "--threads", str(args.threads), "--device", args.device]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            sys.exit(f"bench_peft: method {method} failed:\n{done.stderr[-3000:]}")
        results[method] = json.loads(done.stdout.strip().splitlines()[-1])
    full = results.get("full")
    print(f"{'method':<8} {'trainable':>11} {'step s':>8} {'x full':>7} {'train RSS MiB':>14} {'x full':>7}")
    for m, r in results.items():
        if full:
            r["step_time_vs_full"] = r["step_seconds_median"] / full["step_seconds_median"]
            r["training_rss_vs_full"] = r["training_rss_bytes"] / max(1, full["training_rss_bytes"])
        print(f"{m:<8} {r['trainable']:>11,} {r['step_seconds_median']:>8.3f} {r.get('step_time_vs_full', float('nan')):>7.2f} "
              f"{r['training_rss_bytes'] / 2**20:>14.1f} {r.get('training_rss_vs_full', float('nan')):>7.2f}")
    write_result("bench_peft", {"checkpoint": args.checkpoint, "device": args.device, "threads": args.threads,
                                "steps": args.steps, "warmup": args.warmup, "batch_size": args.batch_size,
                                "max_len": args.max_len, "memory": "peak RSS (getrusage ru_maxrss) minus RSS after "
                                "building the model, each method in its own process", "methods": results},
                 start, args.json)


if __name__ == "__main__":
    main()
