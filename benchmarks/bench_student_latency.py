"""CPU latency of a fine-tuned teacher and its distilled students, measured side by side.

The distillation sweep records each student's latency where it trains (`latency_ms` in its rows),
which on a shared machine measures the neighbours; this benchmark is the quiet-machine figure:
one torch thread, one forward of the same `--batch` sentence_polarity sentences padded to
`--max-len` tokens through every model, the models interleaved (each repeat runs all of them), the
median over `--repeats` after one warm-up, and each model's speed-up over the teacher from that one
run (Sanh et al. 2019 report DistilBERT 60% faster than BERT-base).

Usage: python benchmarks/bench_student_latency.py TEACHER STUDENT [STUDENT ...] [--batch 32] [--max-len 64] [--repeats 15]
(TEACHER and STUDENTs: fine-tuned classifier folders, e.g. a `bertology distill` point's seed-0/best.)
Writes benchmarks/results/bench_student_latency-<host>-<time>.json (see results_io.py).
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


def main(argv=None) -> dict:
    from transformers import AutoTokenizer

    from workbench.data.raw import load_labelled
    from workbench.running.classifier_loading import load_classifier

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("teacher")
    p.add_argument("students", nargs="+")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    start = record_start()
    torch.set_num_threads(1)
    folders = [args.teacher, *args.students]
    sentences = [ex.text for ex in load_labelled("sentence_polarity")[: args.batch]]
    batch = AutoTokenizer.from_pretrained(args.teacher)(sentences, padding="max_length", truncation=True,
                                                        max_length=args.max_len, return_tensors="pt")
    models = [load_classifier(Path(f)).eval() for f in folders]
    times: list[list[float]] = [[] for _ in models]
    with torch.inference_mode():
        for r in range(args.repeats + 1):
            for i, m in enumerate(models):
                t0 = time.perf_counter()
                m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                if r:  # the first pass warms up
                    times[i].append((time.perf_counter() - t0) * 1000)
    medians = [statistics.median(t) for t in times]
    rows = [{"model": f, "role": "teacher" if i == 0 else "student",
             "layers": int(getattr(m.config, "num_hidden_layers", 0) or 0),
             "parameters": sum(q.numel() for q in m.parameters()), "median_ms": round(ms, 1),
             "speedup_vs_teacher": round(medians[0] / ms, 3)}
            for i, (f, m, ms) in enumerate(zip(folders, models, medians))]
    for r in rows:
        print(f"{r['role']:<8} {r['layers']} layers {r['parameters']:>11,} parameters  {r['median_ms']:8.1f} ms  "
              f"{r['speedup_vs_teacher']:.2f}x  {r['model']}")
    report = {"batch": args.batch, "max_len": args.max_len, "repeats": args.repeats, "threads": 1, "models": rows}
    write_result("bench_student_latency", report, start, args.json)
    return report


if __name__ == "__main__":
    main()
