"""Training throughput: our loop vs HF `Trainer` + `DataCollatorForLanguageModeling`, same run.

Both train the same BERT shape (the family's preset) on the same train split for the same number
of optimizer steps with the same batch size; the figure is NON-PADDING tokens per second (special
tokens included, padding excluded), measured after a few warm-up steps.

- ours: `workbench.train` (the family's examples: for BERT, NSP sentence pairs packed up to
  max_len; masked-LM logits only at the predicted positions);
- baseline: the common recipe, one sentence per example, `BertForMaskedLM`, HF `Trainer` with
  `DataCollatorForLanguageModeling` (dynamic padding to the longest sentence in the batch;
  `--baseline-padding max_length` pads every sentence to max_len as many tutorials do).

Usage: python benchmarks/bench_train.py [--family bert] [--preset small] [--steps 12]
Prints both rates and their ratio (target >= 1.5x, mostly from not computing on padding).
With no bert family it falls back to GPT + DataCollatorForLanguageModeling(mlm=False).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def _ours(cfg, data) -> dict:
    from workbench.train import Dist, read_log, train_seed

    final = train_seed(cfg, 0, data, Dist())
    log = [r for r in read_log(final.parent) if r["step"] > 0]
    warm = min(3, len(log) - 2)
    a, b = log[warm - 1], log[-1]
    # Checkpoint writing at the last step is not part of the log's elapsed (logged before saving).
    return {"tokens": b["tokens"] - a["tokens"], "seconds": b["elapsed"] - a["elapsed"], "steps": b["step"] - a["step"],
            "final_loss": b["loss"]}


def _baseline(cfg, data, family_name: str, padding: str) -> dict:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

    from workbench.families import get_family

    tok = data.tokenizer
    tok.model_max_length = cfg.max_len
    family = get_family(family_name)
    model_cfg = family.model_config(cfg.preset, cfg.model)
    if family_name == "gpt":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), **model_cfg))
        collator = DataCollatorForLanguageModeling(tok, mlm=False)
    else:
        from transformers import BertConfig, BertForMaskedLM

        model = BertForMaskedLM(BertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, **model_cfg))
        collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)
    # One sentence per example, as in the usual `tokenizer(dataset["text"], truncation=True)` recipe.
    tc = data.train
    rng = np.random.default_rng(0)
    need = (cfg.total_steps + 2) * cfg.batch_size
    order = rng.permutation(tc.num_sentences)
    from workbench.families.base import add_special_tokens

    examples = []
    for i in order:
        ids = tc.sentence(int(i)).tolist()
        if ids:
            examples.append({"input_ids": add_special_tokens(tok, ids[: cfg.max_len - tok.num_special_tokens_to_add()])})
        if len(examples) == need:
            break

    batch_tokens: list[int] = []  # non-padding tokens of each batch, in order

    def collate(batch):
        if padding == "max_length":
            batch = [tok.pad(ex, padding="max_length", max_length=cfg.max_len) for ex in batch]
        out = collator(batch)
        batch_tokens.append(int(out["attention_mask"].sum()))
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
            remove_unused_columns=False,
        )
        trainer = Trainer(model=model, args=args, train_dataset=examples, data_collator=collate, callbacks=[Clock()])
        trainer.train()
    warm = min(3, len(step_ends) - 2)
    # Steps warm .. N-1 ran between the end of step warm-1 and the end of step N-1, on batches warm .. N-1.
    n = len(step_ends)
    return {"tokens": sum(batch_tokens[warm:n]), "seconds": step_ends[-1] - step_ends[warm - 1], "steps": n - warm}


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
    p.add_argument("--json", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from workbench.config import load_config
    from workbench.families import available_families
    from workbench.train import prepare_data

    family = args.family if args.family in available_families() else "gpt"
    with tempfile.TemporaryDirectory() as out:
        raw = {"name": "bench", "family": family, "preset": args.preset, "steps": args.steps,
               "tokenizer": {"vocab_size": args.vocab_size}, "max_len": args.max_len, "batch_size": args.batch_size,
               "eval": {"batches": 0}, "checkpoints": {"log_spaced": False}, "output_dir": out, "progress": False,
               "corpus": {"max_documents": args.max_documents, **({"sources": args.sources} if args.sources else {})}}
        cfg = load_config(raw)
        from workbench.families import get_family

        data = prepare_data(cfg, get_family(family))
        torch.manual_seed(0)
        ours = _ours(cfg, data)
    base = _baseline(cfg, data, family, args.baseline_padding)
    r_ours = ours["tokens"] / ours["seconds"]
    r_base = base["tokens"] / base["seconds"]
    result = {
        "family": family, "preset": args.preset, "batch_size": args.batch_size, "max_len": args.max_len,
        "threads": torch.get_num_threads(), "baseline_padding": args.baseline_padding,
        "ours_tokens_per_s": round(r_ours, 1), "baseline_tokens_per_s": round(r_base, 1),
        "ratio": round(r_ours / r_base, 3),
        "ours_tokens_per_step": ours["tokens"] / max(1, ours["steps"]),
        "baseline_tokens_per_step": base["tokens"] / max(1, base["steps"]),
        "ours_seconds_per_step": ours["seconds"] / max(1, ours["steps"]),
        "baseline_seconds_per_step": base["seconds"] / max(1, base["steps"]),
    }
    result["steps_in_10_minutes_ours"] = int(600 / result["ours_seconds_per_step"])
    result["tokens_in_10_minutes_ours"] = int(600 * r_ours)
    print(json.dumps(result, indent=2))
    print(f"non-padding tokens/s: ours {r_ours:,.0f} vs HF Trainer {r_base:,.0f} -> {r_ours / r_base:.2f}x")
    if args.json:
        from workbench.io import atomic_write_json

        atomic_write_json(Path(args.json), result)
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
