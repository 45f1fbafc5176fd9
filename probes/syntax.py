"""Syntax probes over every layer of a list of checkpoints: POS tags, dependency labels and arcs, trees.

`run_syntax_probes(checkpoints, tasks, treebank="en_ewt")` loads a UD treebank, extracts word
vectors of every layer once per checkpoint (`workbench.activations`, cached), fits probes for all
layers at once with the shared engine (`probes.engine`) and the structural probes
(`probes.structural`), and writes one run of tidy rows to the results store.

Tasks
- `upos`, `xpos`: one label per word.
- `deprel`: edge probing (Tenney et al. 2019): the relation label of an arc from the head word's
  and the dependent word's vectors, [h_head; h_dep] (`pair_features="concat_product"` adds
  h_head * h_dep). Deliberate difference: Tenney et al. pool spans with learned attention and use an
  MLP; our spans are single words and the probe is the engine's linear (or MLP) probe. The root arc
  has no head word: root arcs are counted (`notes.pairs`) and left out.
- `arc`: "is (a, b) an arc?": positives are the gold (head, dependent) pairs (root arcs left out),
  negatives are ordered pairs of the same sentence that are not linked in either direction, sampled
  1:1 per sentence without replacement (seeded); a sentence with fewer unlinked pairs than arcs
  gives what it has and the shortfall is counted.
- `structural-distance`, `structural-depth`: Hewitt & Manning (2019) via `probes.structural`: UUAS,
  DSpr, root accuracy, NSpr, and the linear-chain (right-branching) UUAS baseline.

Baselines (`baselines=`)
- `control`: Hewitt & Liang (2019) control task through `engine.control_labels`: each word type gets
  a label drawn from the task's train label distribution; the type is the word form for upos/xpos,
  the DEPENDENT's form for deprel, and the ordered pair (head form, dependent form) for arc (a
  binary control: a probe can pass it only by memorising type pairs). Selectivity = accuracy -
  control accuracy, with a paired sentence-bootstrap CI.
- `majority`: the most frequent train label, scored on the eval items.
- `random_init`: the same probes on `engine.random_init_twin(handle)` (same class and config, fresh
  weights, same tokenizer).

Splits. Probes are fitted on `train_split` and scored on `eval_split`; early stopping uses a
held-out fraction of the TRAIN sentences (`early_stopping_fraction`, seeded), never the eval split.
A treebank without the requested splits is resolved: es_gsd (dev + test only) trains on dev and
evaluates on test; PUD (test only) and any `train_split == eval_split` are split by sentence
(seeded, `holdout_fraction` for eval). What was used is in the manifest (`notes.splits`).

Rows (`workbench.results.RESULT_COLUMNS`): probe="syntax", task in TASKS, split = the eval split
(scalar-mix rows: "<train_split>:stop", the stopping set they are scored on), stack, layer (0 =
embeddings), model = checkpoint name ("<name> (random init)" for the twin, extra.baseline =
"random_init"), family/seed/step from the checkpoint's manifest.json (None without one), n = eval
items (words, arcs, pairs, gold edges or sentences), ci_low/ci_high = 95% percentile bootstrap over
sentences. Metrics:
- classification tasks: accuracy, train_accuracy, control_accuracy, selectivity, majority (and with
  `probe="mlp"` the same names prefixed "mlp_"); MDL tasks (Voita & Titov 2020): mdl_codelength
  (bits), compression; scalar-mix tasks (Peters et al. 2018; Tenney et al. 2019): per layer
  scalar_mix_weight and cumulative_accuracy (mix of layers 0..l), and with layer=None
  centre_of_gravity, expected_layer, scalar_mix_accuracy;
- structural-distance: uuas, dspr, right_branching_uuas; structural-depth: root_acc, nspr.
Data-only baselines (majority, right_branching_uuas) are written for each real checkpoint, not for
twins. `extra` holds treebank, train split, pooling, probe seed, n_train and the classifier kind.

The run manifest holds the config, seeds, the treebank files with checksums, the checkpoints with
hashes (twins: `notes.random_init_twins`), the extraction counts per model and split
(`notes.extraction`: windowed sentences, windows, words cut by a window, empty sentences, words
mapped to no subword), pair counts (`notes.pairs`) and per-stage timings (`notes.timings_s`).

Resuming: each finished (model, stack, task) is saved under `<runs root>/partials/` as it
completes (`workbench.results.FinishedUnits`); rerunning the same command after a crash or Ctrl-C
reuses those units (listed in `notes.reused_units`) and extracts nothing new (activation cache), so
only the missing work is done. The saved units are removed when the run is published.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from probes import engine
from probes import structural as st
from workbench.checkpoints import Checkpoint, checkpoint_name, expand_checkpoints  # noqa: F401 (re-exported)
from workbench.errors import CheckpointError, ConfigError, WorkbenchError

TASKS = ("upos", "xpos", "deprel", "arc", "structural-distance", "structural-depth")
CLASSIFICATION_TASKS = ("upos", "xpos", "deprel", "arc")
STRUCTURAL_TASKS = ("structural-distance", "structural-depth")
BASELINES = ("majority", "control", "random_init")
PROBE_KINDS = ("linear", "mlp")
PAIR_FEATURES = ("concat", "concat_product")
PROBE = "syntax"
TWIN_SEED_OFFSET = 7919  # random-init twins use probe seed + this
RANDOM_INIT_SUFFIX = " (random init)"
EXTRACTION_COUNTS = ("sentences", "words", "windowed_sentences", "windows", "words_cut_by_window",
                     "empty_sentences", "no_subword_words")  # fmt: skip


# --------------------------------------------------------------------------- feature views
class FeatureView:
    """Rows of a `[L, N, H]` array (a memmap) gathered on demand, optionally as pairs.

    `cols` holds one or two int arrays of word positions into N; item p is the concatenation of
    `base[:, cols[k][p]]` over k (and, with `product`, the elementwise product of the two). Indexing
    follows numpy on the first two axes (`view[layers]`, `view[layer]`, `view[:, a:b]`), reading one
    layer at a time, so pair features of a whole treebank are never all in memory unless asked for,
    and the engine's one float32 copy per layer group is the only copy.
    """

    def __init__(self, base, cols: Sequence[np.ndarray], product: bool = False):
        if not 1 <= len(cols) <= 2 or (product and len(cols) != 2):
            raise ConfigError("FeatureView takes one index array, or two for pairs")
        self.base = base
        self.cols = [np.asarray(c, dtype=np.int64) for c in cols]
        self.product = product
        n_parts = len(self.cols) + int(product)
        self.shape = (int(base.shape[0]), len(self.cols[0]), int(base.shape[2]) * n_parts)
        self.ndim = 3
        self.dtype = np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        out = self[list(range(self.shape[0]))]
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        layer_key, row_key = key[0], (key[1] if len(key) > 1 else slice(None))
        if len(key) > 2:
            raise IndexError("FeatureView supports indexing on layers and rows only")
        squeeze = isinstance(layer_key, (int, np.integer))
        layers = np.arange(self.shape[0])[layer_key]
        layers = np.atleast_1d(layers)
        cols = [c[row_key] for c in self.cols]
        h = int(self.base.shape[2])
        out = np.empty((len(layers), len(cols[0]), self.shape[2]), dtype=np.float32)
        for i, layer in enumerate(layers):
            plane = self.base[int(layer)]
            parts = [np.asarray(plane[c], dtype=np.float32) for c in cols]
            for k, part in enumerate(parts):
                out[i, :, k * h : (k + 1) * h] = part
            if self.product:
                np.multiply(parts[0], parts[1], out=out[i, :, 2 * h : 3 * h])
        return out[0] if squeeze else out


def sentence_rows(offsets: np.ndarray, sentence_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(word positions, new offsets) of the given sentences, concatenated in the given order."""
    offsets = np.asarray(offsets, dtype=np.int64)
    idx = np.asarray(sentence_ids, dtype=np.int64)
    lengths = offsets[idx + 1] - offsets[idx]
    new = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new[1:])
    if len(idx) == 0:
        return np.zeros(0, dtype=np.int64), new
    rows = np.repeat(offsets[idx] - new[:-1], lengths) + np.arange(int(new[-1]), dtype=np.int64)
    return rows, new


