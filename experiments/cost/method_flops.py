"""What one fine-tuning step of each method computes, measured against the count (docs/cost.md,
"Fine-tuning methods and distillation: what a step costs").

For every method of `workbench.running.peft_methods.METHODS` but ELMo's: the classifier of a checkpoint (eager
attention, so every matmul is one torch op), the method attached and its parameter filter applied
as the fine-tuning runner does, then one forward + backward of a batch of B x S tokens (no padding)
under torch's FlopCounterMode. Printed beside it: the count `workbench.cost.finetune_flops` gives
for the method (`PASSES`: Kaplan et al. 2020's 6N split into forward, activation and weight
gradients) and the old count (3 x the forward for every method, no term for the method's own
matrices). The measured step includes the pooler and classifier once per sequence; the count puts a
linear head on every token (an upper bound); both are under 0.5% of the body here.

Usage: python experiments/cost/method_flops.py [CHECKPOINT] [--batch 8] [--seq 64] [--json OUT.json]
(default checkpoint: sentence-transformers/all-MiniLM-L6-v2 from the local HF cache; HF_HUB_OFFLINE=1)
"""

from __future__ import annotations

import argparse
import sys

import torch


def measure(checkpoint: str, method: str, batch: int, seq: int, labels: int = 2) -> dict:
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForSequenceClassification

    from workbench.store.checkpoints import resolve_checkpoint
    from workbench.cost import finetune_flops, method_forward_flops
    from workbench.loop import apply_param_filter
    from workbench.running.model_loading import load_weights
    from workbench.running.peft_methods import attach

    torch.manual_seed(0)
    model = load_weights(AutoModelForSequenceClassification, resolve_checkpoint(checkpoint), num_labels=labels,
                         attn_implementation="eager")
    record = apply_param_filter(model, attach(model, method))
    model.train()
    vocab = model.config.vocab_size
    ids = torch.randint(1000, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    if method == "prompt":  # the prompt's ids after the [CLS], as the runner inserts them
        n = model.get_input_embeddings().prompt.shape[0]
        ids[:, 1:1 + min(n, seq - 2)] = torch.arange(vocab, vocab + min(n, seq - 2))
    y = torch.randint(0, labels, (batch,), generator=torch.Generator().manual_seed(2))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=y).loss.backward()
    extra = method_forward_flops(model) if method not in ("full", "head") else 0.0
    count = finetune_flops("bert", model.config.to_dict(), seq, labels, method, extra)
    tokens = batch * seq
    old = 3 * sum(count["forward"][k] for k in ("body_weights", "body_scores", "head"))
    return {"method": method, "trainable": record.get("parameters"), "tokens": tokens,
            "measured_per_token": counter.get_total_flops() / tokens, "count_per_token": count["total"],
            "old_count_per_token": old, "forward_per_token": sum(count["forward"][k] for k in
                                                                 ("body_weights", "body_scores", "head")),
            "method_forward_per_token": extra}


def main(argv=None) -> int:
    from workbench.running.peft_methods import METHODS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", nargs="?", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.batch < 1 or args.seq < 8:
        print(f"error: --batch must be >= 1 and --seq >= 8, got {args.batch}, {args.seq}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    rows = [measure(args.checkpoint, m, args.batch, args.seq) for m in METHODS]
    print(f"{args.checkpoint}, one step of {args.batch} x {args.seq} tokens; FLOPs per token, "
          f"in multiples of the forward ({rows[0]['forward_per_token']:.4g})")
    print("| method | trainable | measured | count (new) | old count (3x) | measured / forward | new / forward | old / forward |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        f = r["forward_per_token"]
        print(f"| {r['method']} | {r['trainable']:,} | {r['measured_per_token']:.4g} | {r['count_per_token']:.4g} | "
              f"{r['old_count_per_token']:.4g} | {r['measured_per_token'] / f:.3f} | {r['count_per_token'] / f:.3f} | "
              f"{r['old_count_per_token'] / f:.3f} |")
    if args.json:
        from workbench.io import atomic_write_json

        atomic_write_json(args.json, {"checkpoint": args.checkpoint, "batch": args.batch, "seq": args.seq, "rows": rows})
    return 0


if __name__ == "__main__":
    from workbench.errors import cli_errors

    sys.exit(cli_errors(main))
