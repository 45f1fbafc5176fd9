"""Training throughput: our loop vs two HF `Trainer` baselines, all in one run, plus MFU.

All three train the same BERT shape (the family's preset) on the same train split for the same
number of optimizer steps with the same batch size and max_len (so the same token budget per step)
and the same torch thread count; the figure is NON-PADDING tokens per second (special tokens
included, padding excluded), measured after a few warm-up steps.

- ours: `workbench.drivers.train` (the family's examples: for BERT, NSP sentence pairs packed up to
  max_len; masked-LM logits only at the predicted positions);
- padded baseline: the common tutorial recipe, one sentence per example, `BertForMaskedLM`, HF
  `Trainer` with `DataCollatorForLanguageModeling` (dynamic padding to the longest sentence in the
  batch; `--baseline-padding max_length` pads every sentence to max_len);
- packed baseline: Hugging Face's own `run_mlm` recipe: every document tokenised with its special
  tokens ([CLS] doc [SEP]), all concatenated and cut into max_len blocks (`group_texts`; the
  remainder dropped), `BertForMaskedLM`, `Trainer` + `DataCollatorForLanguageModeling`: no padding
  at all, the strongest plain-HF peer.

Model FLOPs utilisation (MFU, Chowdhery et al. 2022 appendix B) = analytic training FLOPs per token
x tokens/s / the machine's fp32 matmul FLOP/s, measured in the same run with the same thread count
(`results_io.matmul_peak`: 2048 x 2048 matmuls). The per-token count (printed as a breakdown) is the
forward's matmul FLOPs times 3 (backward = 2x forward; Kaplan et al. 2020): Q/K/V/output
projections 8 d^2 and FFN 4 d f per layer, attention scores and weighted values 4 s d per layer,
the MLM head (transform 2 d^2 + decoder 2 d V) on the predicted positions only (ours) or on every
position (BertForMaskedLM); embeddings (lookups), LayerNorm, GELU and softmax are not counted.
The 2048^2 peak is more than a small model's matmuls can reach, so the run also times the step's own
matmuls alone (`step_matmuls` / `step_matmul_ceiling`: every projection, FFN, attention and head
product at its real shape, forward and backward; before and after the run, each shape's faster
measurement kept, as for the peak) and reports that rate against the peak and our
loop's MFU against it: the part of the gap that is the shapes', and the part that is everything
else in the step.

bf16 (on CPUs that multiply it natively, `amx_bf16` / `avx512_bf16`; `--no-bf16` skips it): the
bf16 matmul peak is measured the same way as the fp32 one (2048 x 2048 bf16 products, before and
after, best 1-second window), our loop runs again with `precision: bf16` (bf16 autocast) on the same
data, and its MFU is reported against the bf16 peak (`mfu_ours_bf16`) and against the fp32 peak
(`mfu_ours_bf16_vs_fp32_peak`, the speed a user gets relative to the fp32 machine), with the ratio
bf16 / fp32 of our loop's tokens/s (`ratio_bf16_vs_fp32`), all from this one run.

`--variants` times the training step itself (forward, backward, clip, AdamW on the same batches)
with CPU options the loop does not use by default (AdamW foreach/fused, bf16 autocast, torch.compile,
`fast_dropout`: every nn.Dropout module swapped for workbench/dropout.py's and, since 2026-11-27,
the attention probabilities' dropout through its `bertology_pcg16` attention function, as the loop
does by default, `dropout_masks: pcg16`; the `default` step here keeps torch's bernoulli_ and SDPA)
and says whether the weights after those steps are bit-identical to the default step's.
`--profile N` runs torch.profiler over N steps of the loop's step and prints where the time goes.

Paired MFU (`paired_step_mfu`, `--paired-windows`, default 8 windows of 3 steps): the loop's own step
(its model with the configured dropout masks, on collated batches) timed in windows, with the fp32
peak re-measured in a 0.5 s slice before and after each window; each window's MFU divides by the mean
of its two slices and the record keeps the median and quartiles. For BERT the packed baseline's
`BertForMaskedLM` steps its own packed batches right after each of our windows, driven the same way
(not by `Trainer`), and the record keeps the median of the windows' speed ratios. The whole-run
figures above divide a rate measured over a minute by a peak, or by a baseline, measured minutes
before or after it; on a host that moves both by 15-35% between minutes, those ratios can be off by
the drift, while the paired ones are not.

Usage: python benchmarks/bench_train.py [--family bert] [--preset small] [--steps 12] [--threads 2]
           [--variants foreach fused bf16 compile] [--profile 4]
Writes benchmarks/results/bench_train-<host>-<time>.json (see results_io.py).
With no bert family it falls back to GPT + DataCollatorForLanguageModeling(mlm=False).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import has_cpu_bf16, matmul_peak, record_start, seconds_per_call, write_result  # noqa: E402


# ---- analytic FLOPs ---------------------------------------------------------------------------


def flops_per_token(model_cfg: dict, vocab: int, seq_len: int, head_fraction: float) -> dict:
    """Training FLOPs per token of a BERT encoder + MLM head (3 x forward matmul FLOPs), by part:
    the workbench's one count (`workbench.cost.flops_per_token`, which every checkpoint's cost
    record uses too). `head_fraction`: share of the tokens that go through the MLM head (0.15 when
    only predicted positions are projected, 1.0 for BertForMaskedLM); `seq_len`: the attention span."""
    from workbench.cost import flops_per_token as family_flops_per_token

    return family_flops_per_token("bert", model_cfg, vocab, seq_len, head_fraction=head_fraction)


def step_matmuls(model_cfg: dict, vocab: int, batch_size: int, seq_len: int, head_fraction: float) -> list[dict]:
    """The matmuls of one training step of a BERT encoder + MLM head, as (kind, shape, count): the
    Q/K/V/output projections and the FFN of every layer on all B x T positions, the attention scores
    and weighted values per head, and the MLM head on the predicted positions. The same products that
    `flops_per_token` counts (so their FLOPs per step equal its total x B x T)."""
    d, n = model_cfg["hidden_size"], model_cfg["num_hidden_layers"]
    f = model_cfg.get("intermediate_size", 4 * d)
    h = model_cfg["num_attention_heads"]
    rows, bh, dh = batch_size * seq_len, batch_size * h, d // h
    head_rows = max(1, int(round(head_fraction * rows)))
    return [
        {"name": "q/k/v/out projection", "op": "linear", "shape": (rows, d, d), "count": 4 * n},
        {"name": "ffn up", "op": "linear", "shape": (rows, d, f), "count": n},
        {"name": "ffn down", "op": "linear", "shape": (rows, f, d), "count": n},
        {"name": "attention scores", "op": "bmm", "shape": (bh, seq_len, dh, seq_len), "count": n},
        {"name": "attention values", "op": "bmm", "shape": (bh, seq_len, seq_len, dh), "count": n},
        {"name": "mlm head transform", "op": "linear", "shape": (head_rows, d, d), "count": 1},
        {"name": "mlm head decoder", "op": "linear", "shape": (head_rows, d, vocab), "count": 1},
    ]


def step_matmul_ceiling(matmuls: list[dict], seconds_per_shape: float = 1.0, dtype: torch.dtype = torch.float32) -> dict:
    """FLOP/s of the step's own matmuls, each timed alone (forward + backward through autograd, as the
    step runs it: `F.linear` with its bias, `torch.bmm`, gradients returned rather than accumulated,
    as after `zero_grad(set_to_none=True)`; best of three windows per shape): the rate
    the model's shapes allow on this CPU at this thread count, nothing else in the step. MFU against
    it says how much of the gap to the 2048^2 peak is the shapes' and how much the step's other work.
    Backward = 2 x forward FLOPs (input and weight gradients)."""
    rows = []
    for mm in matmuls:
        if mm["op"] == "linear":
            m, k, nout = mm["shape"]
            x = torch.randn(m, k, dtype=dtype, requires_grad=True)
            w = torch.randn(nout, k, dtype=dtype, requires_grad=True)
            b = torch.randn(nout, dtype=dtype, requires_grad=True)
            grad = torch.randn(m, nout, dtype=dtype)
            run = lambda: torch.autograd.grad(torch.nn.functional.linear(x, w, b), (x, w, b), grad)  # noqa: E731
            flops = 3 * 2 * m * k * nout
        else:
            bh, t, k, nout = mm["shape"]
            a = torch.randn(bh, t, k, dtype=dtype, requires_grad=True)
            bm = torch.randn(bh, k, nout, dtype=dtype, requires_grad=True)
            grad = torch.randn(bh, t, nout, dtype=dtype)
            run = lambda: torch.autograd.grad(torch.bmm(a, bm), (a, bm), grad)  # noqa: E731
            flops = 3 * 2 * bh * t * k * nout
        best = min(seconds_per_call(run, 3, seconds_per_shape / 3))
        rows.append({**mm, "shape": list(mm["shape"]), "flops_per_call": flops, "seconds_per_call": best,
                     "flops_per_s": flops / best})
    return _ceiling(rows, str(dtype).replace("torch.", ""))


def _ceiling(rows: list[dict], dtype: str) -> dict:
    """The step's matmul totals from its timed shapes: each shape counted as often as the step runs it."""
    flops = sum(r["flops_per_call"] * r["count"] for r in rows)
    seconds = sum(r["seconds_per_call"] * r["count"] for r in rows)
    return {"dtype": dtype, "threads": torch.get_num_threads(), "flops_per_step": flops,
            "matmul_seconds_per_step": seconds, "flops_per_s": flops / seconds, "shapes": rows}


