"""Does a trained GPT beat a bigram? Held-out perplexity of a checkpoint vs `workbench.ngram`.

Both are scored on the same held-out split with the same tokenizer ids: the GPT on the held-out
stream cut into contiguous blocks of the training `max_len` (all of them, in a fixed order; the
first token of each block has no context, which only handicaps the GPT), the bigram models
(interpolated Kneser-Ney and add-0.01) fitted on the training split's stream and scored on the
whole held-out stream. Prints both perplexities and their ratio (GPT / best bigram; < 1 means
the GPT learned more than adjacent-token statistics).

Usage: python benchmarks/gpt_vs_bigram.py RUNS/train/NAME/seed-0/step-NNNNNNN [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a GPT checkpoint folder written by the workbench (step-NNNNNNN)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from workbench.config import load_train_config
    from workbench.families import get_family
    from workbench.ngram import bigram_perplexity
    from workbench.drivers.train import evaluate_heldout, prepare_data

    ckpt = Path(args.checkpoint)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    cfg = load_train_config({**manifest["config"], "progress": False, "batch_size": args.batch_size})
    family = get_family(cfg.family)
    if family.name != "gpt":
        raise SystemExit(f"{ckpt}: family {family.name}, expected gpt")
    data = prepare_data(cfg, family)
    V = len(data.tokenizer)
    train_stream, heldout_stream = data.train.stream_with_separators(), data.heldout.stream_with_separators()
    bigrams = {s: bigram_perplexity(train_stream, heldout_stream, V, smoothing=s, **({"k": 0.01} if s == "add_k" else {}))
               for s in ("kneser_ney", "add_k")}

    from workbench.running.model_loading import load_pretrainer

    model = load_pretrainer(ckpt, "gpt")
    block = cfg.max_len - data.heldout.num_special
    n_batches = (len(heldout_stream) // block) // cfg.batch_size
    res = evaluate_heldout(model, family, data.heldout, data.tokenizer, cfg, n_batches, torch.device("cpu"))
    gpt_ppl = math.exp(res["lm"])
    best = min(bigrams.values(), key=lambda b: b.nll)
    print(f"checkpoint {ckpt} (step {manifest.get('step', '?')}, {manifest.get('tokens_seen', '?')} tokens)")
    print(f"held-out: {len(heldout_stream):,} ids; GPT scored on {n_batches * cfg.batch_size * block:,} ids in blocks of {block}")
    print(f"GPT                     nll {res['lm']:.4f}  perplexity {gpt_ppl:9.2f}")
    for name, b in bigrams.items():
        print(f"bigram {name:<16} nll {b.nll:.4f}  perplexity {b.perplexity:9.2f}")
    unigram = np.bincount(train_stream, minlength=V) + 0.01
    print(f"unigram (add-0.01)      perplexity {math.exp(-np.log(unigram[heldout_stream] / unigram.sum()).mean()):9.2f}")
    print(f"ratio GPT / best bigram ({best.smoothing}): {gpt_ppl / best.perplexity:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
