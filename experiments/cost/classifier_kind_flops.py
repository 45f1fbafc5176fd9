"""What a T5 / BART classifier's forward computes, by classifier kind, measured against the count
(docs/evidence/cost.md, "Issue 49: the classifier that runs, and Kaplan's 6ND").

For t5-small's shape (Raffel et al. 2020: d 512, 8 x 64 heads, FFN 2048, 6 + 6 layers) and
bart-base's (d 768, FFN 3072, 6 + 6 layers), randomly initialised (the FLOPs do not depend on the
weights, nothing is downloaded): each classifier kind the fine-tuning runner builds
(`workbench.running.classifier_loading.classifier_class`: transformers' `*ForSequenceClassification`
for decoder_last, the workbench's encoder-mean head, transformers' / the workbench's token head),
one forward of B x S tokens (no padding, eager attention) under torch's FlopCounterMode, per token.
Printed beside it: the count `workbench.cost.finetune_forward_flops(..., classifier)` gives now, the
count before issue 49 (the pretraining body: T5's decoder on 0.2 target tokens per input token, BART's
on the whole input, whatever classifier ran), and Kaplan et al. (2020)'s 2N forward
(`workbench.cost.non_embedding_params`). Then GPT-2 small's full forward against Kaplan's.

Usage: python experiments/cost/classifier_kind_flops.py [--batch 2] [--seq 64] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys


SHAPES = {
    "t5": ("T5Config", {"d_model": 512, "d_ff": 2048, "num_heads": 8, "d_kv": 64, "num_layers": 6,
                        "num_decoder_layers": 6, "vocab_size": 32128, "decoder_start_token_id": 0, "pad_token_id": 0,
                        "eos_token_id": 1}),
    "bart": ("BartConfig", {"d_model": 768, "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072, "encoder_layers": 6,
                            "decoder_layers": 6, "encoder_attention_heads": 12, "decoder_attention_heads": 12,
                            "vocab_size": 50265}),
}


def measured_forward(family: str, kind: str, batch: int, seq: int, labels: int = 2) -> float:
    """Forward FLOPs per token of the classifier of `kind`, counted by torch."""
    import torch
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    from workbench.running.classifier_loading import classifier_class

    cls_name, shape = SHAPES[family]
    token = kind == "token"
    config = getattr(transformers, cls_name)(**shape, num_labels=labels, attn_implementation="eager")
    cls = classifier_class(family, "token" if token else "sentence", kind)
    if cls is None:
        cls = transformers.AutoModelForTokenClassification if token else transformers.AutoModelForSequenceClassification
        model = cls.from_config(config, attn_implementation="eager")
    else:
        model = cls(config)
    model.eval()
    torch.manual_seed(0)
    ids = torch.randint(5, 1000, (batch, seq))
    ids[:, -1] = config.eos_token_id  # decoder_last reads the state at the final </s>
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return counter.get_total_flops() / (batch * seq)


def main(argv=None) -> int:
    from workbench import cost

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    out = []
    print(f"{'family':<6} {'classifier':<13} {'measured':>10} {'count':>10} {'ratio':>6} {'before':>10} "
          f"{'before/meas':>11} {'Kaplan 2N':>10}   (forward FLOPs per token, millions; B={args.batch}, S={args.seq})")
    for family, (_, shape) in SHAPES.items():
        # the count before issue 49: the pretraining body (vocabulary 0: no LM head) + the linear head
        before = cost.forward_flops_per_token(family, shape, 0, args.seq)["total"] + 2 * shape["d_model"] * 2
        for kind in ("decoder_last", "encoder_mean", "token"):
            count = sum(cost.finetune_forward_flops(family, shape, args.seq, 2, kind).values())
            meas = measured_forward(family, kind, args.batch, args.seq)
            two_n = 2 * cost.non_embedding_params(family, shape, kind)
            out.append({"family": family, "classifier": kind, "measured": meas, "count": count, "before": before,
                        "kaplan_forward_2N": two_n})
            print(f"{family:<6} {kind:<13} {meas / 1e6:>10.2f} {count / 1e6:>10.2f} {count / meas:>6.3f} "
                  f"{before / 1e6:>10.2f} {before / meas:>11.3f} {two_n / 1e6:>10.2f}")
    gpt = {"n_embd": 768, "n_layer": 12}
    full = cost.forward_flops_per_token("gpt", gpt, 50257, 1024)["total"]
    n = cost.non_embedding_params("gpt", gpt)
    kaplan_fwd = 2 * n + 2 * 12 * 1024 * 768
    print(f"GPT-2 small (1,024 tokens): N = {n:,}; full forward {full / 1e6:.1f} M = {full / kaplan_fwd:.3f} x Kaplan's "
          f"2N + 2 n_layer n_ctx d ({kaplan_fwd / 1e6:.1f} M), {full / (2 * n):.3f} x 2N; training: full "
          f"{3 * full / 1e6:.1f} M vs 6N {6 * n / 1e6:.1f} M per token")
    out.append({"family": "gpt", "what": "gpt2-small", "N": n, "full_forward": full, "kaplan_forward": kaplan_fwd})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