def faster_ceiling(first: dict, second: dict) -> dict:
    """Two `step_matmul_ceiling` measurements of the same shapes (before and after the run) merged
    shape by shape into the faster one, as the 2048^2 peak keeps the better of before and after: on a
    host that steals time for seconds at a time, one measurement can read half the other."""
    rows = [min(a, b, key=lambda r: r["seconds_per_call"]) for a, b in zip(first["shapes"], second["shapes"], strict=True)]
    return {**_ceiling(rows, first["dtype"]), "flops_per_s_before_after": [first["flops_per_s"], second["flops_per_s"]]}


def paired_utilisation(step_flop_rates: list[float], peaks: list[float]) -> list[float]:
    """Each window's step FLOP/s over the mean of the two peak slices beside it (`peaks` has one more
    entry than `step_flop_rates`: slice, window, slice, window, ..., slice). A host that slows the
    VM for seconds at a time slows a window and its neighbouring slices alike, so the ratio keeps
    what whole-run figures, whose peak and steps are measured minutes apart, lose."""
    if len(peaks) != len(step_flop_rates) + 1:
        raise ValueError(f"need one peak slice more than windows: {len(peaks)} slices, {len(step_flop_rates)} windows")
    return [r / ((a + b) / 2) for r, a, b in zip(step_flop_rates, peaks[:-1], peaks[1:])]


