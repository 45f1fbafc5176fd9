"""Issue 42 measurements behind docs/evidence/real-probe-fit.md: the UPOS probe's fit options and
the half-precision cache on a real model's features.

  python experiments/diagnostics/real_probe_fit.py features MODEL TAG OUT_DIR
      extracts the benchmark's split (benchmarks/bench_real_probe.py: 1,000 EWT train sentences, 10%
      of them the stop set, 500 dev sentences, seed 0) and saves the UPOS fit / stop / eval feature
      arrays ([L, words, H] float32) and labels as OUT_DIR/TAG-*.npy|npz
  python experiments/diagnostics/real_probe_fit.py fits TAG OUT_DIR FIT[,FIT...]
      FIT = default | converged | adam-EPOCHS-LR-BATCH; prints seconds and accuracy, saves the
      per-layer eval accuracy as OUT_DIR/TAG-acc-FIT.npy
  python experiments/diagnostics/real_probe_fit.py half TAG OUT_DIR
      the same Adam fit (6 epochs, lr 0.01) on the features as stored in fp32, bf16 and fp16

Example: HF_HUB_OFFLINE=1 python experiments/diagnostics/real_probe_fit.py features \\
             HuggingFaceTB/SmolLM2-135M-Instruct smol /tmp/rpf
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

ADAM = dict(optimizer="adam", epochs=6, lr=0.01, batch_size=256, min_steps=1)


def features(model: str, tag: str, out: Path) -> None:
    from probes.syntax.features import FeatureView
    from probes.syntax.items import build_items
    from probes.syntax.prepare import plan_splits
    from probes.syntax.settings import SyntaxSettings
    from probes.syntax.tasks import encode_labels
    from workbench.activations import extract
    from workbench.running.models import ModelHandle

    out.mkdir(parents=True, exist_ok=True)
    d = SyntaxSettings()
    plan = plan_splits("en_ewt", "train", "dev", max_train_sentences=1000, max_eval_sentences=500,
                       early_stopping_fraction=d.early_stopping_fraction, holdout_fraction=d.holdout_fraction, seed=0)
    handle = ModelHandle.load(model)
    cache = out / f"cache-{tag}"
    train = extract(handle, [s.words for s in plan.train], "upos-train", batch_size=32, cache_dir=cache)
    ev = extract(handle, [s.words for s in plan.eval], "upos-eval", batch_size=32, cache_dir=cache)
    items = {"fit": build_items("upos", plan.train, train.sentence_offsets, plan.fit, 0, d.deprel_subtypes),
             "stop": build_items("upos", plan.train, train.sentence_offsets, plan.stop, 0, d.deprel_subtypes),
             "ev": build_items("upos", plan.eval, ev.sentence_offsets, None, 0, d.deprel_subtypes)}
    vocab = {label: i for i, label in enumerate(sorted(set(items["fit"].labels)))}
    for name, acts in (("fit", train), ("stop", train), ("ev", ev)):
        np.save(out / f"{tag}-x{name}.npy", np.asarray(FeatureView(acts.layers, items[name].cols)[:]))
    np.savez(out / f"{tag}-y.npz", c=len(vocab), **{k: encode_labels(v.labels, vocab) for k, v in items.items()})


def _load(tag: str, out: Path):
    y = np.load(out / f"{tag}-y.npz")
    return [np.load(out / f"{tag}-x{k}.npy") for k in ("fit", "stop", "ev")], y, int(y["c"])


def _fit_and_score(x, y, c, **config):
    from probes.core import fitting

    t = time.perf_counter()
    res = fitting.fit_probe(torch.from_numpy(x[0]), y["fit"], torch.from_numpy(x[1]), y["stop"], num_classes=c + 1,
                            **config)
    seconds = time.perf_counter() - t
    return (res.correct(x[2], y["ev"]) & (y["ev"] < c)[None]).mean(1), seconds, res.steps


def fits(tag: str, out: Path, names: list[str]) -> None:
    x, y, c = _load(tag, out)
    for name in names:
        if name == "default":
            config = {}
        elif name == "converged":
            config = dict(early_stopping=False, max_iter=1000)
        elif name.startswith("adam-"):
            _, epochs, lr, batch = name.split("-")
            config = dict(optimizer="adam", epochs=int(epochs), lr=float(lr), batch_size=int(batch), min_steps=1)
        else:
            sys.exit(f"real_probe_fit: unknown fit {name!r} (default | converged | adam-EPOCHS-LR-BATCH)")
        acc, seconds, steps = _fit_and_score(x, y, c, **config)
        print(f"{name}: {seconds:.1f}s steps={steps} mean={acc.mean():.4f} min={acc.min():.4f}", flush=True)
        np.save(out / f"{tag}-acc-{name}.npy", acc)


def half(tag: str, out: Path) -> None:
    from workbench.activations import FLOAT16_MAX, bfloat16_to_float32, float32_to_bfloat16

    x, y, c = _load(tag, out)
    print(f"{tag}: largest |activation| {float(np.abs(x[0]).max()):.1f}")
    stored = {"fp32": lambda a: a, "bf16": lambda a: bfloat16_to_float32(float32_to_bfloat16(a)),
              "fp16": lambda a: a.astype(np.float16).astype(np.float32)}
    acc = {}
    for name, conv in stored.items():
        if name == "fp16" and max(float(np.abs(a).max()) for a in x) > FLOAT16_MAX:
            print("fp16: the features overflow float16 (the cache refuses them)")
            continue
        acc[name], seconds, _ = _fit_and_score([conv(a) for a in x], y, c, **ADAM)
        print(f"{name}: {seconds:.1f}s mean {acc[name].mean():.4f}", flush=True)
    for name in acc:
        if name != "fp32":
            diff = (acc[name] - acc["fp32"]) * 100
            print(f"{name} - fp32 per layer (points): {np.round(diff, 2).tolist()}; largest |change| {np.abs(diff).max():.2f}")


def main(argv: list[str]) -> None:
    torch.set_num_threads(2)
    if len(argv) >= 4 and argv[0] == "features":
        features(argv[1], argv[2], Path(argv[3]).resolve())
    elif len(argv) == 4 and argv[0] == "fits":
        fits(argv[1], Path(argv[2]), argv[3].split(","))
    elif len(argv) == 3 and argv[0] == "half":
        half(argv[1], Path(argv[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
