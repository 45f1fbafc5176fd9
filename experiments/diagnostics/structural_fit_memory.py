"""Issue 42 measurements behind docs/evidence/structural-fit.md: the structural-distance probe's
memory on a real model's features, the fit of one version of `probes/syntax/structural.py` against
another, and the per-layer UUAS curve beside the right-branching chain.

  python experiments/diagnostics/structural_fit_memory.py prepare TRAIN_CACHE EVAL_CACHE OUT_DIR TRAIN_SENTENCES [TREES]
      TRAIN_CACHE / EVAL_CACHE: the activation-cache folders `bertology probe syntax
      --max-train-sentences TRAIN_SENTENCES --max-eval-sentences 500` wrote (any --cache-dtype;
      TRAIN_SENTENCES 0 = the whole split). Chooses the training trees as the syntax task does
      (`plan_splits` with the default settings, seed 0, then TREES of the fit sentences, default
      2,000) and writes their features and the stop set's as float32
      arrays OUT_DIR/train.npy, OUT_DIR/stop.npy ([L, words, H], read back as memmaps, as the
      benchmark's cache is) with the trees in OUT_DIR/trees.npz.
  python experiments/diagnostics/structural_fit_memory.py fit OUT_DIR TAG STRUCTURAL_PY [EPOCHS]
      fits the standardised distance probe with the `structural.py` at STRUCTURAL_PY (e.g. the
      code before the streamed fit, from `git show e4e9cc9~1:probes/syntax/structural.py > /tmp/old.py`), sampling
      VmRSS / RssAnon / RssFile from /proc/self/status every 10 ms, then scores the 500 eval
      sentences; writes OUT_DIR/fit-TAG.json (memory, seconds, UUAS per layer, chain baseline,
      the fitted projection's checksum).

Run each `fit` in its own process (the peak is per process). Example (the numbers in the evidence
page): prepare /tmp/struct/runs/cache/activations/en_ewt-train-...-bfloat16-... \\
    /tmp/struct/runs/cache/activations/en_ewt-dev-...-bfloat16-... /tmp/struct/mem 2224 2000
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

from workbench.io import atomic_path, atomic_write_json, atomic_write_text


def _status() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile of this process in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


class PeakSampler(threading.Thread):
    """Samples `_status()` until stopped; keeps the maximum of each field."""

    def __init__(self, interval: float = 0.01):
        super().__init__(daemon=True)
        self.interval, self.peak, self.samples = interval, _status(), 0
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            for k, v in _status().items():
                self.peak[k] = max(self.peak[k], v)
            self.samples += 1
            time.sleep(self.interval)

    def stop(self) -> dict[str, int]:
        self._halt.set()
        self.join()
        return dict(self.peak)


def prepare(train_cache: Path, eval_cache: Path, out: Path, train_sentences: int, trees: int = 2000) -> None:
    from probes.syntax.prepare import plan_splits
    from probes.syntax.settings import SyntaxSettings
    from workbench.activations import Activations

    d = SyntaxSettings()
    plan = plan_splits("en_ewt", "train", "dev", max_train_sentences=train_sentences or None,
                       max_eval_sentences=500,
                       early_stopping_fraction=d.early_stopping_fraction, holdout_fraction=d.holdout_fraction, seed=0)
    train, ev = Activations.load(train_cache), Activations.load(eval_cache)
    for acts, sents in ((train, plan.train), (ev, plan.eval)):
        if acts.num_sentences != len(sents) or not np.array_equal(np.diff(acts.sentence_offsets),
                                                                  [len(s.words) for s in sents]):
            raise SystemExit(f"{acts.path} does not hold the plan's sentences")
    fit_ids = plan.fit
    if trees and len(fit_ids) > trees:  # as probes.syntax.tasks.fit_structural_task chooses them
        fit_ids = np.sort(np.random.default_rng([0, 3]).choice(fit_ids, trees, replace=False))
    out.mkdir(parents=True, exist_ok=True)
    saved = {}
    for name, ids in (("train", fit_ids), ("stop", plan.stop)):
        rows = train.word_index(ids)
        arr = np.lib.format.open_memmap(out / f"{name}.npy", mode="w+", dtype=np.float32,
                                        shape=(train.num_layers, len(rows), train.hidden_size))
        for layer in range(train.num_layers):  # one layer at a time: no full float32 copy in memory
            arr[layer] = np.asarray(train.layers[layer, rows], dtype=np.float32)
        arr.flush()
        del arr
        lengths = np.array([len(plan.train[i].words) for i in ids])
        saved[f"{name}_offsets"] = np.concatenate([[0], np.cumsum(lengths)])
        saved[f"{name}_heads"] = np.concatenate([plan.train[i].heads for i in ids])
        saved[f"{name}_upos"] = np.array([u for i in ids for u in plan.train[i].upos])
    ev_lengths = np.array([len(s.words) for s in plan.eval])
    saved.update(eval_offsets=np.concatenate([[0], np.cumsum(ev_lengths)]),
                 eval_heads=np.concatenate([s.heads for s in plan.eval]),
                 eval_upos=np.array([u for s in plan.eval for u in s.upos]))
    with atomic_path(out / "trees.npz") as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **saved)
    atomic_write_text(out / "eval_cache.txt", str(eval_cache))
    print(f"{len(fit_ids)} training trees ({saved['train_offsets'][-1]} words), {len(plan.stop)} stop trees, "
          f"{len(plan.eval)} eval trees -> {out}")


def _module(path: Path):
    spec = importlib.util.spec_from_file_location("structural_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _treeset(st, features, trees, name):
    offsets = trees[f"{name}_offsets"]
    heads = [trees[f"{name}_heads"][a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    upos = [list(trees[f"{name}_upos"][a:b]) for a, b in zip(offsets[:-1], offsets[1:])]
    return st.TreeSet(features, offsets, heads, upos)


def fit(out: Path, tag: str, structural_py: Path, epochs: int = 30, threads: int = 2) -> None:
    import torch

    from workbench.activations import Activations

    torch.set_num_threads(threads)
    st = _module(structural_py)
    trees = np.load(out / "trees.npz")
    x_train, x_stop = (np.load(out / f"{n}.npy", mmap_mode="r") for n in ("train", "stop"))
    train, stop = _treeset(st, x_train, trees, "train"), _treeset(st, x_stop, trees, "stop")
    ev = _treeset(st, Activations.load((out / "eval_cache.txt").read_text()).layers, trees, "eval")
    _ = train.gold_distances, stop.gold_distances  # the gold trees are not the fit's memory
    before = _status()
    sampler = PeakSampler()
    sampler.start()
    t0 = time.perf_counter()
    fitted = st.fit_structural_probe(train, stop, "distance", epochs=epochs, seed=0, progress=False, standardize=True)
    fit_s = time.perf_counter() - t0
    peak = sampler.stop()
    scores = st.score_distance(st.predict(fitted, ev), ev)
    feature_bytes = x_train.nbytes + x_stop.nbytes
    record = {
        "tag": tag, "structural_py": str(structural_py), "epochs_asked": epochs, "epochs": fitted.epochs,
        "threads": threads, "train_trees": len(train), "train_words": int(x_train.shape[1]),
        "stop_trees": len(stop), "eval_trees": len(ev), "feature_bytes": int(feature_bytes), "fit_s": round(fit_s, 1),
        "before": before, "peak": peak, "samples": sampler.samples,
        "rss_increase_over_features": (peak["VmRSS"] - before["VmRSS"]) / feature_bytes,
        "anon_increase_over_features": (peak["RssAnon"] - before["RssAnon"]) / feature_bytes,
        "uuas": [s["uuas"] for s in scores], "dspr": [s["dspr"] for s in scores],
        "right_branching_uuas": st.right_branching_uuas(ev),
        "dev_loss": fitted.dev_loss.tolist(),
        "proj_sum": float(fitted.proj.double().abs().sum()),
    }
    atomic_write_json(out / f"fit-{tag}.json", record)
    best = int(np.argmax(record["uuas"]))
    print(json.dumps({k: record[k] for k in ("tag", "epochs", "fit_s", "before", "peak", "rss_increase_over_features",
                                              "anon_increase_over_features", "right_branching_uuas")}))
    print(f"best layer {best}: UUAS {record['uuas'][best]:.4f}")


if __name__ == "__main__":
    cmd, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if cmd == "prepare" and len(args) >= 4:
        prepare(Path(args[0]), Path(args[1]), Path(args[2]), int(args[3]), int(args[4]) if len(args) > 4 else 2000)
    elif cmd == "fit" and len(args) >= 3:
        fit(Path(args[0]), args[1], Path(args[2]), int(args[3]) if len(args) > 3 else 30)
    else:
        raise SystemExit(__doc__)