def paired_step_mfu(cfg, data, family, batches, flops_per_token: float, steps_per_window: int, slice_seconds: float = 0.5,
                    n: int = 2048, hf_packed: tuple | None = None) -> dict:
    """MFU of the loop's own step (its model with the configured dropout masks, forward, backward,
    clip, AdamW, scheduler; batches already collated, so batch building is not in it) with the fp32
    2048^2 peak re-measured in a short slice before and after every window of `steps_per_window`
    steps (`paired_utilisation`). On this project's shared VMs the peak and the steps drift by
    15-35% over minutes; the median of the windows' ratios is the figure that drift does not set.

    `hf_packed` = (model, collated batches, FLOPs per token): the packed baseline's BertForMaskedLM
    stepped right after each of our windows by the same driver (forward, backward, clip, torch AdamW;
    not `Trainer`, whose bookkeeping only adds to its time), so the two models' speeds are compared
    seconds apart, window by window (`ratio_vs_hf_packed_step`)."""
    from workbench.loop import TrainingHooks, optimizer_step
    from workbench.drivers.train import build_model, build_optimizer, count_tokens, lr_lambda_factory, objective_settings

    torch.manual_seed(1)
    model = build_model(cfg, family, data.tokenizer, 0, torch.device("cpu"))
    for p in getattr(model, "unused_parameters", lambda o: [])(objective_settings(cfg, family)):
        p.requires_grad_(False)
    optimizer = build_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_factory(cfg.warmup_steps(), cfg.total_steps))
    drivers = [(model.train(), optimizer, scheduler, batches, flops_per_token)]
    if hf_packed is not None:
        hf_model, hf_batches, hf_flops = hf_packed
        drivers.append((hf_model.train(), torch.optim.AdamW(hf_model.parameters(), lr=cfg.lr), None, hf_batches, hf_flops))
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    no_hooks = TrainingHooks()

    def peak_slice() -> float:
        t, calls = time.perf_counter(), 0
        while time.perf_counter() - t < slice_seconds:
            torch.mm(a, b, out=out)
            calls += 1
        return 2 * n**3 * calls / (time.perf_counter() - t)

    def window(driver, steps) -> float:
        """FLOP/s of one model over `steps` batches."""
        net, opt, sched, _, flops = driver
        t = time.perf_counter()
        for batch in steps:  # the loop's own step: backward, then clip, optimizer, schedule, zero grads
            net(**batch).loss.backward()
            optimizer_step(net, opt, sched, cfg.clip, no_hooks, 0)
        seconds = time.perf_counter() - t
        return flops * sum(count_tokens(b) for b in steps) / seconds  # non-padding tokens

    for driver in drivers:
        window(driver, driver[3][:1])  # first-call costs
    torch.mm(a, b, out=out)
    peaks, rates = [peak_slice()], [[] for _ in drivers]
    for i in range(1, len(batches) - steps_per_window + 1, steps_per_window):
        for driver, driver_rates in zip(drivers, rates):
            driver_rates.append(window(driver, driver[3][i : i + steps_per_window]))
        peaks.append(peak_slice())
    ratios = paired_utilisation(rates[0], peaks)
    result = {"mfu_median": float(np.median(ratios)), "mfu_quartiles": [float(q) for q in np.percentile(ratios, [25, 75])],
              "mfu_windows": ratios, "step_flops_per_s_windows": rates[0], "peak_slices_flops_per_s": peaks,
              "steps_per_window": steps_per_window, "slice_seconds": slice_seconds, "dropout_masks": cfg.dropout_masks}
    if hf_packed is not None:  # tokens/s ratio per window: FLOP/s over FLOPs per token, ours over theirs
        speed = [(r / flops_per_token) / (h / hf_packed[2]) for r, h in zip(rates[0], rates[1])]
        result.update({"ratio_vs_hf_packed_step_median": float(np.median(speed)), "ratio_vs_hf_packed_step_windows": speed,
                       "ratio_vs_hf_packed_step_quartiles": [float(q) for q in np.percentile(speed, [25, 75])],
                       "hf_packed_step_flops_per_s_windows": rates[1]})
    return result


# ---- ours ---------------------------------------------------------------------------------------


