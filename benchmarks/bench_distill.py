"""Task-distillation step throughput (workbench/drivers/distill.py) as a fraction of this machine's matmul peak,
and the teacher's cost per step with and without caching its logits (`CachedTeacher`).

The step is the workbench's own: `workbench.loop.loss_terms` (student forward, teacher forward under
no_grad, `TaskKD`), backward, `optimizer_step` (AdamW), on a MiniLM-shaped teacher (6 x 384, vocab
30,522, random weights: the FLOPs do not depend on the values) and a 3-layer student cut from it
(`cut_student`, layers [0, 3, 5]), batches of B sentences x T tokens without padding.

FLOPs counted (matmuls only, 2 per multiply-add): per token and layer 8 d^2 (Q, K, V, output) +
4 d f (FFN) + 4 T d (scores and values); per sequence 2 d^2 (pooler) + 2 d c (classifier). The
teacher runs forward once (1x), the student forward and backward (3x). MFU = counted FLOPs per
second / the fp32 matmul peak (`results_io.matmul_peak`, best of before and after; Chowdhery et al.
2022, appendix B). The teacher cache: two epochs over the same batches; with the cache the second
epoch's teacher calls are dictionary look-ups.

Where the time goes (`--profile-steps`, torch.profiler over the workbench's step): per phase
(teacher forward, student forward, backward, optimizer) and the top operators by self time. The
first profile (2026-11-26) found the optimizer at 17% of the step: `torch.optim.AdamW` on the CPU
defaults to its per-tensor for-loop implementation (sqrt, div, lerp, addcdiv, ... one pass over
memory each, per parameter), and a student keeps the teacher's 11.7M-entry word embeddings, so it
steps 17.4M parameters. The step is therefore timed with three AdamW implementations side by side,
round-robin (one step of each in turn, so a load change hits all three alike): `loop` (what
`workbench.loop.adamw`, hence `bertology distill`, runs today), `foreach` (bit-identical results)
and `fused` (one kernel; results differ in the last bit, 1e-7). `mfu` is the workbench's step
(`loop`); `variants` holds each.

Run: OMP_NUM_THREADS=1 python benchmarks/bench_distill.py [--threads 1 --batch 32 --seq 64 --steps 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_io import matmul_peak, record_start, write_result  # noqa: E402


def step_flops(d: int, f: int, layers: int, seq: int, batch: int, classes: int, passes: int) -> float:
    """Matmul FLOPs of `passes` x one forward of a BERT classifier over a batch (module docstring)."""
    per_token = layers * (8 * d * d + 4 * d * f + 4 * seq * d)
    per_sequence = 2 * d * d + 2 * d * classes
    return float(passes * (batch * seq * per_token + batch * per_sequence))


def main(argv=None) -> dict:
    from transformers import BertConfig, BertForSequenceClassification

    from workbench.drivers.distill import CachedTeacher, TaskKD, cut_student, student_layers
    from workbench.loop import TrainingHooks, adamw, loss_terms, optimizer_step, prepare_teacher

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--student-layers", type=int, default=3)
    p.add_argument("--peak-seconds", type=float, default=2.0)
    p.add_argument("--profile-steps", type=int, default=2, help="steps under torch.profiler (0: none)")
    p.add_argument("--variants", default="loop,foreach,fused", help="AdamW implementations timed side by side")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = record_start()
    peak_before = matmul_peak(seconds=args.peak_seconds)

    d, f, L, V, C = 384, 1536, 6, 30522, 2
    torch.manual_seed(0)
    config = BertConfig(vocab_size=V, hidden_size=d, num_hidden_layers=L, num_attention_heads=12, intermediate_size=f,
                        max_position_embeddings=512, num_labels=C, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    teacher = BertForSequenceClassification(config).eval()
    layers = student_layers(L, args.student_layers)
    g = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(1000, V, (args.batch, args.seq), generator=g),
                "attention_mask": torch.ones(args.batch, args.seq, dtype=torch.long),
                "labels": torch.randint(0, C, (args.batch,), generator=g)} for _ in range(args.steps)]

    def run(cache: bool, epochs: int) -> dict:
        student = cut_student(teacher, layers).train()
        t_module = CachedTeacher(teacher) if cache else teacher
        hooks = prepare_teacher(TrainingHooks(loss=TaskKD(2.0, 0.5), teacher=t_module), torch.device("cpu"))
        opt = adamw(student.named_parameters(), 1e-4, 0.01)
        teacher_seconds = []
        # time the teacher's share: the same forward the loop makes, alone, before each step
        step_seconds = []
        for epoch in range(epochs):
            for b in batches:
                t0 = time.perf_counter()
                with torch.no_grad():
                    t_module(**b)
                t1 = time.perf_counter()
                terms = loss_terms(student, b, hooks, lambda out, batch: {"loss": out.loss})
                terms["loss"].backward()
                optimizer_step(student, opt, None, 1.0, hooks, 1)
                t2 = time.perf_counter()
                teacher_seconds.append((epoch, t1 - t0))
                step_seconds.append((epoch, t2 - t1))
        return {"teacher_seconds": teacher_seconds, "step_seconds": step_seconds,
                "served": getattr(t_module, "served", None), "computed": getattr(t_module, "computed", None)}

    def make_student(optimizer: str):
        student = cut_student(teacher, layers).train()
        kw = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[optimizer]
        groups = adamw(student.named_parameters(), 1e-4, 0.01).param_groups  # the workbench's (decay on matrices)
        opt = torch.optim.AdamW([{"params": g["params"], "weight_decay": g["weight_decay"]} for g in groups],
                                lr=1e-4, **kw)
        return student, opt

    def variants(names: list[str]) -> dict:
        """The workbench's step with each AdamW implementation, one step of each in turn."""
        hooks = prepare_teacher(TrainingHooks(loss=TaskKD(2.0, 0.5), teacher=teacher), torch.device("cpu"))
        runs = {n: make_student(n) for n in names}
        times = {n: [] for n in names}
        for b in batches:
            for n, (student, opt) in runs.items():
                t0 = time.perf_counter()
                terms = loss_terms(student, b, hooks, lambda out, batch: {"loss": out.loss})
                terms["loss"].backward()
                optimizer_step(student, opt, None, 1.0, hooks, 1)
                times[n].append(time.perf_counter() - t0)
        return times

    def profile(steps: int, optimizer: str) -> dict:
        """torch.profiler over `steps` workbench steps: seconds per phase and the top operators."""
        from torch.profiler import ProfilerActivity, record_function
        from torch.profiler import profile as torch_profile

        student, opt = make_student(optimizer)
        hooks = prepare_teacher(TrainingHooks(loss=TaskKD(2.0, 0.5), teacher=teacher), torch.device("cpu"))
        kd = TaskKD(2.0, 0.5)
        phases = ("teacher_forward", "student_forward", "backward", "optimizer")
        terms = loss_terms(student, batches[0], hooks, lambda out, batch: {"loss": out.loss})  # warm-up: the
        terms["loss"].backward()  # optimizer state is allocated (zero-filled) on the first step
        optimizer_step(student, opt, None, 1.0, hooks, 1)
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for b in batches[1 : 1 + steps]:
                with record_function("teacher_forward"), torch.no_grad():
                    t_out = teacher(**b)
                with record_function("student_forward"):
                    loss = kd(student(**b), b, t_out)["loss"]
                with record_function("backward"):
                    loss.backward()
                with record_function("optimizer"):
                    optimizer_step(student, opt, None, 1.0, hooks, 1)
        events = prof.key_averages()
        per_phase = {e.key: e.cpu_time_total / 1e6 / steps for e in events if e.key in phases}
        ops = sorted((e for e in events if e.key not in phases and not e.key.startswith(("Optimizer.", "autograd::"))),
                     key=lambda e: -e.self_cpu_time_total)
        total = sum(e.self_cpu_time_total for e in events) / 1e6 / steps
        top = [{"op": e.key, "self_seconds_per_step": round(e.self_cpu_time_total / 1e6 / steps, 4),
                "share": round(e.self_cpu_time_total / 1e6 / steps / total, 4), "calls_per_step": e.count // steps}
               for e in ops[:15]]
        matmul = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm")) / 1e6 / steps
        return {"optimizer": optimizer, "steps": steps, "seconds_per_phase": per_phase,
                "self_seconds_per_step": total, "matmul_share": round(matmul / total, 4), "top_ops": top}

    plain = run(cache=False, epochs=1)
    cached = run(cache=True, epochs=2)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    timed = variants(names)
    profiles = [profile(args.profile_steps, n) for n in ("loop", "fused")] if args.profile_steps else []
    peak_after = matmul_peak(seconds=args.peak_seconds)
    peak = max(peak_before["flops_per_s"], peak_after["flops_per_s"])

    import statistics

    step_s = statistics.median(s for _, s in plain["step_seconds"][1:])  # first step warms up
    flops = (step_flops(d, f, L, args.seq, args.batch, C, 1)
             + step_flops(d, f, args.student_layers, args.seq, args.batch, C, 3))
    variant_rows = {}
    for n, ts in timed.items():
        med = statistics.median(ts[1:])
        variant_rows[n] = {"step_seconds_median": med, "flops_per_s": flops / med, "mfu": round(flops / med / peak, 4),
                           "step_seconds": ts}
    base = variant_rows.get("loop")
    for n, v in variant_rows.items():
        if base:
            v["speedup_vs_loop"] = round(base["step_seconds_median"] / v["step_seconds_median"], 3)
    teacher_plain = statistics.median(s for _, s in plain["teacher_seconds"][1:])
    teacher_cached_epoch2 = statistics.median(s for e, s in cached["teacher_seconds"] if e == 1)
    result = {
        "threads": args.threads, "batch": args.batch, "seq": args.seq, "steps": args.steps,
        "teacher": {"layers": L, "hidden": d, "ffn": f, "vocab": V}, "student_layers": layers,
        "flops_per_step": flops, "step_seconds_median": step_s, "flops_per_s": flops / step_s,
        "matmul_peak_flops_per_s": peak, "matmul_peak_before": peak_before, "matmul_peak_after": peak_after,
        "mfu": round(flops / step_s / peak, 4),
        "teacher_seconds_per_step_uncached": teacher_plain,
        "teacher_seconds_per_step_cached_second_epoch": teacher_cached_epoch2,
        "teacher_cache_speedup": round(teacher_plain / max(teacher_cached_epoch2, 1e-9), 1),
        "teacher_share_of_step_uncached": round(teacher_plain / step_s, 3),  # step_s includes the teacher
        "cache_counts": {"computed": cached["computed"], "served": cached["served"]},
        "variants": variant_rows, "profiles": profiles,
    }
    print(f"matmul peak {peak / 1e9:.1f} GFLOP/s ({args.threads} thread(s)); distillation step "
          f"{step_s * 1000:.0f} ms = {flops / step_s / 1e9:.1f} GFLOP/s = MFU {100 * result['mfu']:.1f}% "
          f"(teacher fwd + student fwd/bwd, {flops / 1e9:.1f} GFLOP per step)")
    print(f"teacher per step: {teacher_plain * 1000:.1f} ms uncached, {teacher_cached_epoch2 * 1000:.2f} ms cached "
          f"(second epoch; x{result['teacher_cache_speedup']}); computed {cached['computed']} of {cached['served']} "
          f"examples served")
    for n, v in variant_rows.items():
        print(f"  AdamW {n:8s}: step {v['step_seconds_median'] * 1000:.0f} ms, MFU {100 * v['mfu']:.1f}%"
              + (f", x{v['speedup_vs_loop']} vs loop" if "speedup_vs_loop" in v else ""))
    for prof in profiles:
        phases = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in prof["seconds_per_phase"].items())
        print(f"  profile ({prof['optimizer']} AdamW): {phases}; matmuls {100 * prof['matmul_share']:.0f}% of self time")
        for op in prof["top_ops"][:8]:
            print(f"    {op['op']:<50s} {op['self_seconds_per_step'] * 1000:8.1f} ms  {100 * op['share']:5.1f}%")
    if not args.no_write:
        print(f"result: {write_result('bench_distill', result, start)}")
    return result


if __name__ == "__main__":
    main()
