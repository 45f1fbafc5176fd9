"""Training on a CUDA GPU: the loop's bf16 throughput and MFU against the GPU's measured bf16 peak.

The GPU counterpart of `bench_train.py` (which measures CPUs): the same analytic FLOPs per token
(`bench_train.flops_per_token`: 3 x the forward's matmul FLOPs, MLM head on the predicted
positions), the same loop (`workbench.drivers.train.train_seed`, bf16 autocast on CUDA as the config's
`bf16: true` default), and the same strongest plain-HF peer (HF `Trainer` on `run_mlm`'s packed
blocks, here with `bf16=True`), all in one run. The denominator is measured in the same run too:
the best of `--peak-reps` timed 8192^3 bf16 matmuls after warm-up (Chowdhery et al. 2022,
appendix B, define MFU against the hardware peak; a measured peak is the honest one to divide by,
and it is printed beside the vendor figure). `--deterministic` keeps the loop's default
(deterministic algorithms, warn-only on CUDA); `--no-deterministic` shows what that costs.

`--profile-steps N` adds a torch.profiler run of N steps (`profile_steps`): where the step's time
goes, the GPU's kernel time against the host's wall time, and what building a batch costs the host
(docs/evidence/benchmarks.md, "GPU, profiled and fixed").

Usage (on a machine with a GPU; benchmarks/gpu_records.sh runs every GPU record in one call):
  python benchmarks/bench_gpu.py [--preset base] [--steps 60] [--batch-size 64] [--max-len 128]
      [--sources webtext] [--profile-steps 10]
Writes benchmarks/results/bench_gpu-<host>-<time>.json (see results_io.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import hf_trainer_baseline, workbench_run, flops_per_token  # noqa: E402
from results_io import record_start, write_result  # noqa: E402


def gpu_matmul_peak(n: int = 8192, reps: int = 20, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Best FLOP/s of single n^3 matmuls on the current CUDA device, timed with CUDA events."""
    a = torch.randn(n, n, dtype=dtype, device="cuda")
    b = torch.randn(n, n, dtype=dtype, device="cuda")
    out = torch.empty(n, n, dtype=dtype, device="cuda")
    for _ in range(3):
        torch.mm(a, b, out=out)
    rates = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b, out=out)
        end.record()
        torch.cuda.synchronize()
        rates.append(2 * n**3 / (start.elapsed_time(end) / 1e3))
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "flops_per_s": max(rates),
            "median_flops_per_s": sorted(rates)[len(rates) // 2]}


def _is_annotation(event) -> bool:
    return bool(getattr(event, "is_user_annotation", False)) or event.key.startswith("ProfilerStep") or "#" in event.key


def profile_steps(cfg, data, steps: int, skip: int = 5) -> dict:
    """Where a step's time goes on the GPU: `torch.profiler` over `steps` steps of the loop (after
    `skip` steps of warm-up), read through the loop's after-step hook. Returns the device time per
    step (the summed kernel time), the host wall time per step, their ratio (how busy the GPU is),
    the host-device waits per step (`aten::_local_scalar_dense`: a tensor read as a Python number;
    `aten::nonzero`: boolean indexing, whose output size the host must learn) and the top operators
    by device time and by host time."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from workbench.loop import TrainingHooks
    from workbench.drivers.train import Dist, train_seed

    walls: list[float] = []
    cuda = torch.cuda.is_available()
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []),
                   schedule=schedule(wait=skip - 1, warmup=1, active=steps, repeat=1))

    def after_step(model, step):
        if cuda and skip <= step <= skip + steps:
            torch.cuda.synchronize()  # the step's kernels are done: its wall time is the device's too
        walls.append(time.perf_counter())
        prof.step()

    short = dataclasses.replace(cfg, steps=skip + steps + 1, name=cfg.name + "-profile",
                                output_dir=str(Path(cfg.output_dir) / "profile"))
    with prof:
        train_seed(short, 0, data, Dist(), TrainingHooks(after_step=after_step))
    events = prof.key_averages()
    # the kernels' own time: device events, less the spans of user annotations (the profiler's
    # "ProfilerStep*" and the optimizer's record_function, which cover the whole step on the device)
    device_us = sum(e.self_device_time_total for e in events
                    if e.device_type == torch.autograd.DeviceType.CUDA and not _is_annotation(e))
    wall_s = walls[skip + steps - 1] - walls[skip - 1]
    counts = {e.key: e.count for e in events}

    def top(key: str, n: int = 15) -> list[dict]:
        rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:n]
        return [{"op": e.key, "count": e.count, "device_ms": round(e.self_device_time_total / 1e3, 2),
                 "host_self_ms": round(e.self_cpu_time_total / 1e3, 2)} for e in rows]

    # The host's share alone: building the steps' batches (examples, masking, padding), no model.
    from workbench.families import get_family
    from workbench.drivers.train import objective_settings, step_batches

    family = get_family(cfg.family)
    collate = family.make_collator(objective_settings(cfg, family), data.tokenizer)
    t0 = time.perf_counter()
    for _ in step_batches(family, data.train, cfg, 0, Dist(), collate, data.tokenizer, 0, 0, 0, steps):
        pass
    batch_ms = 1e3 * (time.perf_counter() - t0) / steps
    return {"steps": steps, "wall_ms_per_step": round(1e3 * wall_s / steps, 2), "host_batch_ms_per_step": round(batch_ms, 2),
            "device_busy_ms_per_step": round(device_us / 1e3 / steps, 2),
            "device_busy_fraction": round(device_us / 1e6 / wall_s, 3),
            "host_reads_per_step": {k: counts.get(k, 0) / steps for k in ("aten::_local_scalar_dense", "aten::nonzero",
                                                                         "cudaStreamSynchronize", "cudaDeviceSynchronize")},
            "top_device": top("self_device_time_total"), "top_host": top("self_cpu_time_total")}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="bert")
    p.add_argument("--preset", default="base")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--sources", nargs="+", default=None, help="corpus sources (default: the pretraining set)")
    p.add_argument("--peak-reps", type=int, default=20)
    p.add_argument("--no-deterministic", action="store_true", help="the loop without deterministic algorithms")
    p.add_argument("--skip-hf", action="store_true", help="skip the HF Trainer baseline")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="also profile this many steps of the loop (torch.profiler; a separate, untimed run)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu: no CUDA device (use benchmarks/bench_train.py on a CPU)")
    start = record_start()

    from workbench.config import load_train_config
    from workbench.families import get_family
    from workbench.drivers.train import prepare_data

    peak = gpu_matmul_peak(reps=args.peak_reps)
    name = torch.cuda.get_device_name()
    print(f"{name}: bf16 matmul peak {peak['flops_per_s'] / 1e12:.0f} TFLOP/s (8192^3, best of {args.peak_reps})", flush=True)
    with tempfile.TemporaryDirectory() as out:
        raw = {"name": "bench_gpu", "family": args.family, "preset": args.preset, "steps": args.steps,
               "tokenizer": {"vocab_size": args.vocab_size}, "max_len": args.max_len, "batch_size": args.batch_size,
               "eval": {"batches": 0}, "checkpoints": {"log_spaced": False}, "output_dir": out, "progress": False,
               "device": "cuda", "bf16": True, "deterministic": not args.no_deterministic,
               "corpus": {**({"sources": args.sources} if args.sources else {})}}
        cfg = load_train_config(raw)
        data = prepare_data(cfg, get_family(args.family))
        torch.manual_seed(0)
        t0 = time.perf_counter()
        ours = workbench_run(cfg, data)
        ours_wall = time.perf_counter() - t0
        profile_result = profile_steps(cfg, data, args.profile_steps) if args.profile_steps else None
    r_ours = ours["tokens"] / ours["seconds"]
    model_cfg = get_family(args.family).model_config(cfg.preset, cfg.model)
    vocab = len(data.tokenizer)
    f_ours = flops_per_token(model_cfg, vocab, cfg.max_len, 0.15)
    mfu_ours = f_ours["total"] * r_ours / peak["flops_per_s"]
    print(f"ours ({args.preset}, bf16 autocast): {r_ours:,.0f} tokens/s, MFU {100 * mfu_ours:.1f}% "
          f"of the measured bf16 peak", flush=True)
    result = {"family": args.family, "preset": args.preset, "batch_size": args.batch_size, "max_len": args.max_len,
              "steps": args.steps, "deterministic": not args.no_deterministic, "gpu": name,
              "bf16_matmul_peak": peak, "flops_per_token_ours": f_ours, "ours_tokens_per_s": round(r_ours, 1),
              "ours_seconds_per_step": ours["seconds"] / max(1, ours["steps"]), "ours_wall_s_incl_setup": ours_wall,
              "mfu_ours": round(mfu_ours, 4)}  # fmt: skip
    if profile_result is not None:
        result["profile"] = profile_result
        pr = profile_result
        print(f"profile ({pr['steps']} steps): {pr['wall_ms_per_step']} ms per step (building the batch on the host "
              f"{pr['host_batch_ms_per_step']} ms), GPU busy {pr['device_busy_ms_per_step']} ms "
              f"({100 * pr['device_busy_fraction']:.0f}%); host reads per step {pr['host_reads_per_step']}", flush=True)
        for row in pr["top_device"][:10]:
            print(f"  {row['op'][:60]:60s} x{row['count']:<6} device {row['device_ms']:9.2f} ms  host {row['host_self_ms']:9.2f} ms")
    if not args.skip_hf:
        packed = hf_trainer_baseline(cfg, data, args.family, "packed", bf16=True)
        r_pack = packed["tokens"] / packed["seconds"]
        f_pack = flops_per_token(model_cfg, vocab, cfg.max_len, 1.0)
        result.update({"hf_packed_tokens_per_s": round(r_pack, 1), "ratio_vs_packed": round(r_ours / r_pack, 3),
                       "mfu_hf_packed": round(f_pack["total"] * r_pack / peak["flops_per_s"], 4)})
        print(f"HF Trainer packed, bf16: {r_pack:,.0f} tokens/s -> ours {r_ours / r_pack:.2f}x; "
              f"its MFU (head on every position) {100 * result['mfu_hf_packed']:.1f}%", flush=True)
    write_result("bench_gpu", result, start, args.json)
    return result


if __name__ == "__main__":
    main()