def workbench_run(cfg, data) -> dict:
    """Tokens, seconds, steps and final loss of the workbench's own training loop (`train_seed`) on
    `cfg`, from its log after the warm-up steps."""
    from workbench.drivers.train import Dist, read_log, train_seed

    final = train_seed(cfg, 0, data, Dist())
    log = [r for r in read_log(final.parent) if r["step"] > 0]
    warm = min(3, len(log) - 2)
    a, b = log[warm - 1], log[-1]
    # Checkpoint writing at the last step is not part of the log's elapsed (logged before saving).
    return {"tokens": b["tokens"] - a["tokens"], "seconds": b["elapsed"] - a["elapsed"], "steps": b["step"] - a["step"],
            "final_loss": b["loss"]}


# ---- HF Trainer baselines -------------------------------------------------------------------------


def _hf_model(cfg, tok, family_name: str):
    from transformers import DataCollatorForLanguageModeling

    from workbench.families import get_family

    family = get_family(family_name)
    model_cfg = family.model_config(cfg.preset, cfg.model)
    if family_name == "gpt":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), **model_cfg)), DataCollatorForLanguageModeling(tok, mlm=False)
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, **model_cfg))
    return model, DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)


def _sentence_examples(cfg, data, need: int) -> list[dict]:
    """One sentence per example, as in the usual `tokenizer(dataset["text"], truncation=True)` recipe."""
    from workbench.families.base import add_special_tokens

    tok, tc = data.tokenizer, data.train
    order = np.random.default_rng(0).permutation(tc.num_sentences)
    examples = []
    for i in order:
        ids = tc.sentence(int(i)).tolist()
        if ids:
            examples.append({"input_ids": add_special_tokens(tok, ids[: cfg.max_len - tok.num_special_tokens_to_add()])})
        if len(examples) == need:
            break
    return examples


def _packed_examples(cfg, data, need: int) -> list[dict]:
    """run_mlm's `group_texts`: each document tokenised with its special tokens, all concatenated,
    cut into max_len blocks (the last partial block dropped); documents in a seeded random order,
    as `Trainer` would shuffle a dataset of blocks."""
    from workbench.families.base import add_special_tokens

    tok, tc = data.tokenizer, data.train
    doc_off, sent_off = np.asarray(tc.document_offsets), np.asarray(tc.sentence_offsets)
    stream: list[int] = []
    for d in np.random.default_rng(0).permutation(tc.num_documents):
        lo, hi = int(sent_off[doc_off[d]]), int(sent_off[doc_off[d + 1]])
        if hi > lo:
            stream.extend(add_special_tokens(tok, np.asarray(tc.ids[lo:hi]).tolist()))
        if len(stream) >= need * cfg.max_len:
            break
    n = len(stream) // cfg.max_len
    if n < need:
        raise SystemExit(f"packed baseline: the train split gives {n} blocks of {cfg.max_len}, need {need}")
    return [{"input_ids": stream[i * cfg.max_len : (i + 1) * cfg.max_len]} for i in range(need)]


def _packed_batches(cfg, data, collator, batches: int) -> list[dict]:
    """`batches` collated batches of `_packed_examples`' blocks, in order (the paired windows' baseline)."""
    examples = _packed_examples(cfg, data, batches * cfg.batch_size)
    return [collator(examples[i * cfg.batch_size : (i + 1) * cfg.batch_size]) for i in range(batches)]


def hf_trainer_baseline(cfg, data, family_name: str, recipe: str, bf16: bool = False) -> dict:
    """HF `Trainer` on `recipe`'s examples (`bf16`: mixed precision, for the GPU record in bench_gpu.py)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    tok = data.tokenizer
    tok.model_max_length = cfg.max_len
    torch.manual_seed(0)
    model, collator = _hf_model(cfg, tok, family_name)
    need = (cfg.total_steps + 2) * cfg.batch_size
    examples = _packed_examples(cfg, data, need) if recipe == "packed" else _sentence_examples(cfg, data, need)

    batch_tokens: list[int] = []  # non-padding tokens of each batch, in order

    def collate(batch):
        if recipe == "max_length":
            batch = [tok.pad(ex, padding="max_length", max_length=cfg.max_len) for ex in batch]
        out = collator(batch)
        batch_tokens.append(int(out["attention_mask"].sum()) if "attention_mask" in out else out["input_ids"].numel())
        return out

    step_ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            step_ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=cfg.batch_size, max_steps=cfg.total_steps,
            learning_rate=cfg.lr, warmup_steps=cfg.warmup_steps(), weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.clip, logging_strategy="no", save_strategy="no", report_to=[],
            dataloader_num_workers=0, use_cpu=not torch.cuda.is_available(), seed=0, disable_tqdm=True,
            remove_unused_columns=False, bf16=bf16,
        )
        trainer = Trainer(model=model, args=args, train_dataset=examples, data_collator=collate, callbacks=[Clock()])
        trainer.train()
    warm = min(3, len(step_ends) - 2)
    # Steps warm .. N-1 ran between the end of step warm-1 and the end of step N-1, on batches warm .. N-1.
    n = len(step_ends)
    return {"tokens": sum(batch_tokens[warm:n]), "seconds": step_ends[-1] - step_ends[warm - 1], "steps": n - warm,
            "seq_len": max(len(e["input_ids"]) for e in examples[: cfg.batch_size])}


# ---- the loop's step under CPU options, and the profile -------------------------------------------


def step_setup(cfg, data, steps: int):
    """The loop's model (same init) and `steps` collated batches of its example stream."""
    from workbench.families import get_family
    from workbench.drivers.train import Dist, objective_settings, step_batches

    family = get_family(cfg.family)
    collate = family.make_collator(objective_settings(cfg, family), data.tokenizer)
    stream = step_batches(family, data.train, cfg, 0, Dist(), collate, data.tokenizer, 0, 0, 0, steps)
    batches = [b for step in stream for b in step.micro][:steps]  # the loop's own batches, seed 0
    return family, batches


