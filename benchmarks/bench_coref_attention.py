"""Attention extraction for coreference heads vs plain hidden-state extraction, same GUM documents.

Both read every document as one long word sequence in windows of the model's length (half a window
apart; `probes.coref.attention.document_windows` = `ModelHandle.word_states`' plan):
- hidden: `ModelHandle.word_states` (all layers, first-piece pooling; sdpa attention when the model
  was loaded that way, so no attention matrices are materialised);
- attention: `probes.coref.attention.attention_rows` with every coreferent mention's head word as query
  (what the attention-heads task runs): eager attention for all heads of all layers, one forward per
  window, word-level rows of the query words (Clark et al. 2019's subword -> word conversion).
Figures: words per second (document words / wall seconds) and CPU seconds, best of `--repeats`,
interleaved; the ratio hidden / attention is what to read on a shared machine.

Usage: HF_HUB_OFFLINE=1 python benchmarks/bench_coref_attention.py [--checkpoint NAME_OR_FOLDER]
       [--documents 4] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv=None) -> int:
    from probes.coref.attention import attention_rows
    from probes.coref.items import anaphoric_mentions, gum_documents
    from workbench.store.checkpoints import expand_checkpoints
    from workbench.data.conllu import load_treebank, read_gum_coref
    from workbench.running.models import ModelHandle

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--documents", type=int, default=4, help="first N GUM dev documents (0 = all)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=4)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    (ck,) = expand_checkpoints([args.checkpoint])
    hidden_handle = ModelHandle.load(ck.path)
    attn_handle = ModelHandle.load(ck.path, attentions=True)
    sents = load_treebank("en_gum", "dev")
    mentions, _ = read_gum_coref(sents)
    docs = gum_documents(sents, mentions)
    docs = docs[: args.documents] if args.documents else docs
    words = [d.words for d in docs]
    queries = [[d.mentions[i].head for i in anaphoric_mentions(d)] for d in docs]
    n_words = sum(len(w) for w in words)

    def hidden():
        for _ in hidden_handle.word_states(words, batch_size=args.batch_size):
            pass

    def attention():
        for _ in attention_rows(attn_handle, words, queries, batch_size=args.batch_size):
            pass

    best = {}
    for _ in range(args.repeats):
        for name, fn in (("hidden", hidden), ("attention", attention)):
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            if name not in best or wall < best[name]["wall_s"]:
                best[name] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "words_per_s": round(n_words / wall, 1)}
    out = {"checkpoint": ck.name, "documents": len(docs), "words": n_words,
           "queries": sum(len(q) for q in queries), "threads": args.threads, **best,
           "attention_vs_hidden_wall": round(best["attention"]["wall_s"] / best["hidden"]["wall_s"], 2),
           "attention_vs_hidden_cpu": round(best["attention"]["cpu_s"] / best["hidden"]["cpu_s"], 2)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
