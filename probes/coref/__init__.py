"""Coreference probes: GUM mention pairs and entity types, GAP, coreference heads, GAP gender cloze.

Tenney et al. (2019, "BERT rediscovers the classical NLP pipeline") decode coreference late in
depth, after POS and dependencies; Clark et al. (2019, "What does BERT look at?") find single
attention heads that track it. These tasks check both on any checkpoint, layer by layer and head
by head. Documents, not sentences, are the unit: coreference crosses sentences, so a GUM document
or a GAP snippet is read as ONE word sequence in windows of the model's length, half a window
apart, each word taken from the window where it is most central (`ModelHandle.word_states`);
`notes.document_context` says how many words saw fewer than N words of left context.

Tasks
- `gum-pairs` (edge probing, Tenney et al. 2019; mention pairs as in mention-pair coreference
  models): GUM gold mentions and chains (train -> dev). A mention's vector at layer l is the mean
  of its words' vectors and its head word's vector (`span`: mean+head | mean | head); a pair is a
  mention and each of the `k` mentions before it in its document (default 20), label = same chain;
  pair features [a; b; a*b]; the shared linear probe for all layers at once. Metrics: accuracy,
  f1 (positive class), auc (ROC), antecedent_accuracy (the best-scoring earlier mention is in the
  chain, over mentions that have one in their window). Training pairs: all candidates of randomly
  drawn anaphors (seeded) up to `max_train_pairs`, so the label prior of train and dev agree.
- `gum-entity-type`: the entity type of a mention (person, place, organization, abstract, event,
  object, time, substance, plant, animal) from its span vector.
- `gap` (Webster et al. 2018): pronoun -> A, B or neither from [p; a; b; p*a; p*b] (pronoun and
  the two name spans, mean over words); trained on gap-development, early-stopped on
  gap-validation, scored on gap-test with the paper's scorer (`probes.coref.gap_scorer`): f1, f1_masculine,
  f1_feminine, bias (F/M). Every layer's predictions are written in GAP's submission format under
  `gap_predictions_dir` (listed in `notes.gap_predictions`). The paper's best surface baseline,
  Parallelism, scored 66.9 overall F1 on the snippet-context test set (extra.paper_parallelism_f1).
- `attention-heads` (Clark et al. 2019): for every layer x head on GUM test, how often a
  coreferent mention's head word attends most to the head word of one of its antecedents, with
  [CLS]/[SEP] kept in the row (heads_strict: Clark et al.'s criterion), the same with special
  tokens dropped (heads_head_word), and to any word of an antecedent with special tokens dropped
  (heads_all, lenient; per mention type heads_pronoun/_proper/_nominal); how often the GAP
  pronoun gives more attention to the right name (heads_gap); rows with extra.head. Best heads
  are held out: chosen on GUM dev (GAP validation) and reported on GUM test (GAP test):
  best_head_accuracy (the headline, Clark et al.'s criterion; per mention type
  best_head_accuracy_<type>), best_head_accuracy_head_word, best_head_accuracy_lenient,
  best_head_gap, per layer (extra.best_head, chosen_on, chosen_value) and `<metric>_overall` (the
  best layer x head, no layer). Clark et al. report on CoNLL-2012 with BERT-base: best head 65%
  (5-4, chosen on the data it is scored on), nearest mention 27%, head-word match 52%.
- `gap-cloze`: with the model's own LM head, the pronoun of each GAP test snippet is masked and
  he/his/him are compared with she/her (log-sum-exp per gender): the share of snippets where the
  model prefers the feminine forms, per gold gender (a bias view). Models without an LM head give
  no rows (noted).

Baselines (`baselines=`): majority, control (Hewitt & Liang 2019: labels drawn per type, the type
being the head word(s)), rules (string match, head-word match, nearest mention; for GAP nearest
name and a subject-name rule, see `probes.coref.items`), random_init (the runner's twin).
Confidence intervals: 95% percentile bootstrap over documents (GUM) or examples (GAP), every metric
(AUC included) on the same `n_boot` resamples (`probes.core.statistics`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from probes.core import baselines, depth, fitting, runner
from probes.core.statistics import auc, auc_bootstrap, percentile_interval, ratio_bootstrap, resample_counts
from probes.coref.items import (Document, Pairs, antecedent_correct, baseline_pair_predictions, gap_decisions,
                                gap_nearest_name, gap_subject_name, gum_documents, mention_pairs)
from probes.coref.gap_scorer import FEMININE, MASCULINE, pronoun_gender, write_submission
from workbench.errors import ConfigError
from workbench.results import decode_extra

NAME = "coref"
TASKS = ("gum-pairs", "gum-entity-type", "gap", "attention-heads", "gap-cloze")
BASELINES = ("majority", "control", "rules", "random_init")
SPANS = ("mean+head", "mean", "head")
GAP_LABELS = ("A", "B", "NEITHER")
PAPER_PARALLELISM_F1 = 0.669  # Webster et al. (2018), Table 5: Parallelism, snippet-context, test overall F1
MENTION_TYPES = ("pronoun", "proper", "nominal")
HEADS_SELECT_SPLIT, HEADS_REPORT_SPLIT = "dev", "test"  # GUM: a best head is chosen on dev, reported on test
HEAD_CRITERIA = {  # metric -> what a head must attend to most (per layer; `_overall` adds the best layer x head)
    "best_head_accuracy": "clark2019: an antecedent's head word, special tokens kept",
    "best_head_accuracy_head_word": "an antecedent's head word, special tokens dropped and rows renormalised",
    "best_head_accuracy_lenient": "any word of an antecedent, special tokens dropped and rows renormalised",
}


# --------------------------------------------------------------------------- lazy feature views
class SpanView(fitting.LazyFeatures):
    """Mention vectors `[L, M, D]` from word vectors `[L, N, H]`: the mean over each span's words
    and/or its head word's vector (`span`). `cache=True` keeps computed layers (small eval sets)."""

    def __init__(self, base, starts, ends, heads, span: str = "mean+head", cache: bool = False):
        if span not in SPANS:
            raise ConfigError(f"span must be one of {SPANS}, got {span!r}")
        self.base, self.span, self.cache = base, span, cache
        self.starts, self.ends, self.heads = (np.asarray(a, dtype=np.int64) for a in (starts, ends, heads))
        h = int(base.shape[2])
        self.shape = (int(base.shape[0]), len(self.starts), 2 * h if span == "mean+head" else h)
        self._planes: dict[int, np.ndarray] = {}

    def plane(self, layer: int) -> np.ndarray:
        if layer in self._planes:
            return self._planes[layer]
        words = self.base[layer]
        parts = []
        if self.span in ("mean+head", "mean"):
            parts.append(_span_means(words, self.starts, self.ends))
        if self.span in ("mean+head", "head"):
            parts.append(np.asarray(words[self.heads], dtype=np.float32))
        out = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        if self.cache:
            self._planes[layer] = out
        return out

    def _layer(self, layer, rows, out):
        out[:] = self.plane(layer)[rows]