def _weights_hash(model) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _run_steps(cfg, data, family, batches, variant: str, profile: bool = False) -> dict:
    """Time the loop's step (forward, backward, clip, AdamW, scheduler) on `batches` under one option."""
    from workbench.loop import TrainingHooks, optimizer_step
    from workbench.drivers.train import build_optimizer, count_tokens, lr_lambda_factory, objective_settings

    torch.manual_seed(1)
    model = family.build_model(family.model_config(cfg.preset, cfg.model), data.tokenizer)
    for p in getattr(model, "unused_parameters", lambda o: [])(objective_settings(cfg, family)):
        p.requires_grad_(False)
    optimizer = build_optimizer(model, cfg)
    if variant in ("foreach", "fused"):  # same groups and hyper-parameters, another implementation
        optimizer = torch.optim.AdamW(optimizer.param_groups, lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                                      **{variant: True})
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_factory(cfg.warmup_steps(), cfg.total_steps))
    forward = torch.compile(model) if variant == "compile" else model
    if variant == "fast_dropout":  # workbench/dropout.py: 16-bit PCG64 masks instead of bernoulli_
        from workbench.dropout import use_fast_attention_dropout, use_fast_dropout

        use_fast_dropout(model)
        use_fast_attention_dropout(model)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if variant == "bf16" else contextlib.nullcontext
    model.train()
    torch.manual_seed(2)
    times, tokens = [], []
    prof = None
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        prof = torch_profile(activities=[ProfilerActivity.CPU], record_shapes=False)
    with prof or contextlib.nullcontext():
        for batch in batches:
            t = time.perf_counter()
            with autocast():
                out = forward(**batch)
            out.loss.backward()
            optimizer_step(model, optimizer, scheduler, cfg.clip, TrainingHooks(), 0)
            times.append(time.perf_counter() - t)
            tokens.append(count_tokens(batch))
    warm = min(2, len(times) - 1)  # compile / first-call costs
    res = {"variant": variant, "seconds_per_step": float(np.mean(times[warm:])), "all_step_seconds": times,
           "tokens_per_s": sum(tokens[warm:]) / sum(times[warm:]), "weights_sha": _weights_hash(model),
           "final_loss": float(out.loss.detach())}
    if prof is not None:
        res["profile"] = prof
    return res


