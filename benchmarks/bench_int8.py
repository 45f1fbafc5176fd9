"""Int8 vs fp32 inference on CPU: forward latency (target >= 1.5x) and the accuracy change.

A fine-tuned classifier (`--classifier`, e.g. a prune sweep's `full/seed-0/best`, or any `bertology
finetune` checkpoint) and its int8 copy (`workbench.compress.quantize.int8_dynamic`: torch's dynamic
quantization of every nn.Linear, int8 weights, activations quantized per batch) classify the same
dev sentences of the task its manifest names; latency is the median over `--repeats` of a
forward pass over fixed batches (`--batch` sentences, padded), both models timed alternately in
one run with the same thread count. Size: the serialised state dict (`state_size_bytes`).

Usage: python benchmarks/bench_int8.py --classifier RUNS/prune/NAME/full/seed-0/best [--threads 1]
           [--sentences 200] [--batch 32] [--repeats 5]
Writes benchmarks/results/bench_int8-<host>-<time>.json (see results_io.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.results_io import record_start, write_result  # noqa: E402


def main(argv=None) -> int:
    from workbench.compress.quantize import int8_dynamic, state_size_bytes
    from workbench.drivers.finetune import collate, encode, evaluate, load_finetune_config, load_task
    from workbench.running.classifier_loading import load_classifier
    from workbench.running.models import ModelHandle

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classifier", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = record_start()
    import json

    manifest = json.loads((Path(args.classifier) / "manifest.json").read_text())
    ft = manifest["finetune"]["config"]
    cfg = load_finetune_config({**ft, "checkpoint": args.classifier})
    data = load_task(cfg)
    dev = data.splits["dev"][: args.sentences]
    handle = ModelHandle.load(args.classifier)
    enc = encode(handle, data, dev, min(cfg.max_len, handle.max_length))
    fp32 = load_classifier(args.classifier).eval()
    int8 = int8_dynamic(fp32)
    rows = list(range(len(enc.ids)))
    batches = [collate(enc, rows[i: i + args.batch], handle.pad_id) for i in range(0, len(rows), args.batch)]

    def forward_all(model) -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            for b in batches:
                model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        return time.perf_counter() - t

    forward_all(fp32), forward_all(int8)  # warm-up
    times = {"fp32": [], "int8": []}
    for _ in range(args.repeats):  # alternate, so load on the shared machine hits both alike
        times["fp32"].append(forward_all(fp32))
        times["int8"].append(forward_all(int8))
    med = {k: statistics.median(v) for k, v in times.items()}
    acc = {k: evaluate(m, enc, rows, handle.pad_id, args.batch)[0] for k, m in (("fp32", fp32), ("int8", int8))}
    size = {"fp32": state_size_bytes(fp32), "int8": state_size_bytes(int8)}
    speedup = med["fp32"] / med["int8"]
    print(f"forward over {len(rows)} sentences, {args.threads} thread(s): fp32 {med['fp32']:.3f}s, int8 "
          f"{med['int8']:.3f}s: {speedup:.2f}x (target >= 1.5x)")
    print(f"dev accuracy fp32 {acc['fp32']:.4f}, int8 {acc['int8']:.4f} ({100 * (acc['int8'] - acc['fp32']):+.2f} pt); "
          f"state size {size['fp32'] / 1e6:.1f} MB -> {size['int8'] / 1e6:.1f} MB")
    write_result("bench_int8", {"classifier": args.classifier, "threads": args.threads, "sentences": len(rows),
                                "batch": args.batch, "repeats": args.repeats, "seconds": times, "median_seconds": med,
                                "speedup": speedup, "target_speedup": 1.5, "accuracy": acc,
                                "accuracy_change": acc["int8"] - acc["fp32"], "state_bytes": size}, start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
