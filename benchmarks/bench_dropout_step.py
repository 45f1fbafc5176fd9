"""CPU time of one training step under each way of drawing the dropout masks (issue 30).

The docs' method under load (docs/evidence/benchmarks.md, "Dropout masks and bf16 on the Intel Xeon with
AMX"): one torch thread, CPU seconds of this process per step (`time.process_time`, which counts the
numpy PCG64 draws too), the loop's own model (`workbench.drivers.train.build_model`, same init) on the same
collated batches, forward + backward + clip + AdamW + scheduler. Under load a step's CPU time
varies by +-15% from minute to minute, so the variants are interleaved step by step (every
variant's model steps batch i before any steps batch i+1, the order rotating) and each variant is
compared with the baseline step by step: the median of the paired ratios is the speed-up.

Variants (`dropout_masks` of workbench/config.py unless said): `bernoulli` (torch's masks, the
family's default attention: SDPA for BERT); `pcg16_modules` (module masks from PCG64, attention
dropout still `bernoulli_` inside SDPA); `eager_modules` (as pcg16_modules with transformers' eager
attention: `F.dropout` with `bernoulli_` on the probabilities, isolating eager vs SDPA); `pcg16`
(modules and attention probabilities through `workbench.dropout`, the `bertology_pcg16` attention).
`--attention` also times the attention call alone (forward + backward of SDPA with `dropout_p`
against `pcg16_attention_forward`) for a few shapes, to say where SDPA's math path would win.

Usage: python benchmarks/bench_dropout_step.py --family bert --batch-size 32 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = ("bernoulli", "pcg16_modules", "eager_modules", "pcg16")


def _model(cfg, family, tokenizer, variant: str):
    from workbench.drivers.train import build_model

    masks = "pcg16_modules" if variant == "eager_modules" else variant
    model = build_model(dataclasses.replace(cfg, dropout_masks=masks), family, tokenizer, 0, torch.device("cpu"))
    if variant == "eager_modules":
        from transformers import PreTrainedModel

        for m in model.modules():
            if isinstance(m, PreTrainedModel) and type(m)._can_set_attn_implementation():
                m.set_attn_implementation("eager")
    return model


def _interleaved_steps(cfg, data, family, batches, variants, rounds: int) -> dict[str, list[float]]:
    """CPU seconds of each step of each variant: every variant's model and optimizer are built first,
    then each batch is stepped by every variant in turn (the order rotating), `rounds` times over the
    batches, so a change of the machine's load hits all variants alike."""
    from workbench.drivers.train import build_optimizer, lr_lambda_factory, objective_settings

    runs = {}
    for v in variants:
        model = _model(cfg, family, data.tokenizer, v)
        for p in getattr(model, "unused_parameters", lambda o: [])(objective_settings(cfg, family)):
            p.requires_grad_(False)
        optimizer = build_optimizer(model, cfg)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_factory(cfg.warmup_steps(), cfg.total_steps))
        runs[v] = (model.train(), optimizer, scheduler)
    times = {v: [] for v in variants}
    torch.manual_seed(2)
    for i, batch in enumerate(batches * rounds):
        order = variants[i % len(variants):] + variants[: i % len(variants)]
        for v in order:
            model, optimizer, scheduler = runs[v]
            t = time.process_time()
            out = model(**batch)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            times[v].append(time.process_time() - t)
    return times


def _profile(cfg, data, family, batches, variant: str) -> dict:
    """Self CPU time by operator kind over `batches[1:]` (batch 0 warms up), bench_train's summary."""
    from bench_train import profile_summary
    from torch.profiler import ProfilerActivity, profile

    from workbench.drivers.train import build_optimizer

    model = _model(cfg, family, data.tokenizer, variant).train()
    optimizer = build_optimizer(model, cfg)

    def step(batch):
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(batches[0])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches[1:]:
            step(batch)
    return profile_summary(prof, len(batches) - 1)