def profile_summary(prof, steps: int, top: int = 15) -> dict:
    """Self CPU time by operator (top `top`) and by coarse kind, per step."""
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1.0
    kinds = {"matmul (mm/addmm/bmm/linear)": ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm"),
             "attention (sdpa)": ("scaled_dot_product", "_flash_attention", "_efficient_attention"),
             "optimizer (adamw)": ("adam", "_foreach", "lerp", "addcdiv", "addcmul", "sqrt"),
             "layernorm": ("layer_norm",), "gelu": ("gelu",), "softmax / cross-entropy": ("softmax", "nll", "cross_entropy"),
             "embedding": ("embedding",), "dropout": ("dropout", "bernoulli", "native_dropout"),
             "copies / indexing": ("copy_", "index", "clone", "contiguous", "to", "cat", "masked", "nonzero", "where")}
    by_kind: dict[str, float] = {}
    for e in rows:
        name = e.key.lower()
        kind = next((k for k, keys in kinds.items() if any(s in name for s in keys)), "other")
        by_kind[kind] = by_kind.get(kind, 0.0) + e.self_cpu_time_total
    return {"top_ops_ms_per_step": {e.key: round(e.self_cpu_time_total / 1e3 / steps, 2) for e in rows[:top]},
            "share_by_kind": {k: round(v / total, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "self_cpu_ms_per_step": round(total / 1e3 / steps, 1)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="bert")
    p.add_argument("--preset", default="small")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--sources", nargs="+", default=None, help="corpus sources (default: the pretraining set)")
    p.add_argument("--max-documents", type=int, default=None)
    p.add_argument("--baseline-padding", choices=("longest", "max_length"), default="longest")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--variants", nargs="*", default=[], choices=("foreach", "fused", "bf16", "compile", "fast_dropout"),
                   help="also time the loop's step with these CPU options (default: none)")
    p.add_argument("--variant-steps", type=int, default=8)
    p.add_argument("--profile", type=int, default=0, help="profile this many steps of the loop's step")
    p.add_argument("--peak-seconds", type=float, default=3.0)
    p.add_argument("--paired-windows", type=int, default=8,
                   help="windows of the loop's step, each between two peak slices (paired MFU; 0 skips it)")
    p.add_argument("--paired-steps", type=int, default=3, help="steps per paired window")
    p.add_argument("--no-bf16", action="store_true", help="skip the bf16 peak and bf16 loop (native-bf16 CPUs only)")
    p.add_argument("--json", type=Path, help="output file (default: benchmarks/results/bench_train-<host>-<time>.json)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = record_start()

    from workbench.config import load_train_config
    from workbench.families import available_families, get_family
    from workbench.drivers.train import prepare_data

    family = args.family if args.family in available_families() else "gpt"
    peak_before = matmul_peak(seconds=args.peak_seconds)
    print(f"fp32 matmul peak ({torch.get_num_threads()} threads): {peak_before['flops_per_s'] / 1e9:.1f} GFLOP/s", flush=True)
    with_bf16 = has_cpu_bf16() and not args.no_bf16
    if with_bf16:
        bf16_peak_before = matmul_peak(seconds=args.peak_seconds, dtype=torch.bfloat16)
        print(f"bf16 matmul peak: {bf16_peak_before['flops_per_s'] / 1e9:.1f} GFLOP/s", flush=True)
    with tempfile.TemporaryDirectory() as out:
        raw = {"name": "bench", "family": family, "preset": args.preset, "steps": args.steps,
               "tokenizer": {"vocab_size": args.vocab_size}, "max_len": args.max_len, "batch_size": args.batch_size,
               "eval": {"batches": 0}, "checkpoints": {"log_spaced": False}, "output_dir": out, "progress": False,
               "corpus": {"max_documents": args.max_documents, **({"sources": args.sources} if args.sources else {})}}
        cfg = load_train_config(raw)
        data = prepare_data(cfg, get_family(family))
        model_cfg = get_family(family).model_config(cfg.preset, cfg.model)
        vocab = len(data.tokenizer)
        matmuls = ceiling_before = ceiling_bf16_before = None
        if family == "bert":  # the step's own matmul shapes, timed alone (step_matmuls: BERT's), before and after
            matmuls = step_matmuls(model_cfg, vocab, args.batch_size, cfg.max_len, 0.15)
            ceiling_before = step_matmul_ceiling(matmuls)
            if with_bf16:
                ceiling_bf16_before = step_matmul_ceiling(matmuls, dtype=torch.bfloat16)
        torch.manual_seed(0)
        ours = workbench_run(cfg, data)
    print(f"ours: {ours['tokens'] / ours['seconds']:,.0f} tokens/s", flush=True)
    ours_bf16 = None
    if with_bf16:
        with tempfile.TemporaryDirectory() as out:
            cfg_bf16 = load_train_config({**raw, "output_dir": out, "precision": "bf16"})
            torch.manual_seed(0)
            ours_bf16 = workbench_run(cfg_bf16, data)
        print(f"ours, precision bf16: {ours_bf16['tokens'] / ours_bf16['seconds']:,.0f} tokens/s", flush=True)
    padded = hf_trainer_baseline(cfg, data, family, args.baseline_padding)
    print(f"HF Trainer, one sentence per example: {padded['tokens'] / padded['seconds']:,.0f} tokens/s", flush=True)
    packed = hf_trainer_baseline(cfg, data, family, "packed")
    print(f"HF Trainer, packed blocks (run_mlm group_texts): {packed['tokens'] / packed['seconds']:,.0f} tokens/s", flush=True)

    variants = []
    if args.variants or args.profile:
        fam, batches = step_setup(cfg, data, max(args.variant_steps, args.profile))
        base = _run_steps(cfg, data, fam, batches[: args.variant_steps], "default")
        variants.append(base)
        for v in args.variants:
            if v == "bf16" and not has_cpu_bf16():
                print("bf16: skipped (no AVX-512 BF16 / AMX on this CPU)")
                continue
            try:
                r = _run_steps(cfg, data, fam, batches[: args.variant_steps], v)
            except Exception as exc:  # e.g. torch.compile without a working C++ toolchain
                print(f"{v}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
                variants.append({"variant": v, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                continue
            variants.append(r)
        for r in variants:
            if "error" not in r:
                r["speedup_vs_default_step"] = round(base["seconds_per_step"] / r["seconds_per_step"], 3)
                r["same_weights_as_default"] = r["weights_sha"] == base["weights_sha"]
                print(f"step variant {r['variant']:>8}: {r['seconds_per_step']:.3f} s/step "
                      f"({r['speedup_vs_default_step']:.2f}x default), weights identical to default: "
                      f"{r['same_weights_as_default']}, loss {r['final_loss']:.4f}")
    profile, profiles = None, {}
    if args.profile:  # the default step, and the fast_dropout one when that variant was asked for
        fam, batches = step_setup(cfg, data, args.profile + 1)
        for v in ["default"] + (["fast_dropout"] if "fast_dropout" in args.variants else []):
            r = _run_steps(cfg, data, fam, batches[:1], v)  # warm-up outside the profile
            r = _run_steps(cfg, data, fam, batches[1 : args.profile + 1], v, profile=True)
            profiles[v] = profile_summary(r.pop("profile"), args.profile)
            print(f"profile of the {v} step (self CPU time share by kind):", json.dumps(profiles[v]["share_by_kind"]))
            print("top operators, ms per step:", json.dumps(profiles[v]["top_ops_ms_per_step"], indent=1))
        profile = profiles["default"]
    paired = None
    if args.paired_windows:
        need = 1 + args.paired_windows * args.paired_steps
        fam, batches = step_setup(cfg, data, need)
        hf_packed = None
        if family == "bert":  # the packed baseline's model and batches, stepped beside ours
            torch.manual_seed(0)
            hf_model, collator = _hf_model(cfg, data.tokenizer, family)
            hf_packed = (hf_model, _packed_batches(cfg, data, collator, need),
                         flops_per_token(model_cfg, vocab, cfg.max_len, 1.0)["total"])
        paired = paired_step_mfu(cfg, data, fam, batches, flops_per_token(model_cfg, vocab, cfg.max_len, 0.15)["total"],
                                 args.paired_steps, hf_packed=hf_packed)
        print(f"paired MFU of the loop's step (peak re-measured beside each of {args.paired_windows} windows of "
              f"{args.paired_steps} steps): median {100 * paired['mfu_median']:.1f}% (quartiles "
              f"{' - '.join(f'{100 * q:.1f}%' for q in paired['mfu_quartiles'])}; windows "
              f"{', '.join(f'{100 * x:.1f}' for x in paired['mfu_windows'])})", flush=True)
        if hf_packed is not None:
            print(f"paired, the same windows: ours {paired['ratio_vs_hf_packed_step_median']:.2f}x the packed baseline's "
                  f"BertForMaskedLM step (median; quartiles {' - '.join(f'{q:.2f}x' for q in paired['ratio_vs_hf_packed_step_quartiles'])}"
                  f"; windows {', '.join(f'{x:.2f}' for x in paired['ratio_vs_hf_packed_step_windows'])})", flush=True)
    peak_after = matmul_peak(seconds=args.peak_seconds)
    peak = max(peak_before["flops_per_s"], peak_after["flops_per_s"])
    if with_bf16:
        bf16_peak_after = matmul_peak(seconds=args.peak_seconds, dtype=torch.bfloat16)
        bf16_peak = max(bf16_peak_before["flops_per_s"], bf16_peak_after["flops_per_s"])

    ceiling = ceiling_bf16 = None
    if matmuls is not None:
        ceiling = faster_ceiling(ceiling_before, step_matmul_ceiling(matmuls))
        if with_bf16:
            ceiling_bf16 = faster_ceiling(ceiling_bf16_before, step_matmul_ceiling(matmuls, dtype=torch.bfloat16))
    f_ours = flops_per_token(model_cfg, vocab, cfg.max_len, 0.15)
    f_hf_packed = flops_per_token(model_cfg, vocab, cfg.max_len, 1.0)
    f_hf_padded = flops_per_token(model_cfg, vocab, int(round(padded["tokens"] / max(1, padded["steps"]) / cfg.batch_size)), 1.0)
    r_ours = ours["tokens"] / ours["seconds"]
    r_pad = padded["tokens"] / padded["seconds"]
    r_pack = packed["tokens"] / packed["seconds"]
    mfu = lambda f, r: f["total"] * r / peak  # noqa: E731
    result = {
        "family": family, "preset": args.preset, "batch_size": args.batch_size, "max_len": args.max_len,
        "threads": torch.get_num_threads(), "steps": args.steps, "baseline_padding": args.baseline_padding,
        "ours_tokens_per_s": round(r_ours, 1), "hf_padded_tokens_per_s": round(r_pad, 1),
        "hf_packed_tokens_per_s": round(r_pack, 1),
        "ratio_vs_padded": round(r_ours / r_pad, 3), "ratio_vs_packed": round(r_ours / r_pack, 3),
        "ours_tokens_per_step": ours["tokens"] / max(1, ours["steps"]),
        "hf_padded_tokens_per_step": padded["tokens"] / max(1, padded["steps"]),
        "hf_packed_tokens_per_step": packed["tokens"] / max(1, packed["steps"]),
        "ours_seconds_per_step": ours["seconds"] / max(1, ours["steps"]),
        "hf_padded_seconds_per_step": padded["seconds"] / max(1, padded["steps"]),
        "hf_packed_seconds_per_step": packed["seconds"] / max(1, packed["steps"]),
        "matmul_peak_flops_per_s": peak, "matmul_peak_before": peak_before, "matmul_peak_after": peak_after,
        "flops_per_token": {"ours": f_ours, "hf_packed": f_hf_packed, "hf_padded": f_hf_padded},
        "mfu_ours": round(mfu(f_ours, r_ours), 4), "mfu_hf_packed": round(mfu(f_hf_packed, r_pack), 4),
        "mfu_hf_padded": round(mfu(f_hf_padded, r_pad), 4),
        "step_variants": [{k: v for k, v in r.items() if k != "profile"} for r in variants], "profile": profile,
    }  # fmt: skip
    if "fast_dropout" in profiles:
        result["profile_fast_dropout"] = profiles["fast_dropout"]
    if paired is not None:
        result["paired_step_mfu"] = paired
    if ceiling is not None:
        result.update({"step_matmul_ceiling": ceiling, "step_matmul_ceiling_vs_peak": round(ceiling["flops_per_s"] / peak, 4),
                       "mfu_ours_vs_step_matmul_ceiling": round(f_ours["total"] * r_ours / ceiling["flops_per_s"], 4)})
    if ours_bf16 is not None:
        r_bf16 = ours_bf16["tokens"] / ours_bf16["seconds"]
        result.update({
            "ours_bf16_tokens_per_s": round(r_bf16, 1), "ours_bf16_seconds_per_step": ours_bf16["seconds"] / max(1, ours_bf16["steps"]),
            "ours_bf16_final_loss": ours_bf16["final_loss"], "ours_final_loss": ours["final_loss"],
            "ratio_bf16_vs_fp32": round(r_bf16 / r_ours, 3), "ratio_bf16_vs_packed": round(r_bf16 / r_pack, 3),
            "bf16_matmul_peak_flops_per_s": bf16_peak, "bf16_matmul_peak_before": bf16_peak_before,
            "bf16_matmul_peak_after": bf16_peak_after, "bf16_peak_vs_fp32_peak": round(bf16_peak / peak, 3),
            "mfu_ours_bf16": round(f_ours["total"] * r_bf16 / bf16_peak, 4),
            "mfu_ours_bf16_vs_fp32_peak": round(f_ours["total"] * r_bf16 / peak, 4),
        })  # fmt: skip
        if ceiling_bf16 is not None:
            result.update({"step_matmul_ceiling_bf16": ceiling_bf16,
                           "mfu_ours_bf16_vs_step_matmul_ceiling": round(f_ours["total"] * r_bf16 / ceiling_bf16["flops_per_s"], 4)})
    result["steps_in_10_minutes_ours"] = int(600 / result["ours_seconds_per_step"])
    result["tokens_in_10_minutes_ours"] = int(600 * r_ours)

    print("\ntraining FLOPs per token (3 x forward matmuls; embeddings, norms, activations excluded):")
    for k in ("attention_qkv_out", "ffn", "attention_scores_values", "mlm_head", "total"):
        print(f"  {k:<24} ours {f_ours[k] / 1e6:7.2f} M   BertForMaskedLM {f_hf_packed[k] / 1e6:7.2f} M")
    print(f"\nmatmul peak {peak / 1e9:.1f} GFLOP/s ({torch.get_num_threads()} threads, fp32 2048^2; "
          f"before {peak_before['flops_per_s'] / 1e9:.1f}, after {peak_after['flops_per_s'] / 1e9:.1f})")
    print(f"non-padding tokens/s: ours {r_ours:,.0f} | HF Trainer one sentence per example {r_pad:,.0f} "
          f"-> {r_ours / r_pad:.2f}x | HF Trainer packed (group_texts) {r_pack:,.0f} -> {r_ours / r_pack:.2f}x (target >= 1.5x, issue 30)")
    print(f"MFU: ours {100 * result['mfu_ours']:.1f}% | HF packed {100 * result['mfu_hf_packed']:.1f}% "
          f"(its head on every position) | HF padded {100 * result['mfu_hf_padded']:.1f}%")
    if ceiling is not None:
        print(f"the step's own matmul shapes alone (step_matmul_ceiling): {ceiling['flops_per_s'] / 1e9:.1f} GFLOP/s = "
              f"{100 * result['step_matmul_ceiling_vs_peak']:.0f}% of the 2048^2 peak, {ceiling['matmul_seconds_per_step']:.3f} s "
              f"per step of matmuls; ours {100 * result['mfu_ours_vs_step_matmul_ceiling']:.1f}% of it "
              f"(before / after the run: {' / '.join(f'{x / 1e9:.1f}' for x in ceiling['flops_per_s_before_after'])} GFLOP/s, "
              f"each shape's faster kept)")
        for r in ceiling["shapes"]:
            print(f"  {r['name']:<22} {'x'.join(map(str, r['shape'])):<18} x{r['count']:<3} {r['flops_per_s'] / 1e9:7.1f} GFLOP/s")
    if ours_bf16 is not None:
        print(f"bf16: matmul peak {bf16_peak / 1e9:.1f} GFLOP/s ({result['bf16_peak_vs_fp32_peak']:.2f}x fp32's); ours "
              f"{result['ours_bf16_tokens_per_s']:,.0f} tokens/s = {result['ratio_bf16_vs_fp32']:.2f}x fp32, "
              f"{result['ratio_bf16_vs_packed']:.2f}x HF packed (fp32); MFU {100 * result['mfu_ours_bf16']:.1f}% of the bf16 "
              f"peak ({100 * result['mfu_ours_bf16_vs_fp32_peak']:.1f}% of the fp32 peak)")
        if ceiling_bf16 is not None:
            print(f"bf16 step matmul shapes alone: {ceiling_bf16['flops_per_s'] / 1e9:.1f} GFLOP/s; ours bf16 "
                  f"{100 * result['mfu_ours_bf16_vs_step_matmul_ceiling']:.1f}% of it")
    write_result("bench_train", result, start, args.json)
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
