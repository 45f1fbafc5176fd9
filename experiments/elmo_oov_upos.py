"""ELMo on words outside its vocabulary: EWT dev OOV rate and UPOS accuracy on OOV vs in-vocabulary words.

Evidence for open-vocabulary character input (Peters et al. 2018): one linear UPOS probe per layer
is fitted on all words of the first `--train` EWT train sentences (the last 10% of them stop the
fit early), then its accuracy on EWT dev is reported separately for out-of-vocabulary words (a word
whose word-level tokens include [UNK]) and in-vocabulary words, with a bootstrap CI over sentences.
It uses only the model handle and the probe fitter, so it runs on older code too (pass that code's
folder on PYTHONPATH to evaluate a checkpoint trained before the change with the handle of then).

    python experiments/elmo_oov_upos.py CHECKPOINT [--train 3000] [--threads 1]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from probes.core.fitting import fit_probe
from probes.core.statistics import ratio_bootstrap
from workbench.data.conllu import load_treebank
from workbench.running.models import ModelHandle


def states(handle: ModelHandle, sentences) -> np.ndarray:
    """[L+1, n_words, H] for all words of all sentences, in order."""
    return np.concatenate(list(handle.word_states([s.words for s in sentences], batch_size=32)), axis=1)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--train", type=int, default=3000, help="EWT train sentences the probe is fitted on")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    handle = ModelHandle.load(args.checkpoint)
    tok = handle.tokenizer
    unk = tok.unk_token_id
    train = load_treebank("en_ewt", "train")[: args.train]
    dev = load_treebank("en_ewt", "dev")

    dev_words = [w for s in dev for w in s.words]
    types = sorted(set(dev_words))
    oov_type = {w: unk in tok(w, add_special_tokens=False).input_ids for w in types}
    oov = np.array([oov_type[w] for w in dev_words])

    tags = sorted({t for s in train + dev for t in s.upos})
    index = {t: i for i, t in enumerate(tags)}
    y_train = np.array([index[t] for s in train for t in s.upos])
    y_dev = np.array([index[t] for s in dev for t in s.upos])
    x_train, x_dev = states(handle, train), states(handle, dev)
    n_fit = int(0.9 * len(train))
    cut = sum(len(s.words) for s in train[:n_fit])
    probe = fit_probe(x_train[:, :cut], y_train[:cut], x_train[:, cut:], y_train[cut:], num_classes=len(tags),
                      seed=args.seed)
    correct = probe.correct(x_dev, y_dev)  # [L, N_dev] bool
    sid = np.repeat(np.arange(len(dev)), [len(s.words) for s in dev])
    result = {
        "checkpoint": str(args.checkpoint),
        "vocab_size": len(tok),
        "reads_characters": bool(getattr(handle, "reads_characters", False)),
        "dev_words": len(oov),
        "dev_oov_words": int(oov.sum()),
        "dev_oov_rate_tokens": float(oov.mean()),
        "dev_oov_rate_types": float(np.mean(list(oov_type.values()))),
        "layers": {},
    }
    for i, layer in enumerate(probe.layers.tolist()):
        row = {}
        for name, sel in (("all", np.ones_like(oov)), ("oov", oov), ("in_vocab", ~oov)):
            p, lo, hi = ratio_bootstrap(correct[i][sel], None, sid[sel], seed=args.seed)  # over sentences
            row[name] = [round(float(p), 4), round(float(lo), 4), round(float(hi), 4)]
        result["layers"][layer] = row
    print(json.dumps({k: v for k, v in result.items() if k != "layers"}))
    for layer, row in result["layers"].items():
        print(f"layer {layer}: " + "  ".join(f"{k} {v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" for k, v in row.items()))
    return result


if __name__ == "__main__":
    main()