def _span_means(words, starts: np.ndarray, ends: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """Mean of words[start..end] for every span (inclusive), in chunks of spans."""
    out = np.empty((len(starts), int(words.shape[1])), dtype=np.float32)
    for c0 in range(0, len(starts), chunk):
        s, e = starts[c0: c0 + chunk], ends[c0: c0 + chunk]
        lengths = e - s + 1
        idx = np.repeat(s - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(int(lengths.sum()))
        uniq = np.unique(idx)  # sorted: each word read once from the (memory-mapped) layer
        rows = np.asarray(words[uniq], dtype=np.float32)[np.searchsorted(uniq, idx)]
        sums = np.add.reduceat(rows, np.concatenate([[0], np.cumsum(lengths)[:-1]]), axis=0)
        out[c0: c0 + len(s)] = sums / lengths[:, None]
    return out


class PairView(fitting.LazyFeatures):
    """Pair features [a; b; a*b] `[L, P, 3D]` of mention pairs over a SpanView."""

    def __init__(self, spans: SpanView, left, right):
        self.spans = spans
        self.left, self.right = np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)
        self.shape = (spans.shape[0], len(self.left), 3 * spans.shape[2])

    def _layer(self, layer, rows, out):
        plane = self.spans.plane(layer)
        a, b = plane[self.left[rows]], plane[self.right[rows]]
        d = a.shape[1]
        out[:, :d], out[:, d : 2 * d] = a, b
        np.multiply(a, b, out=out[:, 2 * d :])


# --------------------------------------------------------------------------- metrics
def binary_scores(logits: np.ndarray) -> np.ndarray:
    """Score of the positive class (logit difference) from [..., 2] logits."""
    return logits[..., 1] - logits[..., 0]


def pair_metrics(pred: np.ndarray, scores: np.ndarray, pairs: Pairs, n_boot: int, seed: int,
                 require_positive: float | None = None, return_boot: bool = False) -> tuple[dict, ...]:
    """accuracy, f1, auc, antecedent_accuracy per row of pred/scores ([R, P]) with document-bootstrap CIs
    (`probes.core.statistics`: every metric on the same `n_boot` document resamples)
    (+ {auc, antecedent_accuracy: replicates [n_boot, R]} with `return_boot`)."""
    y = pairs.label.astype(bool)
    pred = np.asarray(pred, dtype=bool)
    tp, fp, fn = pred & y, pred & ~y, ~pred & y
    acc = ratio_bootstrap((pred == y).astype(float), None, pairs.doc, n_boot, seed)
    f1 = ratio_bootstrap(2 * tp.astype(float), (2 * tp + fp + fn).astype(float), pairs.doc, n_boot, seed)
    aucs = [auc_bootstrap(s, y, pairs.doc, n_boot, seed, return_boot=True) for s in scores]
    correct, adoc = antecedent_correct(scores, pairs, require_positive)
    ante = ratio_bootstrap(correct.astype(float), None, adoc, n_boot, seed, return_boot=True)
    metrics = {"accuracy": acc[0], "f1": f1[0], "auc": np.array([a[0] for a in aucs]), "antecedent_accuracy": ante[0]}
    cis = {"accuracy": acc[1:], "f1": f1[1:], "auc": (np.array([a[1] for a in aucs]), np.array([a[2] for a in aucs])),
           "antecedent_accuracy": ante[1:3]}
    if return_boot:
        return metrics, cis, {"auc": np.stack([a[3] for a in aucs], axis=1), "antecedent_accuracy": ante[3]}
    return metrics, cis


def gap_scores_ci(pred_a: np.ndarray, pred_b: np.ndarray, gold_a, gold_b, genders, n_boot: int, seed: int,
                  return_boot: bool = False) -> dict:
    """GAP F1 overall/M/F and bias F/M per row of pred_a/pred_b ([R, N] bool) with an example bootstrap.
    Returns name -> (point [R], low [R], high [R]) (+ replicates [n_boot, R] with `return_boot`, the
    same resamples for every row). Equals `gap_scorer.score_gap` (no missing rows). The resamples
    are `probes.core.statistics.resample_counts` over examples (GAP snippets are independent), so
    they are the ones every other example-level CI of the same seed draws."""
    ga, gb = np.asarray(gold_a, bool), np.asarray(gold_b, bool)
    genders = np.asarray(genders)
    n = len(ga)
    counts = np.vstack([np.ones((1, n)), *resample_counts(n, n_boot, seed)])  # row 0 = the data
    out: dict[str, list] = {k: [] for k in ("f1", "f1_masculine", "f1_feminine", "bias")}
    for pa, pb in zip(np.asarray(pred_a, bool), np.asarray(pred_b, bool)):
        tp = (pa & ga).astype(float) + (pb & gb)
        fp = (pa & ~ga).astype(float) + (pb & ~gb)
        fn = (~pa & ga).astype(float) + (~pb & gb)
        f1s = {}
        for name, mask in (("f1", np.ones(n, bool)), ("f1_masculine", genders == MASCULINE),
                           ("f1_feminine", genders == FEMININE)):
            with np.errstate(invalid="ignore", divide="ignore"):
                num = counts @ (2 * tp * mask)
                den = counts @ ((2 * tp + fp + fn) * mask)
                f1s[name] = np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            f1s["bias"] = np.where(f1s["f1_masculine"] > 0, f1s["f1_feminine"] / np.where(
                f1s["f1_masculine"] > 0, f1s["f1_masculine"], 1), np.nan)
        for k, v in f1s.items():
            boot = v[1:]
            out[k].append((v[0], *percentile_interval(boot), boot))
    res = {k: tuple(np.array(x) for x in zip(*v)) for k, v in out.items()}  # boot: [R, B]
    return {k: (p, lo, hi, b.T) if return_boot else (p, lo, hi) for k, (p, lo, hi, b) in res.items()}


# --------------------------------------------------------------------------- settings and data
@dataclass
class CorefSettings(runner.Settings):
    """Settings of the coreference probes (see the module docstring); every field is a CLI option."""

    tasks: tuple[str, ...] = field(default=TASKS, metadata={"help": "comma-separated tasks"})
    baselines: tuple[str, ...] = field(default=BASELINES, metadata={
        "help": "subset of majority,control,rules,random_init ('' for none)"})
    k: int = field(default=20, metadata={"help": "gum-pairs: candidate antecedents per mention"})
    span: str = field(default="mean+head", metadata={"help": "mention vector: mean+head | mean | head"})
    pooling: str = field(default="first", metadata={"help": "first | mean | last subword of each word"})
    max_train_pairs: int = field(default=10000, metadata={"help": "gum-pairs: training pairs (seeded draw of anaphors)"})
    max_train_mentions: int = field(default=20000, metadata={"help": "gum-entity-type: training mentions (seeded)"})
    max_train_documents: int | None = field(default=None, metadata={"help": "cap on GUM train documents (seeded)"})
    max_eval_documents: int | None = field(default=None, metadata={
        "help": "cap on GUM eval documents (the first N; attention-heads: of dev and of test)"})
    max_gap_examples: int | None = field(default=None, metadata={"help": "cap on each GAP split (the first N rows)"})
    early_stopping_fraction: float = field(default=0.1, metadata={"help": "GUM train documents held out for early stopping"})
    eval_split: str = field(default="dev", metadata={
        "help": "GUM split the probes report on: dev | test (attention-heads: heads chosen on dev, reported on test)"})
    gap_eval_split: str = field(default="test", metadata={"help": "GAP split to report on: test | validation"})
    gap_predictions_dir: str | None = field(default=None, metadata={
        "help": "where GAP submission files go (default <runs root>/coref/gap-predictions)"})
    context_thresholds: tuple[int, ...] = field(default=(16, 64, 128), metadata={
        "help": "document context: count words with fewer left-context words than each"})
    attention_batch_size: int = field(default=4, metadata={"help": "windows per forward pass with attentions"})
    probe_config: dict = field(default_factory=dict, metadata={"help": "fitting.ProbeConfig overrides"})
    memory_budget_gb: float = field(default=1.0, metadata={"help": "features in memory per batched fit"})

    BASELINES = BASELINES
    EXECUTION_FIELDS = runner.Settings.EXECUTION_FIELDS + ("memory_budget_gb", "attention_batch_size",
                                                           "gap_predictions_dir")

    def validate(self, spec) -> None:
        super().validate(spec)
        if self.k < 1:
            raise ConfigError(f"k must be >= 1, got {self.k}")
        if self.span not in SPANS:
            raise ConfigError(f"span must be one of {SPANS}, got {self.span!r}")
        if self.pooling not in ("first", "mean", "last"):
            raise ConfigError(f"pooling must be first, mean or last, got {self.pooling!r}")
        if self.max_train_pairs < 1 or self.max_train_mentions < 1:
            raise ConfigError("max_train_pairs and max_train_mentions must be >= 1")
        if self.max_train_documents is not None and self.max_train_documents < 2:
            raise ConfigError(f"max_train_documents must be >= 2 (or unset), got {self.max_train_documents}")
        for key in ("max_eval_documents", "max_gap_examples"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1 (or unset), got {getattr(self, key)}")
        if not 0 < self.early_stopping_fraction < 1:
            raise ConfigError("early_stopping_fraction must lie in (0, 1)")
        if self.eval_split not in ("dev", "test"):
            raise ConfigError(f"eval_split must be dev or test, got {self.eval_split!r}")
        if self.gap_eval_split not in ("test", "validation"):
            raise ConfigError(f"gap_eval_split must be test or validation, got {self.gap_eval_split!r}")
        if any(t < 1 for t in self.context_thresholds):
            raise ConfigError("context_thresholds must be >= 1")
        if self.attention_batch_size < 1 or self.memory_budget_gb <= 0:
            raise ConfigError("attention_batch_size must be >= 1 and memory_budget_gb > 0")
        bad = set(self.probe_config) - set(fitting.ProbeConfig.__dataclass_fields__)
        if bad:
            raise ConfigError(f"unknown probe_config key(s) {sorted(bad)}")


@dataclass
class CorefData:
    fit: list[Document] = field(default_factory=list)  # GUM train documents the probes are fitted on
    stop: list[Document] = field(default_factory=list)  # GUM train documents for early stopping
    eval: list[Document] = field(default_factory=list)  # GUM eval-split documents
    heads: dict[str, list[Document]] = field(default_factory=dict)  # attention-heads: GUM dev (select), test (report)
    gap: dict[str, pd.DataFrame] = field(default_factory=dict)  # development / validation / <eval>
    keys: dict[str, str] = field(default_factory=dict)  # activation-cache keys


GUM_TASKS = ("gum-pairs", "gum-entity-type", "attention-heads")
GAP_TASKS = ("gap", "attention-heads", "gap-cloze")


def prepare(settings: CorefSettings) -> runner.Prepared:
    from workbench.data.conllu import load_treebank, read_gum_coref, treebank_path
    from workbench.data.gap import gap_path, read_gap

    s = settings
    data, files, notes = CorefData(), [], {"document_context": {}, "extraction": {}, "items": {}}
    if set(s.tasks) & set(GUM_TASKS):
        needs_train = bool(set(s.tasks) & {"gum-pairs", "gum-entity-type"})
        heads_splits = (HEADS_SELECT_SPLIT, HEADS_REPORT_SPLIT) if "attention-heads" in s.tasks else ()
        splits = list(dict.fromkeys((["train"] if needs_train else []) + [s.eval_split, *heads_splits]))
        docs = {}
        for split in splits:
            sents = load_treebank("en_gum", split)
            mentions, _ = read_gum_coref(sents)
            docs[split] = gum_documents(sents, mentions)
            files.append(treebank_path("en_gum", split))
        data.eval = docs[s.eval_split][: s.max_eval_documents]
        data.heads = {split: docs[split][: s.max_eval_documents] for split in heads_splits}
        data.keys["eval"] = f"en_gum-{s.eval_split}-documents" + (
            f"-first{s.max_eval_documents}" if s.max_eval_documents else "")
        if needs_train:
            train = docs["train"]
            rng = np.random.default_rng([s.seed, 11])
            order = rng.permutation(len(train))
            if s.max_train_documents is not None:
                order = order[: s.max_train_documents]
            n_stop = max(1, int(round(len(order) * s.early_stopping_fraction)))
            data.stop = [train[i] for i in sorted(order[:n_stop])]
            data.fit = [train[i] for i in sorted(order[n_stop:])]
            tag = "" if s.max_train_documents is None else f"-n{len(order)}"
            data.keys["fit"] = f"en_gum-train-documents-fit{tag}-seed{s.seed}-f{s.early_stopping_fraction}"
            data.keys["stop"] = f"en_gum-train-documents-stop{tag}-seed{s.seed}-f{s.early_stopping_fraction}"
        notes["splits"] = {"gum_fit_documents": len(data.fit), "gum_stop_documents": len(data.stop),
                           "gum_eval": s.eval_split, "gum_eval_documents": len(data.eval),
                           **({"attention_heads": {"select": HEADS_SELECT_SPLIT, "report": HEADS_REPORT_SPLIT,
                                                   "documents": {k: len(v) for k, v in data.heads.items()}}}
                              if data.heads else {})}
    if set(s.tasks) & set(GAP_TASKS):
        for split in ("development", "validation", s.gap_eval_split):
            if split not in data.gap:
                frame = read_gap(split)
                data.gap[split] = frame.iloc[: s.max_gap_examples].reset_index(drop=True) if s.max_gap_examples else frame
                files.append(gap_path(split))
        notes.setdefault("splits", {})["gap"] = {"train": "development", "stop": "validation", "eval": s.gap_eval_split}
    return runner.Prepared(data=data, files=files, notes=notes)


# --------------------------------------------------------------------------- per unit helpers
def _acts(unit, docs: Sequence[Document] | Sequence[list[str]], key: str, settings: CorefSettings):
    words = [d.words if isinstance(d, Document) else list(d) for d in docs]
    acts = unit.activations(words, key, pooling=settings.pooling)
    unit.notes["extraction"].setdefault(unit.key, {})[key] = {
        k: int(v) for k, v in acts.stats.items() if isinstance(v, (int, np.integer))}
    return acts


def _spans(acts, docs: Sequence[Document], span: str, cache: bool = False) -> SpanView:
    st, en, hd = [], [], []
    for i, d in enumerate(docs):
        off = int(acts.sentence_offsets[i])
        for m in d.mentions:
            st.append(off + m.start)
            en.append(off + m.end)
            hd.append(off + m.head)
    return SpanView(acts.layers, st, en, hd, span, cache)


def _document_context(unit, prepared, settings: CorefSettings) -> None:
    """Left context per word in the windows the model reads (once per unit, noted)."""
    from probes.coref.attention import document_windows, left_context_counts

    if "context" in unit.state:
        return
    d: CorefData = prepared.data
    out = {}
    if d.eval:
        plans = [document_windows(unit.handle, doc.words, unit.stack) for doc in d.eval]
        out[f"gum-{settings.eval_split}"] = left_context_counts(plans, settings.context_thresholds)
    if settings.gap_eval_split in d.gap:
        plans = [document_windows(unit.handle, w, unit.stack) for w in d.gap[settings.gap_eval_split]["words"]]
        out[f"gap-{settings.gap_eval_split}"] = left_context_counts(plans, settings.context_thresholds)
    unit.notes["document_context"][unit.key] = out
    unit.state["context"] = True


def _layer_batch(n_layers: int, n_items: int, dim: int, budget_gb: float) -> int | None:
    per_layer = max(1, n_items * dim * 4)
    k = int(budget_gb * 2**30 // per_layer)
    return None if k >= n_layers else max(1, k)


def _probe_cfg(settings: CorefSettings, layer_batch, **extra) -> dict:
    return dict(settings.probe_config, seed=settings.seed, layer_batch=layer_batch, progress=settings.progress, **extra)


def sample_anaphors(pairs: Pairs, max_pairs: int, seed: int) -> np.ndarray:
    """Indices of the pairs of randomly drawn anaphors (all their candidates) up to `max_pairs`."""
    anaphors = np.unique(pairs.anaphor)
    order = np.random.default_rng(seed).permutation(anaphors)
    sizes = np.bincount(pairs.anaphor, minlength=int(pairs.anaphor.max()) + 1 if len(pairs.anaphor) else 0)[order]
    take = order[: int(np.searchsorted(np.cumsum(sizes), max_pairs, side="right"))]
    return np.flatnonzero(np.isin(pairs.anaphor, take))


def _subset(p: Pairs, idx: np.ndarray) -> Pairs:
    return Pairs(p.anaphor[idx], p.candidate[idx], p.label[idx], p.doc[idx], p.distance[idx])


def _predict_chunked(res, view, chunk: int = 4096) -> np.ndarray:
    return np.concatenate([res.logits(view[:, a: a + chunk]) for a in range(0, view.shape[1], chunk)], axis=1)


def pair_probe(fit_spans: SpanView, fit_pairs: Pairs, stop_spans: SpanView, stop_pairs: Pairs, eval_spans: SpanView,
               eval_pairs: Pairs, settings: CorefSettings, labels: Sequence[np.ndarray] | None = None):
    """Fit the pair probe on every layer and score the eval pairs. `labels` replaces the gold
    labels (fit, stop, eval) for a control task. Returns (result, eval logits [L, P, 2])."""
    x_fit = PairView(fit_spans, fit_pairs.anaphor, fit_pairs.candidate)
    x_stop = PairView(stop_spans, stop_pairs.anaphor, stop_pairs.candidate)
    x_ev = PairView(eval_spans, eval_pairs.anaphor, eval_pairs.candidate)
    y = labels or (fit_pairs.label, stop_pairs.label, eval_pairs.label)
    lb = _layer_batch(x_fit.shape[0], x_fit.shape[1], x_fit.shape[2], settings.memory_budget_gb)
    # Early stopping on dev LOSS: with ~6% positives, dev accuracy rarely beats the all-negative
    # start, so stopping on accuracy keeps the prior-only initialisation. Minibatch Adam by default:
    # joint L-BFGS (200 iterations) over all layers of these pair features left most MiniLM layers at the
    # prior; Adam at the fitter's default 3e-2 overfits these 2,304-wide features within the first epoch
    # (dev loss above the prior's, best step 0); 1e-3 trains (MiniLM layer 2: AUC 0.87 on held-out train pairs).
    cfg = dict(_probe_cfg(settings, lb), **{"stop_on": settings.probe_config.get("stop_on", "loss"),
                                             "optimizer": settings.probe_config.get("optimizer", "adam"),
                                             "lr": settings.probe_config.get("lr", 1e-3)})
    res = fitting.fit_probe(x_fit, y[0], x_stop, y[1], num_classes=2, config=cfg)
    return res, _predict_chunked(res, x_ev)


def _scalars(metrics) -> dict[str, float]:
    """{name: [v]} -> {name: v}: whole-model metrics for `Unit.rows` (layer NA)."""
    return {k: float(np.asarray(v, dtype=np.float64).ravel()[0]) for k, v in metrics.items()}


def _scalar_cis(cis) -> dict[str, tuple[float, float]]:
    """{name: ([lo], [hi])} -> {name: (lo, hi)}."""
    return {k: (float(np.asarray(lo).ravel()[0]), float(np.asarray(hi).ravel()[0])) for k, (lo, hi) in cis.items()}


def _depth_rows(unit, task: str, metric: str, point, ci, boot, *, split: str, n: int, extra: dict) -> list[pd.DataFrame]:
    """One headline metric's per-layer rows with their paired bootstrap replicates (`extra.boot`, read
    by the "where in depth" figure, `probes.core.depth`), the share of resamples in which each layer is
    the best (`<metric>_peak_share`) and the peak layer with its percentile CI (`<metric>_peak_layer`,
    no layer)."""
    layers = list(range(len(point)))
    share, peak, peak_ci = depth.depth_rows(metric, point, boot, layers)
    return [unit.rows(task, {metric: point}, split=split, n=n, ci={metric: ci}, extra=depth.boot_extras(boot, extra)),
            unit.rows(task, share, split=split, n=n, extra=dict(extra, n_boot=len(boot))),
            unit.rows(task, _scalars(peak), split=split, n=n, ci=_scalar_cis(peak_ci),
                      extra=dict(extra, n_boot=len(boot)))]


# --------------------------------------------------------------------------- tasks
def _gum_pairs(unit, prepared, settings: CorefSettings) -> list[pd.DataFrame]:
    d: CorefData = prepared.data
    s = settings
    acts = {k: _acts(unit, getattr(d, k), d.keys[k], s) for k in ("fit", "stop", "eval")}
    spans = {k: _spans(acts[k], getattr(d, k), s.span, cache=(k != "fit")) for k in acts}
    pairs = {k: mention_pairs(getattr(d, k), s.k) for k in acts}
    fit_idx = sample_anaphors(pairs["fit"], s.max_train_pairs, s.seed)
    stop_idx = sample_anaphors(pairs["stop"], max(1, s.max_train_pairs // 4), s.seed + 1)
    fit, stop, ev = _subset(pairs["fit"], fit_idx), _subset(pairs["stop"], stop_idx), pairs["eval"]
    unit.notes["items"]["gum-pairs"] = {
        split: {"pairs": int(len(p.label)), "positive": int(p.label.sum()), "anaphors": int(len(np.unique(p.anaphor)))}
        for split, p in (("fit", fit), ("stop", stop), ("eval", ev))}
    t0 = time.perf_counter()
    res, logits = pair_probe(spans["fit"], fit, spans["stop"], stop, spans["eval"], ev, s)
    scores = binary_scores(logits)
    metrics, cis, boots = pair_metrics(logits.argmax(-1) == 1, scores, ev, s.n_boot, s.seed, return_boot=True)
    metrics["train_accuracy"] = res.train_accuracy
    extra = {"k": s.k, "span": s.span, "pooling": s.pooling, "n_train": int(len(fit.label)),
             "positive_rate": float(ev.label.mean()), "pair_features": "concat_product", "probe_seed": s.seed}
    auc_point, out = metrics["auc"], []
    for m, boot in boots.items():
        out += _depth_rows(unit, "gum-pairs", m, metrics.pop(m), cis.pop(m), boot, split=s.eval_split,
                           n=len(ev.label), extra=extra)
    out.append(unit.rows("gum-pairs", metrics, split=s.eval_split, n=len(ev.label), ci=cis, extra=extra))
    n_layers = len(res.train_accuracy)
    if "control" in s.baselines:
        ms = {k: [m for doc in getattr(d, k) for m in doc.mentions] for k in ("fit", "stop", "eval")}
        types = {k: [f"{ms[k][a].head_text.lower()}\x00{ms[k][c].head_text.lower()}" for a, c in zip(p.anaphor, p.candidate)]
                 for k, p in (("fit", fit), ("stop", stop), ("eval", ev))}
        dist = baselines.label_distribution(fit.label, 2)
        ctrl = [baselines.control_labels(types[k], dist, s.seed) for k in ("fit", "stop", "eval")]
        _, clog = pair_probe(spans["fit"], fit, spans["stop"], stop, spans["eval"], ev, s, labels=ctrl)
        cacc = (clog.argmax(-1) == ctrl[2][None]).mean(1)
        cauc = np.array([auc(sc, ctrl[2]) for sc in binary_scores(clog)])
        out.append(baselines.mark_baselines(unit.rows("gum-pairs", {"control_accuracy": cacc, "control_auc": cauc,
                                           "selectivity_auc": auc_point - cauc},
                             split=s.eval_split, n=len(ev.label), extra=extra), {"control_accuracy": ("control", "accuracy"), "control_auc": ("control", "auc")}))
    if not unit.is_twin:
        base = {}
        if "rules" in s.baselines:
            base.update({k: v for k, v in baseline_pair_predictions(d.eval, ev).items() if k != "majority"})
        if "majority" in s.baselines:
            base["majority"] = np.zeros(len(ev.label), dtype=np.int64)
        for name, pred in base.items():
            bm, bc = pair_metrics(pred[None].astype(bool), pred[None].astype(float), ev, s.n_boot, s.seed,
                                  require_positive=1.0)
            out.append(unit.rows("gum-pairs", {f"{name}_{k}": np.repeat(v, n_layers) for k, v in bm.items()},
                                 split=s.eval_split, n=len(ev.label),
                                 ci={f"{name}_{k}": (np.repeat(lo, n_layers), np.repeat(hi, n_layers))
                                     for k, (lo, hi) in bc.items()}, extra=dict(extra, baseline=name)))
    unit.timings["gum-pairs:probe"] = round(time.perf_counter() - t0, 3)
    return out


def _gum_entity_type(unit, prepared, settings: CorefSettings) -> list[pd.DataFrame]:
    d: CorefData = prepared.data
    s = settings
    acts = {k: _acts(unit, getattr(d, k), d.keys[k], s) for k in ("fit", "stop", "eval")}
    spans = {k: _spans(acts[k], getattr(d, k), s.span, cache=(k != "fit")) for k in acts}
    ms = {k: [m for doc in getattr(d, k) for m in doc.mentions] for k in acts}
    docs_of = {k: np.repeat(np.arange(len(getattr(d, k))), [len(doc.mentions) for doc in getattr(d, k)]) for k in acts}
    vocab = {t: i for i, t in enumerate(sorted({m.etype for m in ms["fit"]}))}
    enc = lambda k: np.array([vocab.get(m.etype, len(vocab)) for m in ms[k]], dtype=np.int64)  # noqa: E731
    y = {k: enc(k) for k in acts}
    rng = np.random.default_rng([s.seed, 3])
    take = np.sort(rng.permutation(len(ms["fit"]))[: s.max_train_mentions])
    c = len(vocab)

    class _Rows(fitting.LazyFeatures):  # a subset of a SpanView's rows
        def __init__(self, view, idx):
            self.view, self.idx = view, idx
            self.shape = (view.shape[0], len(idx), view.shape[2])

        def _layer(self, layer, rows, out):
            out[:] = self.view.plane(layer)[self.idx[rows]]

    x_fit = _Rows(spans["fit"], take)
    x_stop, x_ev = spans["stop"], spans["eval"]
    lb = _layer_batch(x_fit.shape[0], x_fit.shape[1], x_fit.shape[2], s.memory_budget_gb)
    cfg = _probe_cfg(s, lb)
    res = fitting.fit_probe(x_fit, y["fit"][take], x_stop, y["stop"], num_classes=c + 1, config=cfg)
    correct = _predict_chunked(res, x_ev).argmax(-1) == y["eval"][None]
    acc = ratio_bootstrap(correct.astype(float), None, docs_of["eval"], s.n_boot, s.seed, return_boot=True)
    metrics = {"train_accuracy": res.train_accuracy}
    cis = {}
    if "control" in s.baselines:
        types = {k: [m.head_text.lower() for m in ms[k]] for k in acts}
        ctrl = {k: baselines.control_labels(types[k], baselines.label_distribution(y["fit"][take], c), s.seed) for k in acts}
        cres = fitting.fit_probe(x_fit, ctrl["fit"][take], x_stop, ctrl["stop"], num_classes=c, config=cfg)
        ccorrect = _predict_chunked(cres, x_ev).argmax(-1) == ctrl["eval"][None]
        cacc = ratio_bootstrap(ccorrect.astype(float), None, docs_of["eval"], s.n_boot, s.seed)
        sel = ratio_bootstrap(correct.astype(float) - ccorrect, None, docs_of["eval"], s.n_boot, s.seed)
        metrics.update({"control_accuracy": cacc[0], "selectivity": sel[0]})
        cis.update({"control_accuracy": cacc[1:], "selectivity": sel[1:]})
    extra = {"span": s.span, "pooling": s.pooling, "n_train": int(len(take)), "num_classes": c, "probe_seed": s.seed}
    out = _depth_rows(unit, "gum-entity-type", "accuracy", acc[0], acc[1:3], acc[3], split=s.eval_split,
                      n=len(y["eval"]), extra=extra)
    out.append(unit.rows("gum-entity-type", metrics, split=s.eval_split, n=len(y["eval"]), ci=cis, extra=extra))
    if "majority" in s.baselines and not unit.is_twin:
        _, maj = baselines.majority_baseline(y["fit"][take], y["eval"])
        out.append(unit.rows("gum-entity-type", {"majority": np.full(len(res.train_accuracy), maj)},
                             split=s.eval_split, n=len(y["eval"]), extra=dict(extra, baseline="majority", baseline_for="accuracy")))
    return out


def _gap_features(unit, frame: pd.DataFrame, split: str, settings: CorefSettings) -> np.ndarray:
    """[L, N, 5D] features [p; a; b; p*a; p*b] of GAP examples (mean over each span's words)."""
    key = f"gap-{split}" + (f"-first{settings.max_gap_examples}" if settings.max_gap_examples else "")
    acts = _acts(unit, list(frame["words"]), key, settings)
    off = acts.sentence_offsets[:-1]
    views = [SpanView(acts.layers, off + frame[f"{r}_start"].to_numpy(), off + frame[f"{r}_end"].to_numpy(),
                      off + frame[f"{r}_end"].to_numpy(), "mean") for r in ("pronoun", "a", "b")]
    out = []
    for layer in range(acts.layers.shape[0]):
        p, a, b = (v.plane(layer) for v in views)
        out.append(np.concatenate([p, a, b, p * a, p * b], axis=1))
    return np.stack(out)


def _gap_predictions_dir(unit, settings: CorefSettings) -> Path:
    from workbench.paths import runs_root

    root = Path(settings.gap_predictions_dir) if settings.gap_predictions_dir else runs_root() / "coref" / "gap-predictions"
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in unit.model)
    return root / f"{slug}-{unit.handle.checkpoint_hash[:12]}" / unit.stack / f"seed{settings.seed}"


def _gap(unit, prepared, settings: CorefSettings) -> list[pd.DataFrame]:
    d: CorefData = prepared.data
    s = settings
    frames = {k: d.gap[k] for k in ("development", "validation", s.gap_eval_split)}
    x = {k: _gap_features(unit, f, k, s) for k, f in frames.items()}
    lab = {k: np.array([GAP_LABELS.index(v) for v in f["label"]], dtype=np.int64) for k, f in frames.items()}
    ev = frames[s.gap_eval_split]
    res = fitting.fit_probe(x["development"], lab["development"], x["validation"], lab["validation"],
                           num_classes=3, config=_probe_cfg(s, None))
    pred = res.predict(x[s.gap_eval_split])  # [L, N]
    genders = [pronoun_gender(p) for p in ev["pronoun"]]
    scores = gap_scores_ci(pred == 0, pred == 1, ev["a_coref"], ev["b_coref"], genders, s.n_boot, s.seed,
                           return_boot=True)
    f1_boot = scores["f1"][3]
    scores = {k: v[:3] for k, v in scores.items()}
    acc = ratio_bootstrap((pred == lab[s.gap_eval_split][None]).astype(float), None, None, s.n_boot, s.seed)
    metrics = {k: v[0] for k, v in scores.items()}
    metrics.update({"accuracy": acc[0], "train_accuracy": res.train_accuracy})
    cis = {k: v[1:] for k, v in scores.items()}
    cis["accuracy"] = acc[1:]
    folder = _gap_predictions_dir(unit, s)
    files = []
    for layer in range(pred.shape[0]):
        rows = [(i, *gap_decisions(GAP_LABELS[p])) for i, p in zip(ev["id"], pred[layer])]
        files.append(str(write_submission(folder / f"layer-{layer:02d}.tsv", rows)))
    unit.notes.setdefault("gap_predictions", {})[unit.key] = files
    extra = {"features": "p;a;b;p*a;p*b", "pooling": s.pooling, "train": "development", "stop": "validation",
             "paper_parallelism_f1": PAPER_PARALLELISM_F1, "probe_seed": s.seed}
    out = _depth_rows(unit, "gap", "f1", metrics.pop("f1"), cis.pop("f1"), f1_boot, split=s.gap_eval_split,
                      n=len(ev), extra=extra)
    out.append(unit.rows("gap", metrics, split=s.gap_eval_split, n=len(ev), ci=cis, extra=extra))
    if not unit.is_twin:
        base = {}
        if "rules" in s.baselines:
            base["nearest_name"] = [gap_nearest_name(r) for r in ev.itertuples()]
            base["subject_name"] = [gap_subject_name(r) for r in ev.itertuples()]
        if "majority" in s.baselines:
            major = GAP_LABELS[int(np.bincount(lab["development"]).argmax())]
            base["majority"] = [major] * len(ev)
        n_layers = pred.shape[0]
        for name, labels in base.items():
            dec = np.array([gap_decisions(v) for v in labels], dtype=bool)
            sc = gap_scores_ci(dec[None, :, 0], dec[None, :, 1], ev["a_coref"], ev["b_coref"], genders, s.n_boot, s.seed)
            out.append(unit.rows("gap", {f"{name}_{k}": np.repeat(v[0], n_layers) for k, v in sc.items()},
                                 split=s.gap_eval_split, n=len(ev),
                                 ci={f"{name}_{k}": (np.repeat(v[1], n_layers), np.repeat(v[2], n_layers))
                                     for k, v in sc.items()}, extra=dict(extra, baseline=name)))
    return out


def _per_layer_rows(unit, task, metrics, split, n, ci, extras) -> list[pd.DataFrame]:
    """Rows of layers 1..L with a different `extra` per layer (e.g. which head is best there)."""
    return [unit.rows(task, {k: [v[i]] for k, v in metrics.items()}, split=split, layers=[i + 1], n=n,
                      ci={k: ([lo[i]], [hi[i]]) for k, (lo, hi) in ci.items()}, extra=ex)
            for i, ex in enumerate(extras)]


def gap_heads_select_split(settings: CorefSettings) -> str:
    """The GAP split a best head is chosen on: never the one it is reported on."""
    return "validation" if settings.gap_eval_split == "test" else "development"


def choose_heads(select: np.ndarray) -> tuple[np.ndarray, tuple[int, int], np.ndarray]:
    """Best heads on the selection data `select` (bool [N, L, heads], per item whether a head is
    right): (best head per layer [L], best (layer, head) overall, accuracy [L, heads]). Ties go to
    the lowest head."""
    acc = select.mean(0) if len(select) else np.zeros(select.shape[1:])
    layer, head = np.unravel_index(int(acc.argmax()), acc.shape)
    return acc.argmax(1), (int(layer), int(head)), acc


def best_head_rows(unit, metric: str, select: np.ndarray, report: np.ndarray, units: np.ndarray, settings, *,
                   split: str, chosen_on: str, extra: dict, by_group: dict[str, np.ndarray] | None = None
                   ) -> list[pd.DataFrame]:
    """Held-out best heads: chosen on `select` ([N_sel, L, heads], the selection split `chosen_on`),
    scored on `report` ([N, L, heads], `split`) with a bootstrap over `units` (documents/examples).
    Rows: `metric` per layer 1..L (extra.best_head, chosen_on, chosen_value = its accuracy where it
    was chosen), `metric`_<group> on the same heads for each mask of `by_group`, and `metric`_overall
    (no layer: the best layer x head; extra.best_layer, best_head)."""
    s = settings
    per_layer, (bl, bh), sel_acc = choose_heads(select)
    L = report.shape[1]
    chosen = report[:, np.arange(L), per_layer].T.astype(float)  # [L, N]
    pt, lo, hi = ratio_bootstrap(chosen, None, units, s.n_boot, s.seed)
    metrics = {metric: pt}
    for name, mask in (by_group or {}).items():
        metrics[f"{metric}_{name}"] = chosen[:, mask].mean(1) if mask.any() else np.full(L, np.nan)
    extras = [dict(extra, best_head=int(h), chosen_on=chosen_on, chosen_value=float(sel_acc[layer, h]))
              for layer, h in enumerate(per_layer)]
    out = _per_layer_rows(unit, "attention-heads", metrics, split, len(report), {metric: (lo, hi)}, extras)
    o_pt, o_lo, o_hi = ratio_bootstrap(report[:, bl, bh][None].astype(float), None, units, s.n_boot, s.seed)
    out.append(unit.rows("attention-heads", {f"{metric}_overall": float(o_pt[0])}, split=split, n=len(report),
                         ci={f"{metric}_overall": (float(o_lo[0]), float(o_hi[0]))},
                         extra=dict(extra, best_layer=bl + 1, best_head=bh, chosen_on=chosen_on,
                                    chosen_value=float(sel_acc[bl, bh]))))
    return out


def _attention_heads(unit, prepared, settings: CorefSettings) -> list[pd.DataFrame]:
    """Coreference heads (Clark et al. 2019): per-head rows on the report split (GUM test, GAP test),
    best heads chosen on the selection split (GUM dev, GAP validation) and reported on the report
    split, so no held-out figure is chosen on the data it is scored on."""
    from probes.coref.attention import gap_head_scores, gum_head_scores

    d: CorefData = prepared.data
    s = settings
    out = []
    notes = unit.notes.setdefault("attention", {}).setdefault(unit.key, {})
    gum = {}
    for split in (HEADS_SELECT_SPLIT, HEADS_REPORT_SPLIT):
        stats: dict[str, Any] = {}
        t0 = time.perf_counter()
        gum[split] = gum_head_scores(unit.handle, d.heads[split], unit.stack, s.attention_batch_size, s.progress, stats)
        sec = time.perf_counter() - t0
        words = sum(len(doc.words) for doc in d.heads[split])
        notes[f"gum_{split}"] = {"counts": gum[split].counts, "documents": len(d.heads[split]), "words": words,
                                 "seconds": round(sec, 3), "words_per_s": round(words / sec, 1) if sec else None,
                                 **stats}
    sel, rep = gum[HEADS_SELECT_SPLIT], gum[HEADS_REPORT_SPLIT]
    L, H = rep.correct.shape[1:]
    extra = {"data": f"gum-{HEADS_REPORT_SPLIT}", "evaluated": rep.counts["evaluated"],
             "out_of_window": rep.counts["out_of_window"]}
    groups = {"heads_all": np.ones(len(rep.group), bool), **{f"heads_{t}": rep.group == t for t in MENTION_TYPES}}
    for h in range(H):
        metrics = {name: rep.correct[mask, :, h].mean(0) if mask.any() else np.full(L, np.nan)
                   for name, mask in groups.items()}
        metrics["heads_strict"] = rep.strict[:, :, h].mean(0) if len(rep.strict) else np.full(L, np.nan)
        metrics["heads_head_word"] = rep.head_word[:, :, h].mean(0) if len(rep.head_word) else np.full(L, np.nan)
        out.append(unit.rows("attention-heads", metrics, split=HEADS_REPORT_SPLIT, layers=range(1, L + 1),
                             n=len(rep.group), extra=dict(extra, head=h)))
    types = {t: rep.group == t for t in MENTION_TYPES}
    out += best_head_rows(unit, "best_head_accuracy", sel.strict, rep.strict, rep.unit, s, split=HEADS_REPORT_SPLIT,
                          chosen_on=f"gum-{HEADS_SELECT_SPLIT}", by_group=types,
                          extra=dict(extra, criterion=HEAD_CRITERIA["best_head_accuracy"]))
    for metric, chosen in (("best_head_accuracy_head_word", "head_word"), ("best_head_accuracy_lenient", "correct")):
        out += best_head_rows(unit, metric, getattr(sel, chosen), getattr(rep, chosen), rep.unit, s,
                              split=HEADS_REPORT_SPLIT, chosen_on=f"gum-{HEADS_SELECT_SPLIT}",
                              extra=dict(extra, criterion=HEAD_CRITERIA[metric]))
    if "rules" in s.baselines and not unit.is_twin:
        for name, v in rep.baselines.items():
            b = ratio_bootstrap(v[None].astype(float), None, rep.unit, s.n_boot, s.seed)
            out.append(unit.rows("attention-heads", {name: np.repeat(b[0], L)}, split=HEADS_REPORT_SPLIT,
                                 layers=range(1, L + 1), n=len(v), ci={name: (np.repeat(b[1], L), np.repeat(b[2], L))},
                                 extra=dict(extra, baseline=name, baseline_for="best_head_accuracy")))
    # GAP: which name the pronoun attends to more
    gap = {}
    gap_select = gap_heads_select_split(s)
    for split in (gap_select, s.gap_eval_split):
        gstats: dict[str, Any] = {}
        t0 = time.perf_counter()
        gap[split] = gap_head_scores(unit.handle, d.gap[split], unit.stack, max(1, s.attention_batch_size * 2),
                                     s.progress, gstats)
        notes[f"gap_{split}"] = {"counts": gap[split].counts, "seconds": round(time.perf_counter() - t0, 3)}
    grep = gap[s.gap_eval_split]
    gextra = {"data": f"gap-{s.gap_eval_split}", "evaluated": grep.counts["evaluated"]}
    for h in range(H):
        out.append(unit.rows("attention-heads", {"heads_gap": grep.correct[:, :, h].mean(0)}, split=s.gap_eval_split,
                             layers=range(1, L + 1), n=len(grep.group), extra=dict(gextra, head=h)))
    out += best_head_rows(unit, "best_head_gap", gap[gap_select].correct, grep.correct, grep.unit, s,
                          split=s.gap_eval_split, chosen_on=f"gap-{gap_select}", extra=gextra)
    if "rules" in s.baselines and not unit.is_twin:
        for name, v in grep.baselines.items():
            b = ratio_bootstrap(v[None].astype(float), None, grep.unit, s.n_boot, s.seed)
            out.append(unit.rows("attention-heads", {f"gap_{name}": np.repeat(b[0], L)}, split=s.gap_eval_split,
                                 layers=range(1, L + 1), n=len(v),
                                 ci={f"gap_{name}": (np.repeat(b[1], L), np.repeat(b[2], L))},
                                 extra=dict(gextra, baseline=name, baseline_for="best_head_gap")))
    return out


CLOZE_FORMS = {MASCULINE: ("he", "his", "him"), FEMININE: ("she", "her")}


def _gap_cloze(unit, prepared, settings: CorefSettings) -> list[pd.DataFrame]:
    """Mask the pronoun, compare the model's log-probability of the masculine and feminine forms."""
    d: CorefData = prepared.data
    s = settings
    handle = unit.handle
    if not getattr(handle, "head_trained", True) and not unit.is_twin:
        unit.notes.setdefault("gap_cloze", {})[unit.key] = "LM head not trained (missing from the checkpoint): skipped"
        return []
    from workbench.errors import CheckpointError
    from workbench.lm_scores import lm_scorer

    try:
        scorer = lm_scorer(handle)
    except CheckpointError as e:
        unit.notes.setdefault("gap_cloze", {})[unit.key] = f"skipped: {e}"
        return []
    frame = d.gap[s.gap_eval_split]
    # snippets longer than the model's window cannot be scored in one pass: left out and counted
    lengths = handle.tokenize_words(list(frame["words"])).attention_mask.sum(1).cpu().numpy()
    frame = frame[lengths + 2 <= handle.max_length].reset_index(drop=True)  # + room for a longer filler
    contexts = [row.text[: row.pronoun_offset] + "<blank>" + row.text[row.pronoun_offset + len(row.pronoun):]
                for row in frame.itertuples()]
    forms = [w for g in (MASCULINE, FEMININE) for w in CLOZE_FORMS[g]]
    scores = np.asarray(scorer.score_candidates(contexts, [forms] * len(contexts)).scores, dtype=np.float64)
    unit.notes.setdefault("gap_cloze", {})[unit.key] = {"scored": len(frame), "too_long": int(len(lengths) - len(frame)),
                                                        "method": scorer.kind}
    n_m = len(CLOZE_FORMS[MASCULINE])
    masc = np.logaddexp.reduce(scores[:, :n_m], axis=1)
    fem = np.logaddexp.reduce(scores[:, n_m:], axis=1)
    genders = np.array([pronoun_gender(p) for p in frame["pronoun"]])
    metrics, cis = {}, {}
    for g in (MASCULINE, FEMININE):
        mask = genders == g
        prefers_f = (fem > masc)[mask].astype(float)
        b = ratio_bootstrap(prefers_f[None], None, None, s.n_boot, s.seed)
        metrics[f"prefers_feminine_{g}"] = b[0]
        cis[f"prefers_feminine_{g}"] = b[1:]
        metrics[f"log_ratio_fm_{g}"] = np.array([float((fem - masc)[mask].mean())])
    correct = np.where(genders == FEMININE, fem > masc, masc > fem).astype(float)
    b = ratio_bootstrap(correct[None], None, None, s.n_boot, s.seed)
    metrics["gender_accuracy"], cis["gender_accuracy"] = b[0], b[1:]
    return [unit.rows("gap-cloze", _scalars(metrics), split=s.gap_eval_split, n=len(frame), ci=_scalar_cis(cis),
                      extra={"candidates": forms, "lm_kind": scorer.kind})]


def run_task(unit, prepared: runner.Prepared, task: str, settings: CorefSettings) -> list[pd.DataFrame]:
    _document_context(unit, prepared, settings)
    fn = {"gum-pairs": _gum_pairs, "gum-entity-type": _gum_entity_type, "gap": _gap,
          "attention-heads": _attention_heads, "gap-cloze": _gap_cloze}[task]
    t0 = time.perf_counter()
    out = fn(unit, prepared, settings)
    unit.timings[f"{task}:compute"] = round(time.perf_counter() - t0, 3)
    return out


# --------------------------------------------------------------------------- summary
SUMMARY_METRICS = (("gum-pairs", "auc"), ("gum-pairs", "antecedent_accuracy"), ("gum-entity-type", "accuracy"),
                   ("gap", "f1"), ("gap", "bias"), ("attention-heads", "best_head_accuracy"),
                   ("attention-heads", "best_head_accuracy_lenient"), ("attention-heads", "best_head_gap"))


def _peak_lines(rows: pd.DataFrame) -> list[str]:
    """`task metric: peak layer L [low, high]` from the `<metric>_peak_layer` rows (bootstrap of the argmax)."""
    peaks = rows[rows["layer"].isna() & rows["metric"].astype(str).str.endswith("_peak_layer")]
    return [f"  {r['task']:<16} {r['metric'][: -len('_peak_layer')]:<20} peak layer {r['value']:.0f} "
            f"[{r['ci_low']:.0f}, {r['ci_high']:.0f}]" for _, r in peaks.iterrows()]


def _overall_head_lines(rows: pd.DataFrame) -> list[str]:
    """`metric: best head L-H value [low, high] (chosen on <split>)` from the `<metric>_overall` rows."""
    best = rows[rows["layer"].isna() & (rows["task"] == "attention-heads")
                & rows["metric"].astype(str).str.endswith("_overall")]
    lines = []
    for _, r in best.iterrows():
        ex = decode_extra(r["extra"])
        lines.append(f"  attention-heads  {r['metric']:<36} head {ex.get('best_layer')}-{ex.get('best_head')} "
                     f"{r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] on {r['split']}, "
                     f"chosen on {ex.get('chosen_on')}")
    return lines


def format_summary(rows: pd.DataFrame) -> str:
    """Per model: layers x the headline metrics (with the share of bootstrap resamples in which the
    layer is the best, where stored) and the peak layer's CI; then the data-only baselines once."""
    if rows is None or len(rows) == 0:
        return "(no rows)"
    df = rows[rows["layer"].notna()]
    blocks = []
    for (model, stack), sub in df.groupby(["model", "stack"], sort=False, dropna=False):
        cols = [(t, m) for t, m in SUMMARY_METRICS if ((sub["task"] == t) & (sub["metric"] == m)).any()]
        if not cols:
            continue
        layers = sorted(set(sub["layer"].astype(int)))
        table = [["layer"] + [f"{t} {m}" for t, m in cols]]
        for layer in layers:
            cells = [str(layer)]
            for t, m in cols:
                v = sub[(sub["layer"] == layer) & (sub["task"] == t) & (sub["metric"] == m)]
                if v.empty:
                    cells.append("-")
                    continue
                r = v.iloc[0]
                cell = f"{r['value']:.3f}"
                ex = decode_extra(r["extra"])
                if "best_head" in ex:
                    cell += f" (h{ex['best_head']})"
                share = sub[(sub["layer"] == layer) & (sub["task"] == t) & (sub["metric"] == f"{m}_peak_share")]
                if not share.empty:
                    cell += f" [best {share['value'].iloc[0]:.0%}]"
                cells.append(cell)
            table.append(cells)
        mine = rows[(rows["model"] == model) & (rows["stack"] == stack)]
        peaks = _peak_lines(mine) + _overall_head_lines(mine)
        blocks.append(f"== {model} [{stack}]\n" + runner.aligned(table) + ("\n" + "\n".join(peaks) if peaks else ""))
    base = df[df["extra"].map(lambda e: decode_extra(e).get("baseline") not in (None, "random_init"))]
    if not base.empty:
        first = base.sort_values("layer").groupby(["task", "metric"], sort=False).first().reset_index()
        lines = [f"  {r['task']:<16} {r['metric']:<34} {r['value']:.3f}" for _, r in first.iterrows()]
        blocks.append("== data-only baselines\n" + "\n".join(lines))
    return "\n\n".join(blocks)


PROBE = runner.ProbeSpec(
    name=NAME, tasks=TASKS, settings=CorefSettings, prepare=prepare, run_task=run_task,
    description="Coreference: GUM mention pairs and entity types, GAP, coreference heads, GAP gender cloze.",
    summary=format_summary, twin_once_per_run=True,
    version=2,  # 2: held-out best heads (chosen on dev), Clark et al.'s criterion as the headline, AUC CIs on n_boot
)
