"""Is the diachronic task's split-half noise floor calibrated? A model-free check (issue 40, item 5).

The floor (`probes.align.tasks.split_half_mask`) splits the old corpus in two halves and measures how
far a word's two averaged vectors lie apart when nothing changed. `moved_fraction` is the share of
words whose old-vs-new displacement exceeds that floor: on two corpora where nothing moved it should
sit at chance (about one half). This script measures that share on a null (the speeches of both sides
pooled and re-divided at random by speech, so that nothing separates the two sides) and on the real
split, with halves of documents and the per-word-count rescaling (today's rule), halves of sentences
rescaled as if even (the rule before), and halves of sentences with per-word counts, through the
task's own pieces (`split_half_mask`, `word_displacement`, `reps.type_vectors`) on model-free vectors:
random indexing (Kanerva et al. 2000; Sahlgren 2005), each occurrence the sum of fixed random vectors
of the words within `--window` positions of it, plus w (each of `--self-weights`) times the word's
own random vector (a residual stream's token
embedding: 0 gives context alone, where a rare word's average is mostly noise and 1 - cos is far from
its small-noise regime; larger weights give displacements of MiniLM's size). No model is trained or
loaded, so any departure from chance is the floor's.

    BERTOLOGY_DATA=... python experiments/align/noise_floor_check.py \
        --old split:state_union:party=Republican --new split:state_union:party=Democratic --self-weights 0,4,8 --nulls 3
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib

import numpy as np


def random_index_vectors(sentences, dim: int, window: int, self_weight: float = 0.0) -> np.ndarray:
    """[1, N, dim]: per word position, the sum of the fixed random vectors (seeded by the lowercased
    word) of the words within `window` positions in its sentence, itself excluded, plus `self_weight`
    times its own."""
    cache: dict[str, np.ndarray] = {}

    def vec(w: str) -> np.ndarray:
        w = w.lower()
        if w not in cache:
            cache[w] = np.random.default_rng(zlib.crc32(w.encode())).standard_normal(dim).astype(np.float32)
        return cache[w]

    out = []
    for s in sentences:
        vs = np.stack([vec(w) for w in s]) if s else np.zeros((0, dim), np.float32)
        for i in range(len(s)):
            lo, hi = max(0, i - window), min(len(s), i + window + 1)
            out.append(vs[lo:hi].sum(axis=0) + (self_weight - 1) * vs[i])
    return np.stack(out)[None]


RULES = ("documents, per-word counts (now)", "sentences, even halves (before)", "sentences, per-word counts")


def sentence_halves(corpus, seed: int) -> np.ndarray:
    """The rule before issue 40: each sentence drew its half (`np.random.default_rng(seed).random < 0.5`)."""
    half = np.random.default_rng(seed).random(len(corpus.sentences)) < 0.5
    return np.repeat(half, [len(s) for s in corpus.sentences])


def measure(old, new, args, self_weight: float) -> dict:
    """Per rule: mean displacement, mean floor and the share of words above their floor (the task's
    `moved_fraction`), over the words present in both halves, as `diachronic_task` computes them (the
    vocabulary, the anchors, `word_displacement`, `reps.type_vectors`; the document rule is the task's own
    `split_half_mask` and its floor formula)."""
    from probes.align import reps
    from probes.align.tasks import word_displacement, split_half_mask

    vo, co = reps.build_vocabulary(old.sentences, 10**9, args.min_count, True)
    vn, cn = reps.build_vocabulary(new.sentences, 10**9, args.min_count, True)
    fo, fn = dict(zip(vo, co)), dict(zip(vn, cn))
    vocab = [w for w in sorted(set(fo) & set(fn), key=lambda w: (-min(fo[w], fn[w]), w)) if w.isalpha()]
    vocab = vocab[: args.vocab_size]
    n_old = np.array([fo[w] for w in vocab], dtype=np.float64)
    n_new = np.array([fn[w] for w in vocab], dtype=np.float64)
    anchor = np.arange(min(args.anchors, len(vocab)))
    lo = random_index_vectors(old.sentences, args.dim, args.window, self_weight)
    ln = random_index_vectors(new.sentences, args.dim, args.window, self_weight)
    disp = word_displacement(reps.type_vectors(lo, old.sentences, vocab)[0], reps.type_vectors(ln, new.sentences, vocab)[0],
                         anchor, True)
    pos = reps.word_index(old.sentences, vocab)
    out = {"words": len(vocab)}
    for rule in RULES:
        mask = split_half_mask(old, args.seed)[0] if rule.startswith("documents") else sentence_halves(old, args.seed)
        split = word_displacement(reps.type_vectors(lo, old.sentences, vocab, mask=mask)[0],
                              reps.type_vectors(lo, old.sentences, vocab, mask=~mask)[0], anchor, True)
        n1 = np.bincount(pos[(pos >= 0) & mask], minlength=len(vocab)).astype(np.float64)
        n2 = np.bincount(pos[(pos >= 0) & ~mask], minlength=len(vocab)).astype(np.float64)
        both = (n1 > 0) & (n2 > 0)
        if "even" in rule:
            floor = split * (1 + n_old / n_new) / 4
        else:
            floor = split * (1 / n_old + 1 / n_new) / (1 / np.maximum(n1, 1) + 1 / np.maximum(n2, 1))
        out[rule] = {"displacement": float(disp[both].mean()), "noise_floor": float(floor[both].mean()),
                     "moved_fraction": float((disp[both] > floor[both]).mean()), "words_in_both": int(both.sum())}
    return out


def null_split(old, new, seed: int):
    """The pooled documents of both sides re-divided at random, each side as many documents as before."""
    from probes.align import reps

    sents = old.sentences + new.sentences
    docs = [("old", d) for d in old.docs] + [("new", d) for d in new.docs]
    names = list(dict.fromkeys(docs))
    n_old = len(set(old.docs))
    side_a = {names[i] for i in np.random.default_rng([seed, 0x5E]).permutation(len(names))[:n_old]}
    pick = [i for i, d in enumerate(docs) if d in side_a], [i for i, d in enumerate(docs) if d not in side_a]
    return [reps.Corpus(f"null-{k}", [sents[i] for i in idx], [], docs=[f"{docs[i][0]}/{docs[i][1]}" for i in idx])
            for k, idx in zip("ab", pick)]


def main(argv=None) -> int:
    from probes.align import reps

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", default="split:state_union:party=Republican")
    p.add_argument("--new", default="split:state_union:party=Democratic")
    p.add_argument("--max-sentences", type=int, default=2500)
    p.add_argument("--max-words", type=int, default=48)
    p.add_argument("--min-count", type=int, default=10)
    p.add_argument("--vocab-size", type=int, default=1500)
    p.add_argument("--anchors", type=int, default=500)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--window", type=int, default=2)
    p.add_argument("--self-weights", default="0,4", help="comma-separated weights of the word's own vector")
    p.add_argument("--nulls", type=int, default=5, help="random re-divisions of the pooled speeches")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.nulls < 1 or args.dim < 1 or args.window < 1:
        p.error("--nulls, --dim and --window must be >= 1")
    try:
        weights = [float(w) for w in args.self_weights.split(",")]
    except ValueError:
        p.error(f"--self-weights: expected comma-separated numbers, got {args.self_weights!r}")
    old, new = (reps.sample_corpus(reps.load_corpus(s), args.max_sentences, args.seed, args.max_words)
                for s in (args.old, args.new))
    if old.docs is None or new.docs is None:
        p.error("both corpora must record their documents (raw:, split:, ud: or columns: with -DOCSTART-)")
    out = {"old": args.old, "new": args.new, "documents": [len(set(old.docs)), len(set(new.docs))],
           "paragraphs": [len(old.sentences), len(new.sentences)], "real": {}, "null": {}}
    for w in weights:
        out["real"][w] = measure(old, new, args, w)
        out["null"][w] = [measure(*null_split(old, new, s), args, w) for s in range(args.nulls)]
        for rule in RULES:
            moved = [v[rule]["moved_fraction"] for v in out["null"][w]]
            ratio = [v[rule]["noise_floor"] / v[rule]["displacement"] for v in out["null"][w]]
            r = out["real"][w][rule]
            print(f"w={w:g} {rule}: null moved {np.mean(moved):.3f} ({min(moved):.3f}-{max(moved):.3f}, "
                  f"{args.nulls} nulls), floor/displacement {np.mean(ratio):.2f}, null displacement "
                  f"{np.mean([v[rule]['displacement'] for v in out['null'][w]]):.4f}; real split: moved "
                  f"{r['moved_fraction']:.3f}, floor/displacement {r['noise_floor'] / r['displacement']:.2f}",
                  file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
