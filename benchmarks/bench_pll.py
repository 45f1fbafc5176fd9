"""Pseudo-log-likelihood speed: batched masked copies against one masked forward per token.

PLL (Salazar et al. 2020) needs one masked copy of a sentence per token. Compared on the same
sentences, same model, same threads:
- batched: `workbench.running.lm_scores.LMScorer.pseudo_log_likelihood` (every masked copy of a sentence
  in ONE batch, several sentences per batch up to `--batch-size` copies, sentences sorted by
  length, the MLM head applied at the masked position of each copy only);
- per token: for each sentence and each content token, one forward of the sentence with that token
  masked, full logits, log-softmax read at the masked position (what a first script does);
- batched, full logits: the batched scorer with the head-at-the-mask shortcut switched off (the
  MLM head over every position of every copy), to tell the two savings apart.
The two must agree (max |difference| of the per-token log-probs is printed and recorded).

Model: a seeded random BERT masked LM (`--layers` x `--hidden`, default 4 x 256; random weights
cost the same as trained ones) with a WordPiece vocabulary (`--vocab`, default 8,000) trained on EWT
train text; sentences: a seeded sample of EWT dev (`--sentences`, default 150; running text). Each
method runs `--repeats` times interleaved; the best wall time and its process CPU time are kept
(on a shared machine wall time also measures the neighbours: compare the CPU times too).

Tokens/s count scored tokens (one masked copy each). Writes
benchmarks/results/bench_pll-<host>-<time>.json (machine, threads, versions, figures) and
prints the ratio. Usage:
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_pll.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
RESULTS = Path(__file__).resolve().parent / "results"


def build(layers: int, hidden: int, vocab: int, seed: int):
    """(ModelHandle of a seeded random BertForMaskedLM, EWT train texts used for the tokenizer)."""
    from transformers import BertConfig, BertForMaskedLM

    from workbench.data.conllu import load_treebank
    from workbench.running.models import ModelHandle
    from workbench.tokenization import build_tokenizer

    tok = build_tokenizer("wordpiece", SPECIALS, [s.text for s in load_treebank("en_ewt", "train")], vocab_size=vocab)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                     max_position_embeddings=512, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    return ModelHandle(BertForMaskedLM(cfg).eval(), tok)


def per_token(handle, texts) -> list[np.ndarray]:
    """One forward per masked token, full logits: the baseline."""
    tok, model = handle.tokenizer, handle.model
    out = []
    with torch.inference_mode():
        for text in texts:
            enc = tok(text, return_special_tokens_mask=True)  # [CLS]/[SEP] only ([UNK] is content)
            ids = torch.tensor(enc["input_ids"])
            special = enc["special_tokens_mask"]
            lps = []
            for p in (t for t, m in enumerate(special) if not m):
                x = ids.clone()
                x[p] = tok.mask_token_id
                logits = model(input_ids=x[None]).logits[0, p]
                lps.append(float(torch.log_softmax(logits.float(), -1)[ids[p]]))
            out.append(np.array(lps))
    return out


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=128, help="masked copies per forward (batched PLL)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="output file (default: benchmarks/results/bench_pll-<host>-<time>.json)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from workbench.data.conllu import load_treebank
    from workbench.running.lm_scores import LMScorer
    from workbench.store.manifest import environment, git_state, package_versions

    handle = build(args.layers, args.hidden, args.vocab, args.seed)
    dev = [s.text for s in load_treebank("en_ewt", "dev")]
    rng = np.random.default_rng(args.seed)
    texts = [dev[i] for i in sorted(rng.choice(len(dev), size=min(args.sentences, len(dev)), replace=False))]
    n_tok = [len(handle.tokenizer(t)["input_ids"]) - 2 for t in texts]
    scorer = LMScorer(handle)
    print(f"{len(texts)} EWT dev sentences, {sum(n_tok)} content tokens (mean {np.mean(n_tok):.1f}, max {max(n_tok)}); "
          f"BERT {args.layers}x{args.hidden}, vocab {len(handle.tokenizer)}; threads {torch.get_num_threads()}")

    import workbench.running.lm_scores as lm

    def full_logits():
        heads, lm.MLM_HEADS = lm.MLM_HEADS, {}
        try:
            return scorer.pseudo_log_likelihood(texts, batch_size=args.batch_size)
        finally:
            lm.MLM_HEADS = heads

    batched_runs, naive_runs, full_runs = [], [], []
    for r in range(args.repeats):
        res_b, wb, cb = timed(lambda: scorer.pseudo_log_likelihood(texts, batch_size=args.batch_size))
        res_n, wn, cn = timed(lambda: per_token(handle, texts))
        res_f, wf, cf = timed(full_logits)
        batched_runs.append((wb, cb))
        naive_runs.append((wn, cn))
        full_runs.append((wf, cf))
        print(f"repeat {r}: batched {wb:.2f} s wall ({cb:.2f} s CPU), per token {wn:.2f} s wall ({cn:.2f} s CPU), "
              f"batched with full logits {wf:.2f} s wall ({cf:.2f} s CPU)")
    diff = max(float(np.abs(a.logprobs - b).max()) for a, b in zip(res_b, res_n) if len(b))
    diff = max([diff] + [float(np.abs(a.logprobs - b.logprobs).max()) for a, b in zip(res_b, res_f) if len(b.ids)])
    wb, cb = min(batched_runs)
    wn, cn = min(naive_runs)
    wf, cf = min(full_runs)
    total = sum(n_tok)
    report = {
        "benchmark": "bench_pll",
        "what": "pseudo-log-likelihood: batched masked copies (workbench.running.lm_scores) vs one masked forward per token",
        "sentences": len(texts), "content_tokens": total, "mean_tokens": float(np.mean(n_tok)), "max_tokens": max(n_tok),
        "model": {"family": "bert", "layers": args.layers, "hidden": args.hidden, "vocab": len(handle.tokenizer),
                  "weights": f"random, seed {args.seed}"},
        "batch_size": args.batch_size, "threads": torch.get_num_threads(), "repeats": args.repeats,
        "batched": {"wall_s": wb, "cpu_s": cb, "tokens_per_s": total / wb, "all_runs": batched_runs},
        "per_token": {"wall_s": wn, "cpu_s": cn, "tokens_per_s": total / wn, "all_runs": naive_runs},
        "batched_full_logits": {"wall_s": wf, "cpu_s": cf, "tokens_per_s": total / wf, "all_runs": full_runs},
        "ratio_wall": wn / wb, "ratio_cpu": cn / cb,
        "ratio_cpu_batching_only": cn / cf, "ratio_cpu_head_shortcut": cf / cb,
        "max_abs_logprob_difference": diff,
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "loadavg_at_end": os.getloadavg()},
        "environment": environment(), "packages": package_versions(), "git": git_state(),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    print(f"scored tokens/s: batched PLL {total / wb:,.0f}, per token {total / wn:,.0f}; "
          f"ratio {wn / wb:.1f}x wall, {cn / cb:.1f}x CPU (batching alone {cn / cf:.1f}x, head at the mask only "
          f"{cf / cb:.1f}x, CPU); max |difference| {diff:.2e}")
    out = args.json or RESULTS / f"bench_pll-{platform.node()}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    from workbench.io import atomic_write_json

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, report)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