def _attention_calls(shapes, p: float, calls: int) -> list[dict]:
    """Forward + backward of one attention call: SDPA (dropout_p, bernoulli_ on CPU) vs the pcg16 function."""
    from workbench.dropout import pcg16_attention_forward

    module = torch.nn.Module().train()
    rows = []
    for b, h, t, d in shapes:
        q, k, v = (torch.randn(b, h, t, d, requires_grad=True) for _ in range(3))
        mask = torch.zeros(b, 1, t, t)
        ways = {"sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p),
                "pcg16": lambda: pcg16_attention_forward(module, q, k, v, mask, dropout=p)[0]}
        best = {w: float("inf") for w in ways}
        for _ in range(3):  # interleaved, best of 3 x `calls`
            for w, f in ways.items():
                t0 = time.process_time()
                for _ in range(calls):
                    f().sum().backward()
                best[w] = min(best[w], (time.process_time() - t0) / calls * 1e3)
        rows.append({"shape": [b, h, t, d], **{f"{w}_ms": round(x, 2) for w, x in best.items()},
                     "pcg16_speedup": round(best["sdpa"] / best["pcg16"], 3)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="bert")
    p.add_argument("--preset", default="small")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--sources", nargs="+", default=["brown"])
    p.add_argument("--max-documents", type=int, default=300)
    p.add_argument("--steps", type=int, default=8, help="distinct batches")
    p.add_argument("--rounds", type=int, default=3, help="passes over the batches")
    p.add_argument("--warm", type=int, default=2, help="first steps of each variant not counted")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                   help="the first is the baseline of the paired speed-ups")
    p.add_argument("--attention", action="store_true", help="also time the attention call alone")
    p.add_argument("--profile", type=int, default=0, help="also profile this many steps of each variant")
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from bench_train import step_setup

    from workbench.config import load_train_config
    from workbench.families import get_family
    from workbench.drivers.train import prepare_data

    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as out:
        cfg = load_train_config({"name": "bench", "family": args.family, "preset": args.preset, "steps": 100,
                           "tokenizer": {"vocab_size": args.vocab_size}, "max_len": args.max_len,
                           "batch_size": args.batch_size, "eval": {"batches": 0}, "output_dir": out, "progress": False,
                           "corpus": {"sources": args.sources, "max_documents": args.max_documents}})
        data = prepare_data(cfg, get_family(args.family))
    family, batches = step_setup(cfg, data, args.steps)
    times = _interleaved_steps(cfg, data, family, batches, list(args.variants), args.rounds)
    warm = args.warm
    base = args.variants[0]
    result = {"family": args.family, "preset": args.preset, "batch_size": args.batch_size, "max_len": args.max_len,
              "threads": 1, "rounds": args.rounds, "steps": args.steps, "warm": warm, "baseline": base,
              "load_average_start": load, "load_average_end": os.getloadavg(), "variants": {}}
    for v, t in times.items():
        t = np.array(t[warm:])
        ratio = np.array(times[base][warm:]) / t  # step by step against the baseline's same step
        result["variants"][v] = {"median_cpu_s_per_step": round(float(np.median(t)), 4),
                                 "mean_cpu_s_per_step": round(float(np.mean(t)), 4), "n_steps": len(t),
                                 "median_paired_speedup_vs_baseline": round(float(np.median(ratio)), 3),
                                 "paired_speedup_quartiles": [round(float(q), 3) for q in np.percentile(ratio, [25, 75])]}
        print(f"{v:>14}: median {np.median(t):.3f} CPU s/step; paired speed-up vs {base} {np.median(ratio):.3f} "
              f"(quartiles {np.percentile(ratio, 25):.3f}-{np.percentile(ratio, 75):.3f})", flush=True)
    if args.profile:  # op times are wall time inside each op (inflated under load): read the shares
        result["profiles"] = {}
        for v in args.variants:
            result["profiles"][v] = _profile(cfg, data, family, batches[: args.profile + 1], v)
            print(f"profile {v}:", json.dumps(result["profiles"][v]["share_by_kind"]), flush=True)
    if args.attention:
        result["attention_call"] = _attention_calls([(16, 4, 128, 64), (32, 4, 128, 64), (32, 4, 64, 64),
                                                     (8, 4, 256, 64), (4, 4, 512, 64)], 0.1, 3)
    print(json.dumps(result["variants"], indent=1))
    from workbench.io import atomic_write_json

    atomic_write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