# --------------------------------------------------------------------------- task items
@dataclass
class Items:
    """The examples of one classification task on one set of sentences.

    cols: word positions (one array per word; two for pairs) into the activations of the split;
    labels/types: gold label and control-task type key per item; sentence: index of the item's
    sentence within the set (for bootstrapping); counts: what was built or left out.
    """

    cols: list[np.ndarray]
    labels: list[str]
    types: list[str]
    sentence: np.ndarray
    counts: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)


def arcs(heads: Sequence[int]) -> list[tuple[int, int]]:
    """0-based (head, dependent) pairs of a sentence, the root arc left out."""
    return [(h - 1, d) for d, h in enumerate(heads) if h > 0]


def sample_non_arcs(heads: Sequence[int], k: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Up to `k` ordered pairs (a, b), a != b, linked by no arc in either direction, without replacement."""
    n = len(heads)
    linked = np.zeros((n, n), dtype=bool)
    for h, d in arcs(heads):
        linked[h, d] = linked[d, h] = True
    np.fill_diagonal(linked, True)
    candidates = np.flatnonzero(~linked.ravel())
    take = rng.choice(candidates, size=min(k, len(candidates)), replace=False) if k > 0 else candidates[:0]
    return [(int(c // n), int(c % n)) for c in np.sort(take)]


def build_items(task: str, sentences, offsets: np.ndarray, sentence_ids: Sequence[int] | None = None,
                seed: int = 0, deprel_subtypes: bool = True) -> Items:
    """Items of a classification task for `sentences[sentence_ids]`; offsets locate their words.

    `offsets` are the activation offsets of the full list `sentences`. For `arc`, the negatives of
    sentence i are drawn with a generator seeded by (seed, i), so they do not depend on which other
    sentences are in the set.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    ids = range(len(sentences)) if sentence_ids is None else [int(i) for i in sentence_ids]
    a_idx, b_idx, labels, types, sent = [], [], [], [], []
    counts: Counter = Counter()
    for j, i in enumerate(ids):
        s, base = sentences[i], int(offsets[i])
        if task in ("upos", "xpos"):
            tags = s.upos if task == "upos" else s.xpos
            for w, (form, tag) in enumerate(zip(s.words, tags)):
                a_idx.append(base + w)
                labels.append(tag)
                types.append(form)
                sent.append(j)
            counts["words"] += len(s.words)
            continue
        pos = arcs(s.heads)
        counts["root_arcs_left_out"] += len(s.heads) - len(pos)
        if task == "deprel":
            for h, d in pos:
                rel = s.deprels[d] if deprel_subtypes else s.deprels[d].split(":")[0]
                a_idx.append(base + h)
                b_idx.append(base + d)
                labels.append(rel)
                types.append(s.words[d])
                sent.append(j)
            counts["arcs"] += len(pos)
        elif task == "arc":
            neg = sample_non_arcs(s.heads, len(pos), np.random.default_rng([seed, i]))
            counts["positive_pairs"] += len(pos)
            counts["negative_pairs"] += len(neg)
            counts["negative_shortfall"] += len(pos) - len(neg)
            for (h, d), label in [(p, "arc") for p in pos] + [(p, "none") for p in neg]:
                a_idx.append(base + h)
                b_idx.append(base + d)
                labels.append(label)
                types.append(f"{s.words[h]}\x00{s.words[d]}")
                sent.append(j)
        else:
            raise ConfigError(f"not a classification task: {task!r}")
    cols = [np.asarray(a_idx, dtype=np.int64)] + ([np.asarray(b_idx, dtype=np.int64)] if task in ("deprel", "arc") else [])
    return Items(cols, labels, types, np.asarray(sent, dtype=np.int64), dict(counts))


# --------------------------------------------------------------------------- data
@dataclass
class SplitPlan:
    """Which sentences of which files the probes train on, stop on, and are scored on."""

    train: list  # Sentence objects the activations are extracted for ("train pool": fit + stop)
    fit: np.ndarray  # indices into train: probe training sentences
    stop: np.ndarray  # indices into train: early-stopping sentences
    eval: list
    train_split: str
    eval_split: str
    files: list[Path]
    description: dict[str, Any]


def plan_splits(treebank: str, train_split: str, eval_split: str, *, max_train_sentences: int | None,
                max_eval_sentences: int | None, early_stopping_fraction: float, holdout_fraction: float,
                seed: int) -> SplitPlan:
    """Load the treebank and choose sentences (see the module docstring, "Splits")."""
    from workbench.data.conllu import TREEBANKS, load_treebank, treebank_path

    if treebank not in TREEBANKS:
        raise ConfigError(f"unknown treebank {treebank!r}; known: {sorted(TREEBANKS)}")
    have = TREEBANKS[treebank]
    requested = (train_split, eval_split)
    if train_split not in have or eval_split not in have:
        if (train_split, eval_split) != ("train", "dev"):
            raise ConfigError(f"treebank {treebank} has splits {have}, not {train_split!r}/{eval_split!r}")
        train_split, eval_split = (have[0], have[1]) if len(have) >= 2 else (have[0], have[0])
    rng = np.random.default_rng([seed, 1])
    train_all = load_treebank(treebank, train_split)
    files = [treebank_path(treebank, train_split)]
    if train_split == eval_split:  # one split: hold out sentences for evaluation
        order = rng.permutation(len(train_all))
        n_eval = max(1, int(round(holdout_fraction * len(train_all))))
        eval_ids = np.sort(order[:n_eval])
        train_ids = np.sort(order[n_eval:])
        eval_all = [train_all[i] for i in eval_ids]
        train_all = [train_all[i] for i in train_ids]
    else:
        eval_all = load_treebank(treebank, eval_split)
        files.append(treebank_path(treebank, eval_split))
    train = _cap(train_all, max_train_sentences, rng)
    evals = _cap(eval_all, max_eval_sentences, rng)
    if len(train) < 2:
        raise ConfigError(f"need at least 2 training sentences, got {len(train)}")
    order = rng.permutation(len(train))
    n_stop = min(len(train) - 1, max(1, int(round(early_stopping_fraction * len(train)))))
    stop, fit = np.sort(order[:n_stop]), np.sort(order[n_stop:])
    desc = {"treebank": treebank, "requested": list(requested), "train_split": train_split,
            "eval_split": eval_split, "held_out_from_one_split": train_split == eval_split,
            "train_sentences_available": len(train_all), "eval_sentences_available": len(eval_all),
            "fit_sentences": len(fit), "stop_sentences": len(stop), "eval_sentences": len(evals)}  # fmt: skip
    return SplitPlan(train, fit, stop, evals, train_split, eval_split, files, desc)


def _cap(sentences: list, cap: int | None, rng: np.random.Generator) -> list:
    """A seeded sample of `cap` sentences, kept in file order (all of them without a cap)."""
    if cap is None or cap >= len(sentences):
        return list(sentences)
    if cap < 1:
        raise ConfigError(f"sentence caps must be >= 1, got {cap}")
    return [sentences[i] for i in np.sort(rng.choice(len(sentences), size=cap, replace=False))]


# --------------------------------------------------------------------------- fitting helpers
def _encode(labels: Sequence[str], vocab: dict[str, int]) -> np.ndarray:
    """Label strings -> indices; a label unseen in training gets len(vocab) (never counted correct)."""
    unk = len(vocab)
    return np.fromiter((vocab.get(l, unk) for l in labels), dtype=np.int64, count=len(labels))


def _layer_batch(n_layers: int, n_items: int, dim: int, budget_bytes: float) -> int | None:
    """Layers per batched fit so that one group's float32 features stay under the budget."""
    per_layer = max(1, n_items * dim * 4)
    k = int(budget_bytes // per_layer)
    return None if k >= n_layers else max(1, k)


def _ratio_ci(values: np.ndarray, sentence: np.ndarray, n_boot: int, seed: int):
    """Per-item values [L, N] -> (mean, low, high) [L] by a bootstrap over sentences (engine)."""
    _, sid = np.unique(sentence, return_inverse=True)
    s = int(sid.max()) + 1 if len(sid) else 0
    num = engine.per_sentence_sums(values, sid, s)
    den = np.bincount(sid, minlength=s).astype(np.float64)
    return engine.bootstrap_ci(num, den, n_boot=n_boot, seed=seed)


def _length_averaged_ci(values: np.ndarray, lengths: np.ndarray, n_boot: int, seed: int):
    """Bootstrap CI of a statistic averaged within sentence lengths, then over lengths 5-50
    (Hewitt & Manning's DSpr/NSpr). values [L, S] per-sentence scores (NaN = not counted)."""
    values = np.asarray(values, dtype=np.float64)
    lo, hi = st.SPEARMAN_LENGTHS
    ok = np.isfinite(values) & ((lengths >= lo) & (lengths <= hi))[None]
    s = values.shape[1]
    if s == 0 or not ok.any():
        nan = np.full(values.shape[0], np.nan)
        return nan, nan
    uniq, group = np.unique(lengths, return_inverse=True)
    onehot = np.zeros((s, len(uniq)))
    onehot[np.arange(s), group] = 1.0
    rng = np.random.default_rng(seed)
    boots = []
    for start in range(0, n_boot, 256):
        counts = rng.multinomial(s, np.full(s, 1.0 / s), size=min(256, n_boot - start)).astype(np.float64)  # [B, S]
        per_layer = []
        for l in range(values.shape[0]):
            w = counts * ok[l][None]
            num = (w * np.where(ok[l], values[l], 0.0)[None]) @ onehot  # [B, lengths]
            den = w @ onehot
            with np.errstate(invalid="ignore", divide="ignore"):
                means = num / den
            with warnings.catch_warnings():  # a resample may miss every sentence of a length
                warnings.simplefilter("ignore", RuntimeWarning)
                per_layer.append(np.nanmean(np.where(den > 0, means, np.nan), axis=1))
        boots.append(np.stack(per_layer, axis=1))
    boot = np.concatenate(boots)
    return np.nanquantile(boot, 0.025, axis=0), np.nanquantile(boot, 0.975, axis=0)


# --------------------------------------------------------------------------- one model, one stack
@dataclass
class _Context:
    """Everything the task functions share for one (model, stack)."""

    plan: SplitPlan
    train_acts: Any
    eval_acts: Any
    probe_kinds: tuple[str, ...]
    probe_config: dict[str, Any]
    baselines: tuple[str, ...]
    is_twin: bool
    seed: int
    n_boot: int
    pair_product: bool
    deprel_subtypes: bool
    mdl_tasks: tuple[str, ...]
    mdl_max_examples: int | None
    mdl_fractions: tuple[float, ...] | None
    scalar_mix_tasks: tuple[str, ...]
    structural: dict[str, Any]
    memory_budget: float
    progress: bool
    row_args: dict[str, Any]  # model, family, seed, step, stack
    extra: dict[str, Any]
    notes: dict[str, Any]
    timings: dict[str, float]


def _rows(ctx: _Context, task: str, metrics, *, split=None, layers=None, n=None, ci=None, extra=None):
    ex = dict(ctx.extra, **(extra or {}))
    return engine.layer_rows(metrics, probe=PROBE, task=task, split=split or ctx.plan.eval_split, layers=layers,
                             n=n, ci=ci, extra=ex, **ctx.row_args)


def _classification(ctx: _Context, task: str) -> list[pd.DataFrame]:
    plan = ctx.plan
    t_off, e_off = ctx.train_acts.sentence_offsets, ctx.eval_acts.sentence_offsets
    seed = ctx.seed
    fit = build_items(task, plan.train, t_off, plan.fit, seed, ctx.deprel_subtypes)
    stop = build_items(task, plan.train, t_off, plan.stop, seed, ctx.deprel_subtypes)
    ev = build_items(task, plan.eval, e_off, None, seed, ctx.deprel_subtypes)
    ctx.notes.setdefault("pairs" if task in ("deprel", "arc") else "items", {})[task] = {
        "fit": fit.counts, "stop": stop.counts, "eval": ev.counts}  # fmt: skip
    if len(fit) == 0 or len(ev) == 0:
        raise ConfigError(f"task {task}: no training or evaluation items")
    vocab = {l: i for i, l in enumerate(sorted(set(fit.labels)))}
    c = len(vocab)
    y_fit, y_stop, y_ev = _encode(fit.labels, vocab), _encode(stop.labels, vocab), _encode(ev.labels, vocab)
    known = y_ev < c
    unseen = int((~known).sum())
    if unseen:
        ctx.notes.setdefault("unseen_eval_labels", {})[task] = unseen
    product = ctx.pair_product and task in ("deprel", "arc")
    x_fit = FeatureView(ctx.train_acts.layers, fit.cols, product)
    x_stop = FeatureView(ctx.train_acts.layers, stop.cols, product)
    x_ev = FeatureView(ctx.eval_acts.layers, ev.cols, product)
    n_layers = x_fit.shape[0]
    layer_batch = _layer_batch(n_layers, len(fit), x_fit.shape[2], ctx.memory_budget)
    out = []
    extra = {"n_train": len(fit), "num_classes": c, "unseen_eval_labels": unseen}
    if task in ("deprel", "arc"):
        extra["pair_features"] = "concat_product" if product else "concat"
    # Control labels: one draw per type from the train label distribution, same for every split.
    want_control = "control" in ctx.baselines
    if want_control:
        dist = engine.label_distribution(y_fit, c)
        ctrl = [engine.control_labels(items.types, dist, seed) for items in (fit, stop, ev)]
    for kind in ctx.probe_kinds:
        prefix = "" if kind == "linear" else f"{kind}_"
        cfg = dict(ctx.probe_config, kind=kind, seed=seed, layer_batch=layer_batch, progress=ctx.progress)
        t0 = time.perf_counter()
        res = engine.fit_probe(x_fit, y_fit, x_stop, y_stop, num_classes=c + 1, config=cfg)
        correct = res.correct(x_ev, y_ev) & known[None]
        acc, lo, hi = _ratio_ci(correct.astype(np.float64), ev.sentence, ctx.n_boot, seed)
        metrics = {f"{prefix}accuracy": acc, f"{prefix}train_accuracy": res.train_accuracy}
        cis = {f"{prefix}accuracy": (lo, hi)}
        if want_control:
            cres = engine.fit_probe(x_fit, ctrl[0], x_stop, ctrl[1], num_classes=c, config=cfg)
            ccorrect = cres.correct(x_ev, ctrl[2])
            cacc, clo, chi = _ratio_ci(ccorrect.astype(np.float64), ev.sentence, ctx.n_boot, seed)
            sel, slo, shi = _ratio_ci(correct.astype(np.float64) - ccorrect, ev.sentence, ctx.n_boot, seed)
            metrics.update({f"{prefix}control_accuracy": cacc, f"{prefix}selectivity": sel})
            cis.update({f"{prefix}control_accuracy": (clo, chi), f"{prefix}selectivity": (slo, shi)})
        ctx.timings[f"{task}:{kind}"] = round(time.perf_counter() - t0, 3)
        out.append(_rows(ctx, task, metrics, n=len(ev), ci=cis, extra=dict(extra, classifier=kind)))
    if "majority" in ctx.baselines and not ctx.is_twin:
        _, maj = engine.majority_baseline(y_fit, y_ev)
        out.append(_rows(ctx, task, {"majority": np.full(n_layers, maj)}, n=len(ev), extra=extra))
    if task in ctx.mdl_tasks:
        t0 = time.perf_counter()
        idx = np.arange(len(fit))
        if ctx.mdl_max_examples is not None and len(fit) > ctx.mdl_max_examples:
            idx = np.sort(np.random.default_rng([seed, 2]).choice(len(fit), ctx.mdl_max_examples, replace=False))
        x_mdl = FeatureView(ctx.train_acts.layers, [c_[idx] for c_ in fit.cols], product)
        cfg = dict(ctx.probe_config, kind="linear", seed=seed, layer_batch=layer_batch, progress=ctx.progress)
        kw = {"fractions": ctx.mdl_fractions} if ctx.mdl_fractions else {}
        mdl = engine.mdl_online_code(x_mdl, y_fit[idx], num_classes=c, config=cfg, seed=seed, **kw)
        out.append(_rows(ctx, task, {"mdl_codelength": mdl.online_codelength, "compression": mdl.compression},
                         split=f"{plan.train_split}:fit", n=mdl.num_examples,
                         extra=dict(extra, uniform_codelength=mdl.uniform_codelength)))
        ctx.timings[f"{task}:mdl"] = round(time.perf_counter() - t0, 3)
    if task in ctx.scalar_mix_tasks:
        t0 = time.perf_counter()
        cfg = dict(ctx.probe_config, kind="linear", seed=seed, progress=ctx.progress)
        cfg.pop("layer_batch", None)
        mix = engine.fit_scalar_mix(x_fit, y_fit, x_stop, y_stop, num_classes=c + 1, config=cfg)
        split = f"{plan.train_split}:stop"
        out.append(_rows(ctx, task, {"scalar_mix_weight": mix.weights, "cumulative_accuracy": mix.cumulative_dev_accuracy},
                         split=split, n=len(stop), extra=extra))
        out.append(_rows(ctx, task, {"centre_of_gravity": [mix.centre_of_gravity], "expected_layer": [mix.expected_layer],
                                     "scalar_mix_accuracy": [mix.dev_accuracy]},
                         split=split, layers=[0], n=len(stop), extra=extra).assign(layer=pd.NA))
        ctx.timings[f"{task}:scalar_mix"] = round(time.perf_counter() - t0, 3)
    return out


def _tree_set(acts, sentences, ids=None) -> st.TreeSet:
    if ids is None:
        return st.TreeSet(acts.layers, np.asarray(acts.sentence_offsets), [np.asarray(s.heads) for s in sentences],
                          [s.upos for s in sentences])
    rows, offsets = sentence_rows(acts.sentence_offsets, ids)
    chosen = [sentences[i] for i in ids]
    return st.TreeSet(FeatureView(acts.layers, [rows]), offsets, [np.asarray(s.heads) for s in chosen],
                      [s.upos for s in chosen])


def _structural(ctx: _Context, task: str) -> list[pd.DataFrame]:
    plan, cfg, seed = ctx.plan, ctx.structural, ctx.seed
    fit_ids = plan.fit
    cap = cfg.get("max_train_sentences")
    if cap is not None and len(fit_ids) > cap:
        fit_ids = np.sort(np.random.default_rng([seed, 3]).choice(fit_ids, cap, replace=False))
    train = _tree_set(ctx.train_acts, plan.train, fit_ids)
    stop = _tree_set(ctx.train_acts, plan.train, plan.stop)
    ev = _tree_set(ctx.eval_acts, plan.eval)
    kind = "distance" if task == "structural-distance" else "depth"
    t0 = time.perf_counter()
    fitted = st.fit_structural_probe(train, stop, kind=kind, rank=cfg.get("rank", 64), epochs=cfg.get("epochs", 30),
                                     batch_size=cfg.get("batch_size", 32), lr=cfg.get("lr", 1e-3),
                                     patience=cfg.get("patience", 4), seed=seed, progress=ctx.progress)
    preds = st.predict(fitted, ev)
    n_layers = len(preds)
    lengths = np.array([len(h) for h in ev.heads])
    extra = {"n_train": len(train), "rank": int(fitted.proj.shape[-1]), "epochs": fitted.epochs}
    out = []
    scores = st.sentence_scores(kind, preds, ev)
    if kind == "distance":
        correct, total = scores["uuas_correct"], scores["uuas_total"]
        uuas, lo, hi = engine.bootstrap_ci(correct, total, n_boot=ctx.n_boot, seed=seed)
        dspr = st.length_averaged(scores["dspr"], lengths)
        dlo, dhi = _length_averaged_ci(scores["dspr"], lengths, ctx.n_boot, seed)
        out.append(_rows(ctx, task, {"uuas": uuas}, n=int(total.sum()), ci={"uuas": (lo, hi)}, extra=extra))
        out.append(_rows(ctx, task, {"dspr": dspr}, n=len(ev), ci={"dspr": (dlo, dhi)}, extra=extra))
        if "majority" in ctx.baselines and not ctx.is_twin:  # data-only baseline, written with the others
            rb = st.right_branching_uuas(ev)
            out.append(_rows(ctx, task, {"right_branching_uuas": np.full(n_layers, rb)}, n=int(total.sum()), extra=extra))
    else:
        hits = scores["root_hit"]
        counted = np.isfinite(hits[0])
        acc, lo, hi = engine.bootstrap_ci(hits[:, counted], np.ones(int(counted.sum())), n_boot=ctx.n_boot, seed=seed)
        nspr = st.length_averaged(scores["nspr"], lengths)
        nlo, nhi = _length_averaged_ci(scores["nspr"], lengths, ctx.n_boot, seed)
        out.append(_rows(ctx, task, {"root_acc": acc}, n=int(counted.sum()), ci={"root_acc": (lo, hi)}, extra=extra))
        out.append(_rows(ctx, task, {"nspr": nspr}, n=len(ev), ci={"nspr": (nlo, nhi)}, extra=extra))
    ctx.timings[task] = round(time.perf_counter() - t0, 3)
    return out


# --------------------------------------------------------------------------- public entry point
def run_syntax_probes(
    checkpoints: Sequence[str | Path | Any],
    tasks: Sequence[str] = TASKS,
    treebank: str = "en_ewt",
    train_split: str = "train",
    eval_split: str = "dev",
    pooling: str = "first",
    probe: str | Sequence[str] = "linear",
    baselines: Sequence[str] = BASELINES,
    max_train_sentences: int | None = None,
    seed: int = 0,
    store=None,
    *,
    max_eval_sentences: int | None = None,
    stack: str | None = None,
    pair_features: str = "concat",
    deprel_subtypes: bool = True,
    mdl_tasks: Sequence[str] = ("upos",),
    mdl_max_examples: int | None = 20000,
    mdl_fractions: Sequence[float] | None = None,
    scalar_mix_tasks: Sequence[str] = ("upos",),
    structural_max_train_sentences: int | None = 2000,
    structural: Mapping[str, Any] | None = None,
    probe_config: Mapping[str, Any] | None = None,
    early_stopping_fraction: float = 0.1,
    holdout_fraction: float = 0.2,
    n_boot: int = 1000,
    batch_size: int = 32,
    cache_dir: str | Path | None = None,
    memory_budget_gb: float = 1.0,
    name: str | None = None,
    progress: bool = True,
    threads: int | None = None,
) -> tuple[str, pd.DataFrame]:
    """Fit the syntax probes on every layer of every checkpoint; one run in the results store.

    checkpoints: checkpoint folders, training output folders (expanded to their step-* folders),
    or open model handles. Returns (run_id, rows). See the module docstring for tasks, baselines,
    splits and the row/metric naming; `structural` overrides the structural probe's settings
    (rank, epochs, batch_size, lr, patience); `probe_config` overrides `engine.ProbeConfig` fields.
    `threads` sets torch's intra-op threads for the run (restored after): on a shared 2-core machine
    1 thread was 2-4x faster than 2 for both extraction and probe fitting (small matmuls; a second
    thread waits on a busy core).
    """
    with _torch_threads(threads):
        return _run(**{k: v for k, v in locals().items() if k != "threads"})


@contextlib.contextmanager
def _torch_threads(threads: int | None):
    """Set torch's intra-op thread count for a block and restore it afterwards (None: leave it)."""
    import torch

    if threads is None:
        yield
        return
    if threads < 1:
        raise ConfigError(f"threads must be >= 1, got {threads}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run(checkpoints, tasks, treebank, train_split, eval_split, pooling, probe, baselines, max_train_sentences,
         seed, store, *, max_eval_sentences, stack, pair_features, deprel_subtypes, mdl_tasks, mdl_max_examples,
         mdl_fractions, scalar_mix_tasks, structural_max_train_sentences, structural, probe_config,
         early_stopping_fraction, holdout_fraction, n_boot, batch_size, cache_dir, memory_budget_gb, name,
         progress) -> tuple[str, pd.DataFrame]:
    """The body of `run_syntax_probes` (arguments validated here, in the order of the work)."""
    import torch
    from workbench.activations import extract
    from workbench.results import FinishedUnits, ResultsStore

    t_start = time.perf_counter()
    tasks = _as_list(tasks, "tasks")
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise ConfigError(f"unknown task(s) {bad}; tasks are {list(TASKS)}")
    kinds = tuple(_as_list(probe, "probe"))
    if not kinds or any(k not in PROBE_KINDS for k in kinds):
        raise ConfigError(f"probe must be one or more of {PROBE_KINDS}, got {probe!r}")
    baselines = tuple(_as_list(baselines, "baselines"))
    if any(b not in BASELINES for b in baselines):
        raise ConfigError(f"unknown baseline(s) in {baselines}; baselines are {list(BASELINES)}")
    if pair_features not in PAIR_FEATURES:
        raise ConfigError(f"pair_features must be one of {PAIR_FEATURES}, got {pair_features!r}")
    if not 0 < early_stopping_fraction < 1 or not 0 < holdout_fraction < 1:
        raise ConfigError("early_stopping_fraction and holdout_fraction must lie in (0, 1)")
    unknown = set(structural or {}) - {"rank", "epochs", "batch_size", "lr", "patience"}
    if unknown:
        raise ConfigError(f"unknown structural probe settings {sorted(unknown)}")
    bad_keys = set(probe_config or {}) - set(engine.ProbeConfig.__dataclass_fields__)
    if bad_keys:
        raise ConfigError(f"unknown probe_config key(s) {sorted(bad_keys)}")
    ckpts = expand_checkpoints(checkpoints)

    plan = plan_splits(treebank, train_split, eval_split, max_train_sentences=max_train_sentences,
                       max_eval_sentences=max_eval_sentences, early_stopping_fraction=early_stopping_fraction,
                       holdout_fraction=holdout_fraction, seed=seed)
    timings: dict[str, Any] = {"load_treebank": round(time.perf_counter() - t_start, 3)}
    config = {
        "checkpoints": [str(c.path) if c.path else c.name for c in ckpts], "tasks": tasks, "treebank": treebank,
        "train_split": train_split, "eval_split": eval_split, "pooling": pooling, "probe": list(kinds),
        "baselines": list(baselines), "max_train_sentences": max_train_sentences,
        "max_eval_sentences": max_eval_sentences, "seed": seed, "stack": stack, "pair_features": pair_features,
        "deprel_subtypes": deprel_subtypes, "mdl_tasks": list(mdl_tasks), "mdl_max_examples": mdl_max_examples,
        "mdl_fractions": list(mdl_fractions) if mdl_fractions else None,
        "scalar_mix_tasks": list(scalar_mix_tasks), "structural_max_train_sentences": structural_max_train_sentences,
        "structural": dict(structural or {}), "probe_config": dict(probe_config or {}),
        "early_stopping_fraction": early_stopping_fraction, "holdout_fraction": holdout_fraction,
        "n_boot": n_boot, "batch_size": batch_size,
    }  # fmt: skip
    store = store if store is not None else ResultsStore()
    records = [c.handle if c.handle is not None else c.path for c in ckpts]
    frames: list[pd.DataFrame] = []
    notes: dict[str, Any] = {"splits": plan.description, "extraction": {}, "random_init_twins": [],
                             "torch_threads": torch.get_num_threads()}
    train_words = [s.words for s in plan.train]
    eval_words = [s.words for s in plan.eval]
    subset = max_train_sentences is not None or plan.description["held_out_from_one_split"]
    train_key = f"{treebank}-{plan.train_split}" + (f"-n{len(plan.train)}-seed{seed}" if subset else "")
    eval_subset = plan.description["held_out_from_one_split"] or len(plan.eval) < plan.description["eval_sentences_available"]
    eval_key = f"{treebank}-{plan.eval_split}" + (f"-n{len(plan.eval)}-seed{seed}" if eval_subset else "")
    structural_cfg = dict(structural or {}, max_train_sentences=structural_max_train_sentences)
    # Rerunning an interrupted command reuses its finished (model, stack, task) units.
    units = FinishedUnits(store, "syntax", {k: v for k, v in config.items() if k != "checkpoints"})

    with store.start_run("probe", config, seeds={"probe": seed}, data_files=plan.files, checkpoints=records,
                         name=name or f"syntax {treebank}") as run:
        for ck in tqdm(ckpts, desc="checkpoints", disable=not progress or len(ckpts) < 2):
            handle = ck.handle if ck.handle is not None else _load_handle(ck.path)
            family = ck.family or getattr(handle, "family", None)
            variants = [(ck.name, handle, False)]
            if "random_init" in baselines:
                t0 = time.perf_counter()
                # Offset from the probe seed: a checkpoint trained from seed s must not have a "random"
                # twin that is its own step-0 initialisation.
                twin_seed = seed + TWIN_SEED_OFFSET
                twin = engine.random_init_twin(handle, seed=twin_seed)
                if all(torch.equal(a, b) for a, b in zip(twin.model.parameters(), handle.model.parameters())):
                    raise ConfigError(f"{ck.name}: its random-init twin (seed {twin_seed}) has the same weights")
                timings[f"{ck.name}|twin_init"] = round(time.perf_counter() - t0, 3)
                variants.append((ck.name + RANDOM_INIT_SUFFIX, twin, True))
                notes["random_init_twins"].append({"of": ck.name, "sha256": twin.checkpoint_hash, "seed": twin_seed})
            stacks = list(handle.stacks) if stack == "all" else [stack or handle.stacks[0]]
            for model_name, h, is_twin in variants:
                for stk in stacks:
                    key = f"{model_name}|{stk}"
                    t0 = time.perf_counter()
                    tr = extract(h, train_words, train_key, pooling=pooling, stack=stk, batch_size=batch_size,
                                 cache_dir=cache_dir, progress=progress)
                    ev = extract(h, eval_words, eval_key, pooling=pooling, stack=stk, batch_size=batch_size,
                                 cache_dir=cache_dir, progress=progress)
                    stage_t = {"extract": round(time.perf_counter() - t0, 3)}
                    _log(progress, f"{key}: extraction {stage_t['extract']:.1f} s")
                    notes["extraction"][key] = {
                        plan.train_split if plan.train_split != plan.eval_split else "train_pool": _counts(tr.stats),
                        plan.eval_split: _counts(ev.stats)}  # fmt: skip
                    ctx = _Context(
                        plan=plan, train_acts=tr, eval_acts=ev, probe_kinds=kinds, probe_config=dict(probe_config or {}),
                        baselines=baselines, is_twin=is_twin, seed=seed, n_boot=n_boot,
                        pair_product=pair_features == "concat_product", deprel_subtypes=deprel_subtypes,
                        mdl_tasks=tuple(mdl_tasks), mdl_max_examples=mdl_max_examples,
                        mdl_fractions=tuple(mdl_fractions) if mdl_fractions else None,
                        scalar_mix_tasks=tuple(scalar_mix_tasks), structural=structural_cfg,
                        memory_budget=memory_budget_gb * 2**30, progress=progress,
                        row_args={"model": model_name, "family": family, "seed": ck.seed, "step": ck.step, "stack": stk},
                        extra=_extra(treebank, plan, pooling, seed, is_twin), notes=notes, timings=stage_t,
                    )  # fmt: skip
                    for task in tqdm(tasks, desc=f"tasks {model_name}", disable=not progress, leave=False):
                        unit = f"{model_name}|{stk}|{task}|{h.checkpoint_hash[:16]}"
                        saved = units.load(unit)
                        if saved is not None:
                            _log(progress, f"{key}: {task} reused from an interrupted attempt")
                            parts = [saved]
                        else:
                            t1 = time.perf_counter()
                            parts = _structural(ctx, task) if task in STRUCTURAL_TASKS else _classification(ctx, task)
                            units.save(unit, parts)
                            stage_t[f"{task}:total"] = round(time.perf_counter() - t1, 3)
                            _log(progress, f"{key}: {task} {stage_t[f'{task}:total']:.1f} s")
                        for part in parts:
                            run.add(part)
                            frames.append(part)
                    timings[key] = stage_t
        timings["total"] = round(time.perf_counter() - t_start, 3)
        notes["reused_units"] = units.reused
        for k, v in notes.items():
            run.note(k, v)
        run.note("timings_s", timings)
        run_id = run.finish()
    units.discard()
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    rows["run_id"] = run_id
    return run_id, rows


def _log(progress: bool, message: str) -> None:
    if progress:
        tqdm.write(f"[syntax] {message}", file=sys.stderr)


def _extra(treebank: str, plan: SplitPlan, pooling: str, seed: int, is_twin: bool) -> dict[str, Any]:
    ex = {"treebank": treebank, "train_split": plan.train_split, "pooling": pooling, "probe_seed": seed}
    if is_twin:
        ex["baseline"] = "random_init"
    return ex


def _counts(stats: Mapping[str, int]) -> dict[str, int]:
    """Every extraction count, the bad-input ones always present (0 when nothing happened)."""
    out = {k: int(stats.get(k, 0)) for k in EXTRACTION_COUNTS}
    out.update({k: int(v) for k, v in stats.items() if k not in out})
    return out


def _load_handle(path: Path):
    from workbench.models import ModelHandle

    return ModelHandle.load(path)


def _as_list(value, what: str) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if value is None:
        return []
    try:
        return [str(v) for v in value]
    except TypeError:
        raise ConfigError(f"{what}: expected a list or a comma-separated string, got {value!r}") from None


def run_syntax_from_config(config: Mapping[str, Any], store=None) -> tuple[str, pd.DataFrame]:
    """`run_syntax_probes(**config)` for a YAML/dict config (e.g. experiments/probe_syntax.yaml);
    unknown keys are a ConfigError. `probe: syntax` and `kind: probe` keys are accepted and ignored."""
    import inspect

    cfg = {k: v for k, v in dict(config).items() if k not in ("kind",) and not (k == "probe" and v == PROBE)}
    if "checkpoint" in cfg:
        cfg["checkpoints"] = cfg.pop("checkpoint")
    if "classifier" in cfg:
        cfg["probe"] = cfg.pop("classifier")
    allowed = set(inspect.signature(run_syntax_probes).parameters) - {"store"}
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ConfigError(f"unknown syntax probe config key(s) {unknown}; allowed: {sorted(allowed)}")
    if "checkpoints" not in cfg:
        raise ConfigError("syntax probe config needs `checkpoints`")
    if isinstance(cfg["checkpoints"], str):
        cfg["checkpoints"] = _as_list(cfg["checkpoints"], "checkpoints")
    return run_syntax_probes(store=store, **cfg)


# --------------------------------------------------------------------------- summary table
def format_layer_table(rows: pd.DataFrame) -> str:
    """Per-layer summary of a syntax run: one block per checkpoint and stack (twins folded into their checkpoint).

    Columns: layer, UPOS accuracy [95% CI], UPOS selectivity, UUAS, and the baselines: UPOS majority,
    random-init UPOS accuracy, random-init UUAS, linear-chain UUAS. "-" where a task was not run.
    """
    if rows is None or len(rows) == 0:
        return "(no rows)"
    df = rows[(rows["probe"] == PROBE) & rows["layer"].notna()]
    df = df[~df["split"].astype(str).str.contains(":")]
    stacks = [s for s in dict.fromkeys(df["stack"].tolist()) if isinstance(s, str)]
    if len(stacks) > 1:  # an encoder-decoder probed on both stacks: one block per stack
        return "\n\n".join(_format_blocks(df[df["stack"] == s], f" [{s}]") for s in stacks)
    return _format_blocks(df, "")


def _format_blocks(df: pd.DataFrame, suffix: str) -> str:
    def series(model, task, metric):
        sub = df[(df["model"] == model) & (df["task"] == task) & (df["metric"] == metric)]
        return {int(r.layer): r for r in sub.itertuples()}

    def fmt(r, ci=False):
        if r is None or r.value is None or (isinstance(r.value, float) and math.isnan(r.value)):
            return "-"
        s = f"{r.value:.3f}"
        if ci and pd.notna(r.ci_low) and pd.notna(r.ci_high):
            s += f" [{r.ci_low:.3f},{r.ci_high:.3f}]"
        return s

    models = [m for m in dict.fromkeys(df["model"].tolist()) if not str(m).endswith(RANDOM_INIT_SUFFIX)]
    header = ["layer", "UPOS acc [95% CI]", "UPOS sel", "UUAS", "UPOS majority", "rand-init UPOS", "rand-init UUAS",
              "chain UUAS"]  # fmt: skip
    blocks = []
    for model in models:
        twin = model + RANDOM_INIT_SUFFIX
        acc = series(model, "upos", "accuracy") or series(model, "upos", "mlp_accuracy")
        sel = series(model, "upos", "selectivity") or series(model, "upos", "mlp_selectivity")
        uuas, maj = series(model, "structural-distance", "uuas"), series(model, "upos", "majority")
        racc = series(twin, "upos", "accuracy") or series(twin, "upos", "mlp_accuracy")
        ruuas, chain = series(twin, "structural-distance", "uuas"), series(model, "structural-distance", "right_branching_uuas")
        layers = sorted(set().union(acc, sel, uuas, maj, racc, ruuas, chain))
        table = [header] + [[str(l), fmt(acc.get(l), True), fmt(sel.get(l)), fmt(uuas.get(l)), fmt(maj.get(l)),
                             fmt(racc.get(l)), fmt(ruuas.get(l)), fmt(chain.get(l))] for l in layers]  # fmt: skip
        blocks.append(f"== {model}{suffix}\n" + _aligned(table))
    if not blocks:
        return "(no per-layer syntax rows)"
    if len(models) <= MAX_LAYER_BLOCKS:
        return "\n\n".join(blocks)
    # A sweep over many checkpoints: the last one in full, then one line per checkpoint and metric.
    run_ids = df["run_id"].dropna().unique().tolist() if "run_id" in df else []
    show = f"bertology runs show {run_ids[0]}" if len(run_ids) == 1 else "bertology runs show RUN_ID"
    out = [f"(per-layer tables of the other {len(models) - 1} checkpoints: `{show}`)", blocks[-1]]
    for task, metric, label in CHECKPOINT_MATRICES:
        cells = {m: series(m, task, metric) for m in models}
        layers = sorted(set().union(*cells.values()))
        if layers:
            table = [[label + " | layer"] + [str(l) for l in layers]]
            table += [[m] + [fmt(cells[m].get(l)) for l in layers] for m in models]
            out.append(f"== {label} by checkpoint and layer{suffix}\n" + _aligned(table))
    return "\n\n".join(out)


MAX_LAYER_BLOCKS = 3  # more checkpoints than this: one matrix per metric instead of a block each
CHECKPOINT_MATRICES = (("upos", "accuracy", "UPOS acc"), ("upos", "selectivity", "UPOS sel"),
                       ("structural-distance", "uuas", "UUAS"), ("structural-depth", "root_acc", "root acc"))


def _aligned(table: list[list[str]]) -> str:
    """Rows of cells as right-aligned text columns (the first column left-aligned)."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in table)


# --------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bertology probe syntax",
                                description="Syntax probes (UPOS, XPOS, deprel, arc, structural) on every layer.")
    p.add_argument("--checkpoint", action="append", required=True, metavar="PATH[,PATH...]",
                   help="checkpoint folder(s) or training output folder(s) (all step-* checkpoints); repeatable")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated subset of {','.join(TASKS)}")
    p.add_argument("--treebank", default="en_ewt", help="en_ewt | en_gum | es_gsd | en_pud | es_pud")
    p.add_argument("--train-split", default="train")
    p.add_argument("--eval-split", default="dev")
    p.add_argument("--pooling", default="first", choices=("first", "mean", "last"))
    p.add_argument("--probe", default="linear", help="linear | mlp | linear,mlp")
    p.add_argument("--baselines", default=",".join(BASELINES), help="subset of majority,control,random_init ('' for none)")
    p.add_argument("--max-train-sentences", type=int, default=None)
    p.add_argument("--max-eval-sentences", type=int, default=None)
    p.add_argument("--structural-max-train-sentences", type=int, default=2000,
                   help="cap on the structural probes' training sentences (default 2000; 0 = no cap)")
    p.add_argument("--structural-epochs", type=int, default=30)
    p.add_argument("--mdl-tasks", default="upos", help="tasks with an MDL online code ('' for none)")
    p.add_argument("--scalar-mix-tasks", default="upos", help="tasks with a scalar mix ('' for none)")
    p.add_argument("--pair-features", default="concat", choices=PAIR_FEATURES)
    p.add_argument("--stack", default=None, help="encoder | decoder | all (default: the model's first stack)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--runs-root", default=None, help="results store root (default $BERTOLOGY_RUNS or ./runs)")
    p.add_argument("--name", default=None, help="run name in the catalog")
    p.add_argument("--threads", type=int, default=None, help="torch threads for this run (1 is fastest on a busy 2-core box)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def syntax_cli_main(argv: Sequence[str] | None = None) -> int:
    """`bertology probe syntax ...`: run, then print the run id and the per-layer summary table.

    Returns 0 on success, 2 with one clear line on stderr for bad input (missing checkpoint, bad
    config, missing data), and lets unexpected errors propagate.
    """
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    checkpoints = [p for arg in args.checkpoint for p in _as_list(arg, "--checkpoint")]
    try:
        from workbench.paths import CACHE_ENV
        from workbench.results import ResultsStore

        store = ResultsStore(args.runs_root)
        cache_dir = None
        if args.runs_root and not os.environ.get(CACHE_ENV):
            cache_dir = Path(args.runs_root) / "cache" / "activations"
        run_id, rows = run_syntax_probes(
            checkpoints, tasks=_as_list(args.tasks, "--tasks"), treebank=args.treebank,
            train_split=args.train_split, eval_split=args.eval_split, pooling=args.pooling,
            probe=_as_list(args.probe, "--probe"), baselines=_as_list(args.baselines, "--baselines"),
            max_train_sentences=args.max_train_sentences, seed=args.seed, store=store,
            max_eval_sentences=args.max_eval_sentences, stack=args.stack, pair_features=args.pair_features,
            mdl_tasks=_as_list(args.mdl_tasks, "--mdl-tasks"),
            scalar_mix_tasks=_as_list(args.scalar_mix_tasks, "--scalar-mix-tasks"),
            structural_max_train_sentences=args.structural_max_train_sentences or None,
            structural={"epochs": args.structural_epochs}, n_boot=args.n_boot, cache_dir=cache_dir,
            name=args.name, progress=not args.quiet, threads=args.threads,
        )  # fmt: skip
    except WorkbenchError as err:
        print(f"bertology probe syntax: error: {err}", file=sys.stderr)
        return 2
    print(f"run {run_id}: {len(rows)} rows in {store.root}")
    print(format_layer_table(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(syntax_cli_main())
